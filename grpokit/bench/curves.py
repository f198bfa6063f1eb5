"""A finished run's learning curve, read from its output folder: held-out accuracy against training seconds.

    curve = read_run_curve(Path("runs/demo"))
    curve.train_s                  # the sum of the steps' time/step (evaluations left out)
    curve.points                   # [(step, training seconds up to it, held-out accuracy), ...] per evaluation
    curve.metrics                  # metrics.jsonl, one line per step (a step logged twice: its last line)

The benchmarks that train the demo in subprocesses and compare their curves read runs through it
(grpokit.bench.async_runs; scripts/variant_study.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from grpokit.bench.shapes import BenchError


@dataclass
class RunCurve:
    """What a run's metrics.jsonl and eval.jsonl say about its learning over time."""

    metrics: list[dict]
    """Each step's metrics, in step order; a step logged twice (a resumed run) by its last line."""
    evals: list[dict]
    """eval.jsonl's lines (the step 0 evaluation first, when the run made one)."""
    points: list[tuple[int, float, float]]
    """(step, training seconds up to that step, held-out accuracy) at each evaluation."""
    train_s: float
    """Training seconds: the sum of the steps' time/step."""


def read_jsonl(path: Path) -> list[dict]:
    """A JSONL file's records (blank lines skipped); a line that is not JSON is an error naming it."""
    out = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise BenchError(f"{path}, line {number}: not JSON ({e.msg}): {line[:120]!r}") from None
    return out


def read_run_curve(out: Path, accuracy_key: str = "accuracy") -> RunCurve:
    """The curve of the run in folder ``out`` (its metrics.jsonl and eval.jsonl). A missing file is a BenchError
    naming it."""
    for name in ("metrics.jsonl", "eval.jsonl"):
        if not (out / name).is_file():
            raise BenchError(f"{out / name}: no such file; did the run in {out} train and evaluate?")
    last = {}
    for m in read_jsonl(out / "metrics.jsonl"):
        last[m["step"]] = m  # readers take a step's last line (grpokit.run.log)
    metrics = [last[step] for step in sorted(last)]
    clock, elapsed = 0.0, {0: 0.0}
    for m in metrics:
        clock += m["time/step"]
        elapsed[m["step"]] = clock
    evals = read_jsonl(out / "eval.jsonl")
    points = [(e["step"], elapsed.get(e["step"], clock), e[accuracy_key]) for e in evals]
    return RunCurve(metrics=metrics, evals=evals, points=points, train_s=clock)
