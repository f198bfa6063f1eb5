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


def stage_row(label: str, kind: str, state: dict[str, Any]) -> dict[str, Any]:
    """One table row from a stage's state: its evaluation, its steps or its sampling numbers."""
    ev = state.get("eval") or {}
    row = {"stage": label, "kind": kind, **{key: ev.get(key) for key in SCORES}}
    row["completion_len"] = ev.get("completion_len")
    summary = state.get("summary") or {}
    if kind == "sample":
        rate = summary.get("pass_rate_mean")
        row["note"] = f"pass rate {rate:.1%}, kept {summary.get('rows')} rows" if rate is not None else ""
    else:
        row["note"] = f"{summary['steps']} steps" if summary.get("steps") is not None else ""
    row["seconds"] = state.get("seconds")
    return row


def _fmt(value: Any, percent: bool = True) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.1%}" if percent else f"{value:.1f}"
    return str(value)


def table_markdown(rows: list[dict[str, Any]]) -> str:
    head = "| stage | kind | accuracy | format | language | completion tokens | seconds | note |"
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['stage']} | {r['kind']} | {_fmt(r['accuracy'])} | {_fmt(r['format'])} | {_fmt(r['language'])} "
            f"| {_fmt(r['completion_len'], False)} | {_fmt(r['seconds'], False)} | {r['note']} |"
        )
    return "\n".join(lines) + "\n"


def print_table(rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="held-out scores after each stage (greedy)")
    for col in ("stage", "kind", "accuracy", "format", "language", "tokens", "seconds", "note"):
        table.add_column(col)
    for r in rows:
        table.add_row(
            r["stage"],
            r["kind"],
            _fmt(r["accuracy"]),
            _fmt(r["format"]),
            _fmt(r["language"]),
            _fmt(r["completion_len"], False),
            _fmt(r["seconds"], False),
            r["note"],
        )
    Console(stderr=True).print(table)


def write_report(out: Path, rows: list[dict[str, Any]]) -> None:
    """stages.md, stages.json and stages.png in the pipeline's output folder."""
    (out / "stages.md").write_text(table_markdown(rows))
    (out / "stages.json").write_text(json.dumps(rows, indent=2))
    plot_stages(rows, out / "stages.png")


def plot_stages(rows: list[dict[str, Any]], path: Path) -> None:
    """Accuracy, format and language (where measured) of each stage's model, one line each; no file
    when no stage was evaluated."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measured = [r for r in rows if r["accuracy"] is not None]
    if not measured:  # no eval: section, nothing to draw
        return
    fig, ax = plt.subplots(figsize=(max(5.0, 1.2 * len(measured) + 2), 3.6))
    xs = list(range(len(measured)))
    for key, marker in zip(SCORES, "osD"):
        ys = [r[key] for r in measured]
        if any(y is not None for y in ys):
            ax.plot(xs, [float("nan") if y is None else 100 * y for y in ys], marker=marker, label=key)
    ax.set_xticks(xs, [r["stage"] for r in measured], rotation=20, ha="right")
    ax.set_ylabel("held-out, % (greedy)")
    ax.set_ylim(-2, 102)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title("after each stage")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
