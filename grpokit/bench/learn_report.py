"""What ``grpokit bench --learn`` (grpokit.bench.learn) makes of its runs: each arm's mean curve over seeds, the arms
compared at equal steps, equal wall seconds and equal CPU seconds (interpolated between evaluations), the table on
stdout and the plot.

    summary = summarize(runs)                   # {arm: [{step, seconds, cpu_seconds, accuracy, ...}]}
    comparisons(summary)                        # every pair of arms at each comparison point
"""


from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path
from typing import Any

from grpokit.bench.learn_tasks import ARMS


def summarize(runs: list[dict[str, Any]]) -> dict[str, list[dict[str, float]]]:
    """Per framework, per evaluation step: accuracy mean, sample std, min and max over the seeds, and the
    mean training seconds."""
    out: dict[str, list[dict[str, float]]] = {}
    for fw in dict.fromkeys(r["framework"] for r in runs):
        curves = [r["curve"] for r in runs if r["framework"] == fw]
        steps = sorted(set.intersection(*({p["step"] for p in c} for c in curves)))
        rows = []
        for step in steps:
            points = [next(p for p in c if p["step"] == step) for c in curves]
            accs = [p["accuracy"] for p in points]
            rows.append({
                "step": step,
                "accuracy_mean": statistics.fmean(accs),
                "accuracy_std": statistics.stdev(accs) if len(accs) > 1 else 0.0,
                "accuracy_min": min(accs),
                "accuracy_max": max(accs),
                "train_s_mean": statistics.fmean(p["train_s"] for p in points),
                "train_cpu_s_mean": statistics.fmean(p.get("train_cpu_s", math.nan) for p in points),
                "n": len(accs),
            })  # fmt: skip
        out[fw] = rows
    return out


def interpolate(xs: list[float], ys: list[float], x: float) -> float | None:
    """ys at x on the piecewise-linear curve through (xs, ys) (xs increasing); None outside [xs[0], xs[-1]]."""
    if not xs or x < xs[0] or x > xs[-1]:
        return None
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return ys[-1]


def at_equal_seconds(
    summary: dict[str, list[dict[str, float]]], a: str = "grpokit", b: str = "trl", clock: str = "train_s"
) -> list[dict]:
    """At each of ``a``'s evaluations (its mean training seconds), ``b``'s mean accuracy at the same seconds,
    read off ``b``'s mean curve (linear between its evaluations); rows past ``b``'s last second are left out.
    ``clock``: train_s (wall clock) or train_cpu_s (CPU seconds)."""
    if a not in summary or b not in summary:
        return []
    xs = [r[f"{clock}_mean"] for r in summary[b]]
    ys = [r["accuracy_mean"] for r in summary[b]]
    out = []
    for r in summary[a]:
        other = interpolate(xs, ys, r[f"{clock}_mean"])
        if other is not None and r["step"] > 0:
            out.append(
                {
                    clock: r[f"{clock}_mean"],
                    a: r["accuracy_mean"],
                    b: other,
                    "gap": r["accuracy_mean"] - other,
                }
            )
    return out


def at_equal_steps(summary: dict[str, list[dict[str, float]]], a: str, b: str) -> list[dict]:
    """At every step both ``a`` and ``b`` evaluated (step 0 left out): their mean accuracies and the gap."""
    theirs = {r["step"]: r for r in summary.get(b, [])}
    return [
        {"step": r["step"], a: r["accuracy_mean"], b: theirs[r["step"]]["accuracy_mean"],
         "gap": r["accuracy_mean"] - theirs[r["step"]]["accuracy_mean"]}
        for r in summary.get(a, []) if r["step"] > 0 and r["step"] in theirs
    ]  # fmt: skip


def comparisons(summary: dict[str, list[dict[str, float]]]) -> list[dict]:
    """Each pair of arms worth reading: the selection against TRL and against grpokit's defaults, grpokit against
    TRL; at equal steps, equal training seconds and equal CPU seconds."""
    pairs = [(a, b) for a, b in (("selection", "trl"), ("selection", "grpokit"), ("grpokit", "trl"))]
    out = []
    for a, b in pairs:
        if a in summary and b in summary:
            out.append({
                "a": a, "b": b, "equal_steps": at_equal_steps(summary, a, b),
                "equal_seconds": at_equal_seconds(summary, a, b),
                "equal_cpu_seconds": at_equal_seconds(summary, a, b, clock="train_cpu_s"),
            })  # fmt: skip
    return out


def print_learn_table(result: dict[str, Any], file=None) -> None:
    """The summary as Markdown tables (they paste into docs/benchmarks.md): held-out accuracy by step, each
    framework's seeds, and the settings that differ."""
    file = file or sys.stdout
    summary = result["summary"]
    fws = list(summary)
    w = lambda *cells: print("| " + " | ".join(str(c) for c in cells) + " |", file=file)  # noqa: E731
    task = result["task"]
    print(
        f"\nheld-out greedy accuracy ({task['eval_size']} problems), mean +- std (min-max) over "
        f"{result['seeds']} seed(s); training seconds (wall clock) and CPU seconds (the process and its "
        "children), mean\n",
        file=file,
    )
    w(
        "step",
        *(f"{fw} accuracy" for fw in fws),
        *(f"{fw} train s" for fw in fws),
        *(f"{fw} CPU s" for fw in fws),
    )
    w(*["---"] * (1 + 3 * len(fws)))
    by_step = {fw: {r["step"]: r for r in rows} for fw, rows in summary.items()}
    for step in sorted(set.intersection(*(set(b) for b in by_step.values()))):
        cells = []
        for fw in fws:
            r = by_step[fw][step]
            cells.append(
                f"{r['accuracy_mean']:.1%} +- {r['accuracy_std']:.1%} ({r['accuracy_min']:.1%}-{r['accuracy_max']:.1%})"
            )
        w(
            step, *cells, *(f"{by_step[fw][step]['train_s_mean']:.1f}" for fw in fws),
            *(f"{by_step[fw][step]['train_cpu_s_mean']:.1f}" for fw in fws),
        )  # fmt: skip
    given = {fw: " ".join([*ARMS.get(fw, []), *result["grpokit_set"]]) if fw in ARMS else " ".join(result["trl_set"])
             for fw in fws}  # fmt: skip
    print("\nfinal accuracy per seed\n", file=file)
    w("framework", "settings", *(f"seed {s}" for s in range(result["seeds"])), "train s (mean)")
    w(*["---"] * (3 + result["seeds"]))
    for fw in fws:
        runs = sorted((r for r in result["runs"] if r["framework"] == fw), key=lambda r: r["seed"])
        w(fw, given[fw] or "defaults", *(f"{r['curve'][-1]['accuracy']:.1%}" for r in runs),
          f"{statistics.fmean(r['curve'][-1]['train_s'] for r in runs):.1f}")  # fmt: skip
    for c in result.get("comparisons", []):
        a, b = c["a"], c["b"]
        print(f"\n{a} ({given[a] or 'defaults'}) against {b} ({given[b] or 'defaults'})\n", file=file)
        w("at equal", "where", a, b, f"{a} - {b}")
        w("---", "---", "---", "---", "---")
        for key, clock, what in (
            ("equal_steps", "step", "steps"),
            ("equal_seconds", "train_s", "train s"),
            ("equal_cpu_seconds", "train_cpu_s", "CPU s"),
        ):
            for r in c[key]:  # b's mean curve read at a's evaluations (seconds), or the same step
                where = f"step {r[clock]}" if clock == "step" else f"{r[clock]:.1f} s"
                w(what, where, f"{r[a]:.1%}", f"{r[b]:.1%}", f"{100 * r['gap']:+.1f} points")
    print("\nsettings that differ (TRL's in grpokit's terms, grpokit.config.trl)\n", file=file)
    w("setting", "grpokit", f"TRL {result['versions'].get('trl') or ''}".strip())
    w("---", "---", "---")
    for d in result["differences"]:
        w(d["key"], d["grpokit"], d["trl"])
    for d in result["code_differences"]:
        w(d["what"], d["grpokit"], d["trl"])


def plot_learn(result: dict[str, Any], path: str | Path) -> Path:
    """Held-out accuracy against the step and against training seconds: each seed thin, the mean thick."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    colours = {"grpokit": "tab:blue", "selection": "tab:green", "trl": "tab:orange"}
    for fw, rows in result["summary"].items():
        c = colours.get(fw, None)
        for r in (r for r in result["runs"] if r["framework"] == fw):
            xs = [p["step"] for p in r["curve"]], [p["train_s"] for p in r["curve"]]
            ys = [p["accuracy"] for p in r["curve"]]
            for ax, x in zip(axes, xs):
                ax.plot(x, ys, color=c, alpha=0.3, linewidth=0.8)
        label = "TRL" if fw == "trl" else fw
        axes[0].plot(
            [r["step"] for r in rows], [r["accuracy_mean"] for r in rows], color=c, linewidth=2, label=label
        )
        axes[1].plot(
            [r["train_s_mean"] for r in rows],
            [r["accuracy_mean"] for r in rows],
            color=c,
            linewidth=2,
            label=label,
        )
    axes[0].set_xlabel("step (one rollout, one optimizer step)")
    axes[1].set_xlabel("training seconds")
    axes[0].set_ylabel("held-out greedy accuracy")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend()
    task = result["task"]
    fig.suptitle(
        f"grpokit bench --learn: {task.get('kind', 'sum')}, {task['prompts_per_step']}x{task['group_size']}, lr {task['lr']:g}, "
        f"{result['seeds']} seed(s)"
    )
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

