"""``grpokit bench --async``: wall-clock to the same held-out accuracy, the embedded demo trained synchronously and
with asynchronous rollouts (rollout.max_staleness = K), one run after the other in one invocation (issue 34).

    grpokit bench --async --output-dir runs/async_bench                   # K = 0, 1, 2; 40 steps, eval every 5
    grpokit bench --async --ks 0,1 --steps 20 --output-dir runs/ab
    grpokit bench --async --ks 0,1 --reward-latency 1.0 --output-dir runs/ab   # a verifier that waits 1 s a call

Each run is the demo (``grpokit train --output-dir OUT/sSEED/kK ...``) in its own process with the demo's one
torch thread; with K >= 1 the sampler process takes a second core. Training seconds are the sum of the steps'
time/step (evaluations left out; grpokit.bench.curves); "to target" is that sum up to the first evaluation whose
held-out accuracy reaches the synchronous run's final accuracy (or ``target``). The load average before and
after is part of the result: on a machine shared with other work the seconds move with it.

``reward_latency`` S: the demo's reward (math_accuracy) waits S seconds a call first, as a remote verifier or a
sandbox would; the wait uses no CPU, so what overlap hides there does not depend on a spare core.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from grpokit.bench.curves import read_run_curve
from grpokit.bench.shapes import BenchError

SLOW_REWARD = """import time
from grpokit.rewards import resolve_reward

_accuracy = resolve_reward("math_accuracy")


def slow_accuracy(prompts, completions, **columns):
    time.sleep({latency})  # a remote verifier's round trip: no CPU used
    return _accuracy(prompts, completions, **columns)
"""


def run_one(
    out: Path,
    k: int,
    *,
    steps: int,
    eval_every: int,
    seed: int,
    latency: float = 0.0,
    overrides: list[str] = (),
) -> dict[str, Any]:
    """One demo run with rollout.max_staleness=k in ``out`` (a subprocess); its curve and overlap figures."""
    cmd = [
        sys.executable, "-m", "grpokit", "train", "--overwrite", "--output-dir", str(out),
        f"train.steps={steps}", f"eval.every={eval_every}", f"train.seed={seed}", "train.samples_every=0",
    ]  # fmt: skip
    if latency:
        out.parent.mkdir(parents=True, exist_ok=True)
        reward = out.parent / "slow_reward.py"
        reward.write_text(SLOW_REWARD.replace("{latency}", repr(latency)))
        cmd.append(f"rewards=[{{name: '{reward}:slow_accuracy'}}]")
    if k:
        cmd.append(f"rollout.max_staleness={k}")
    cmd += list(overrides)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise BenchError(
            f"--async: the run with K={k} failed (exit {done.returncode}):\n{done.stderr[-3000:]}"
        )
    curve = read_run_curve(out)
    metrics = curve.metrics
    stale = [m["async/staleness_mean"] for m in metrics if "async/staleness_mean" in m]
    busy = [m["async/trainer_busy"] for m in metrics if "async/trainer_busy" in m]
    return {
        "k": k,
        "seed": seed,
        "wall_s": wall,
        "train_s": curve.train_s,
        "curve": curve.points,  # (step, training seconds, held-out accuracy)
        "final_accuracy": curve.points[-1][2],
        "dropped": sum(m.get("async/dropped", 0.0) for m in metrics),
        "staleness_mean": statistics.fmean(stale) if stale else 0.0,
        "trainer_busy": statistics.fmean(busy) if busy else 1.0,
    }


def to_target(run: dict[str, Any], target: float) -> float | None:
    """Training seconds up to the first evaluation reaching ``target`` accuracy; None when none did."""
    for _, seconds, accuracy in run["curve"]:
        if accuracy >= target:
            return seconds
    return None


def run_async(
    ks: list[int],
    *,
    steps: int,
    eval_every: int,
    seeds: list[int],
    out_dir: Path,
    latency: float = 0.0,
    target: float | None = None,
    overrides: list[str] = (),
) -> dict[str, Any]:
    """Every K of ``ks`` (0 first: the synchronous baseline) for each seed, one run after the other; each run's
    figures with its speed-up to the target (the seed's synchronous final accuracy unless ``target``)."""
    if not ks or ks[0] != 0 or len(set(ks)) != len(ks) or min(ks) < 0:
        raise BenchError(
            f"--ks {','.join(map(str, ks))}: give distinct K >= 0, starting with 0 (the baseline)"
        )
    load_before = os.getloadavg()
    runs = []
    for seed in seeds:
        by_k = []
        for k in ks:
            print(f"grpokit bench --async: seed {seed}, K={k}", file=sys.stderr, flush=True)
            by_k.append(
                run_one(
                    out_dir / f"s{seed}" / f"k{k}",
                    k,
                    steps=steps,
                    eval_every=eval_every,
                    seed=seed,
                    latency=latency,
                    overrides=overrides,
                )
            )
        goal = target if target is not None else by_k[0]["final_accuracy"]
        base = to_target(by_k[0], goal)
        for run in by_k:
            reach = to_target(run, goal)
            run.update(target=goal, to_target_s=reach, speedup=base / reach if reach and base else None)
        runs += by_k
    return {
        "system": "grpokit",
        "kind": "async",
        "steps": steps,
        "eval_every": eval_every,
        "reward_latency": latency,
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "runs": runs,
    }


def print_async_table(result: dict[str, Any]) -> None:
    """The markdown table of docs/benchmarks.md's asynchronous rollouts section."""
    waits = f", reward latency {result['reward_latency']:g} s" if result["reward_latency"] else ""
    print(f"demo, {result['steps']} steps, eval every {result['eval_every']}{waits}")
    print(f"load average (1, 5, 15 min): before {result['load_before']}, after {result['load_after']}")
    print(
        "| seed | K | train s | to target s | speed-up to target | final accuracy | staleness mean | dropped | trainer busy |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in result["runs"]:
        reach = r["to_target_s"]
        shown = (
            f"{reach:.1f} ({r['target']:.3f})" if reach is not None else f"not reached ({r['target']:.3f})"
        )
        speed = f"{r['speedup']:.2f}x" if r["speedup"] else "-"
        print(
            f"| {r['seed']} | {r['k']} | {r['train_s']:.1f} | {shown} | {speed} | {r['final_accuracy']:.3f} | "
            f"{r['staleness_mean']:.2f} | {r['dropped']:.0f} | {r['trainer_busy']:.2f} |"
        )


def plot_async(result: dict[str, Any], path: Path) -> Path:
    """Held-out accuracy against training seconds, a line per (seed, K), written to ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    styles = ["-", "--", ":", "-."]
    seeds = sorted({r["seed"] for r in result["runs"]})
    for r in result["runs"]:
        ax.plot(
            [p[1] for p in r["curve"]], [p[2] for p in r["curve"]], marker="o", ms=3,
            color=f"C{r['k']}", linestyle=styles[seeds.index(r["seed"]) % len(styles)],
            label=f"K={r['k']}" + (f", seed {r['seed']}" if len(seeds) > 1 else ""),
        )  # fmt: skip
    waits = f", reward waits {result['reward_latency']:g} s a call" if result["reward_latency"] else ""
    ax.set(xlabel="training seconds (evaluations left out)", ylabel="held-out accuracy (greedy)")
    ax.set_title(f"The demo, synchronous (K=0) and asynchronous{waits}", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
