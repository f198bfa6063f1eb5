"""What a pipeline shows after every stage: held-out accuracy, format and language scores of the stage's
model (``grpokit.rollout.evaluate.evaluate`` with the pipeline's ``eval:`` rewards), as a table (printed, and
``stages.md`` / ``stages.json``) and a plot across stages (``stages.png``).

Evaluation is greedy (pass@1); ``format`` and ``language`` are the means of those rewards over the greedy
completions (``language``: over the completions it applies to). A sample stage keeps its model, so its row
shows its pass rate and kept rows instead.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

SCORES = ("accuracy", "format", "language")


def eval_hash(eval_spec: dict[str, Any], model: str) -> str:
    blob = json.dumps({"eval": eval_spec, "model": str(model)}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def evaluate_model(model_path: str, eval_spec: dict[str, Any], progress=None) -> dict[str, float]:
    """Greedy held-out accuracy (and format, language when named) of the model folder ``model_path``;
    ``progress`` (a line printer) gets the evaluation's progress lines."""
    from grpokit.config.schema import DataConfig, LoraConfig, ModelConfig
    from grpokit.data.prompts import load_prompts
    from grpokit.model.loading import eos_token_ids, load_policy
    from grpokit.rewards import resolve_reward_specs
    from grpokit.rollout.evaluate import evaluate
    from grpokit.rollout.generation import FastGenerator

    data_cfg = DataConfig(
        train=eval_spec["data"],
        prompt_column=eval_spec.get("prompt_column", "prompt"),
        template=eval_spec.get("template", "auto"),
        system_prompt=eval_spec.get("system_prompt"),
        max_prompt_tokens=eval_spec.get("max_prompt_tokens", 512),
    )
    rows = load_prompts(
        eval_spec["data"],
        prompt_column=data_cfg.prompt_column,
        limit=eval_spec.get("limit"),
        default_split="test",
    )
    named = {key: eval_spec.get(key, "math_accuracy" if key == "accuracy" else None) for key in SCORES}
    specs = [(key, _as_spec(value)) for key, value in named.items() if value]
    functions = resolve_reward_specs([spec for _, spec in specs])
    fns = {key: fn for (key, _), (_, fn, _) in zip(specs, functions)}
    model, tokenizer, _ = load_policy(ModelConfig(name_or_path=str(model_path)), LoraConfig())
    metrics = evaluate(
        model,
        tokenizer,
        rows,
        accuracy_fn=fns["accuracy"],
        generator=FastGenerator(),
        data_cfg=data_cfg,
        eos_token_ids=eos_token_ids(tokenizer, model),
        num_samples=0,
        max_new_tokens=eval_spec.get("max_new_tokens", 256),
        extra_rewards=[(key, fn) for key, fn in fns.items() if key != "accuracy"],
        progress=progress,
    )
    return {
        "accuracy": metrics["accuracy"],
        **{key: metrics.get(f"greedy/{key}") for key in fns if key != "accuracy"},
        "completion_len": metrics["completion_len/mean"],
        "num_examples": metrics["num_examples"],
    }


def _as_spec(value: Any) -> dict[str, Any]:
    """An eval score named as "reward_name" or {name: ..., kwargs: {...}}."""
    return {"name": value} if isinstance(value, str) else {"weight": 1.0, **value}


def stage_row(label: str, kind: str, state: dict[str, Any], parent: str | None = None) -> dict[str, Any]:
    """One table row from a stage's state: its evaluation, its steps or its sampling numbers, the seconds of
    its work (training steps; a sample stage's sampling) by the wall clock and in CPU seconds, and ``parent``,
    the folder of the stage it grows from (``spec.lineage``; the plot joins them)."""
    from grpokit.pipeline.spec import used_cpu_seconds

    ev = state.get("eval") or {}
    row = {"stage": label, "kind": kind, **{key: ev.get(key) for key in SCORES}}
    row["completion_len"] = ev.get("completion_len")
    summary = state.get("summary") or {}
    if kind == "sample":
        rate = summary.get("pass_rate_mean")
        row["note"] = f"pass rate {rate:.1%}, kept {summary.get('rows')} rows" if rate is not None else ""
    else:
        row["note"] = f"{summary['steps']} steps" if summary.get("steps") is not None else ""
    budget = state.get("cpu_budget")
    if budget:
        row["note"] += f", CPU budget {budget['seconds']:.1f} s = {' + '.join(budget['of'])}"
    used = used_cpu_seconds(state) if kind != "model" else None
    row["work_s"], row["work_cpu_s"] = (used[1], used[0]) if used else (None, None)
    row["seconds"] = state.get("seconds")
    row["parent"] = parent
    return row


def _fmt(value: Any, percent: bool = True) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.1%}" if percent else f"{value:.1f}"
    return str(value)


COLUMNS = ("stage", "kind", "accuracy", "format", "language", "tokens", "train s", "train CPU s", "stage s", "note")
"""The table's columns: tokens, the greedy completions' mean length; train s / train CPU s, the seconds of the
stage's work (its training steps; a sample stage's sampling) by the wall clock and in CPU seconds (this process
and its children, grpokit.core.clock); stage s, the stage's whole process by the wall clock (start-up, loading
and saving included), the evaluation excluded."""


def _cells(r: dict[str, Any]) -> list[str]:
    return [
        r["stage"], r["kind"], _fmt(r["accuracy"]), _fmt(r["format"]), _fmt(r["language"]),
        _fmt(r["completion_len"], False), _fmt(r.get("work_s"), False), _fmt(r.get("work_cpu_s"), False),
        _fmt(r["seconds"], False), r["note"],
    ]  # fmt: skip


def table_markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_cells(r)) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def print_table(rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="held-out scores after each stage (greedy)")
    for col in COLUMNS:
        table.add_column(col)
    for r in rows:
        table.add_row(*_cells(r))
    Console(stderr=True).print(table)


def write_report(out: Path, rows: list[dict[str, Any]]) -> None:
    """stages.md, stages.json and stages.png in the pipeline's output folder."""
    (out / "stages.md").write_text(table_markdown(rows))
    (out / "stages.json").write_text(json.dumps(rows, indent=2))
    plot_stages(rows, out / "stages.png")


def plot_edges(rows: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """(i, j) pairs of the evaluated rows to join in the plot: row j grows from row i (its ``parent``, through
    the stages that were not evaluated, a sample stage's own parent). A stage that starts from an earlier
    stage than the one before it (the R1 demo's rl_alone, from the cold start) is joined to that stage, never
    to the row before it."""
    by_stage = {r["stage"]: r for r in rows}
    measured = [r for r in rows if r["accuracy"] is not None]
    at = {r["stage"]: i for i, r in enumerate(measured)}
    edges = []
    for j, r in enumerate(measured):
        parent, seen = r.get("parent"), set()
        while parent is not None and parent not in at and parent in by_stage and parent not in seen:
            seen.add(parent)
            parent = by_stage[parent].get("parent")
        if parent in at:
            edges.append((at[parent], j))
    return edges


def plot_stages(rows: list[dict[str, Any]], path: Path) -> None:
    """Accuracy, format and language (where measured) of each stage's model; each stage joined to the one it
    grows from (``plot_edges``): solid to the point before it, dotted to an earlier one (a branch such as
    RL alone from the cold start). No file when no stage was evaluated."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measured = [r for r in rows if r["accuracy"] is not None]
    if not measured:  # no eval: section, nothing to draw
        return
    fig, ax = plt.subplots(figsize=(max(5.0, 1.2 * len(measured) + 2), 3.6))
    xs = list(range(len(measured)))
    edges = plot_edges(rows)
    for key, marker in zip(SCORES, "osD"):
        ys = [float("nan") if r[key] is None else 100 * r[key] for r in measured]
        if all(y != y for y in ys):  # NaN: this score is not measured
            continue
        points = ax.plot(xs, ys, marker=marker, linestyle="none", label=key)[0]
        for i, j in edges:
            ax.plot([i, j], [ys[i], ys[j]], color=points.get_color(), linestyle="-" if j == i + 1 else ":")
    branch = {j: measured[i]["stage"] for i, j in edges if i != j - 1}  # j: the stage it branches from
    labels = [f"{r['stage']}\n(from {branch[j]})" if j in branch else r["stage"] for j, r in enumerate(measured)]
    ax.set_xticks(xs, labels, rotation=20, ha="right")
    ax.set_ylabel("held-out, % (greedy)")
    ax.set_ylim(-2, 102)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))  # outside: no point hidden
    ax.set_title("after each stage")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
