"""Run several reward functions on a batch, weight them, and survive their failures.

Each function gets its own thread and `timeout_s` seconds. A function that raises, returns the
wrong number of values, returns something that is not a number or None (or NaN/inf), or runs past
its time is *failed* for this batch: it contributes 0 to every total, its error is recorded and
logged as a warning naming it, and `reward/<name>/failed` is 1 in the metrics. The runner never
raises because of a reward function. A timed-out thread cannot be killed in Python: it is
abandoned (a daemon thread, so it does not keep the process alive) and its late result ignored.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from numbers import Real

log = logging.getLogger("grpokit.rewards")


@dataclass
class RewardResult:
    total: list[float]
    """Weighted sum per completion; None (not applicable) and failed functions contribute 0."""
    per_function: dict[str, list[float | None]]
    """Each function's values (all None when it failed)."""
    errors: dict[str, str | None]
    """What went wrong per function, None when it was fine."""
    failed: dict[str, bool]
    seconds: dict[str, float] = field(default_factory=dict)
    """Wall time per function (timeout_s for a timed-out one)."""

    def metrics(self) -> dict[str, float]:
        """reward/<name>/{mean,std,applicable,failed,seconds} and reward/total/{mean,std}.
        mean and std are over applicable (non-None) values and left out when there are none."""
        out: dict[str, float] = {}
        for name, values in self.per_function.items():
            vals = [v for v in values if v is not None]
            if vals:
                out[f"reward/{name}/mean"] = _mean(vals)
                out[f"reward/{name}/std"] = _std(vals)
            out[f"reward/{name}/applicable"] = len(vals) / len(values) if values else 0.0
            out[f"reward/{name}/failed"] = float(self.failed[name])
            out[f"reward/{name}/seconds"] = self.seconds.get(name, 0.0)
        if self.total:
            out["reward/total/mean"] = _mean(self.total)
            out["reward/total/std"] = _std(self.total)
        return out


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _std(xs: list[float]) -> float:
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))


def _check(values: object, n: int) -> list[float | None]:
    """Validate a reward function's return value; raise ValueError saying what is wrong."""
    if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__len__"):
        raise ValueError(f"returned {type(values).__name__}, expected a list of {n} floats or None")
    values = list(values.tolist() if hasattr(values, "tolist") else values)
    if len(values) != n:
        raise ValueError(f"returned {len(values)} values for {n} completions")
    out: list[float | None] = []
    for i, v in enumerate(values):
        if v is None:
            out.append(None)
            continue
        if not isinstance(v, Real):
            raise ValueError(f"value {i} is {type(v).__name__} {str(v)[:40]!r}, not a number or None")
        f = float(v)
        if not math.isfinite(f):
            raise ValueError(f"value {i} is {f}")
        out.append(f)
    return out


class RewardRunner:
    """Score completions with named, weighted reward functions (TRL's calling convention).

    runner = RewardRunner([("math_accuracy", math_accuracy, 1.0), ("format", format_strict, 0.2)])
    result = runner(prompts, completions, {"answer": answers, "completion_ids": ids})
    Every column is passed to every function as a keyword argument.
    """

    def __init__(self, functions: list[tuple[str, Callable, float]], *, timeout_s: float = 60.0):
        names = [name for name, _, _ in functions]
        if len(set(names)) != len(names):
            raise ValueError(f"reward function names must be unique, got {names}")
        for name, fn, weight in functions:
            if not callable(fn):
                raise TypeError(f"reward {name!r} is not callable: {fn!r}")
            if not isinstance(weight, Real) or not math.isfinite(weight):
                raise ValueError(f"reward {name!r} has weight {weight!r}; expected a finite number")
        self.functions = [(name, fn, float(weight)) for name, fn, weight in functions]
        self.timeout_s = timeout_s

    def __call__(
        self, prompts: list, completions: list, columns: dict[str, list] | None = None
    ) -> RewardResult:
        columns = dict(columns or {})
        columns.pop("prompts", None)
        columns.pop("completions", None)
        n = len(completions)
        boxes = {}
        threads = {}
        start = time.monotonic()
        for name, fn, _ in self.functions:
            box: dict = {}
            # Copies: a function that mutates its inputs must not change what the next one sees.
            kwargs = {k: list(v) if isinstance(v, (list, tuple)) else v for k, v in columns.items()}
            t = threading.Thread(
                target=_call,
                args=(fn, list(prompts), list(completions), kwargs, box, start),
                name=f"reward-{name}",
                daemon=True,
            )
            t.start()
            boxes[name], threads[name] = box, t
        per_function, errors, failed, seconds = {}, {}, {}, {}
        for name, _, _ in self.functions:
            threads[name].join(max(0.0, start + self.timeout_s - time.monotonic()))
            box = boxes[name]
            error = None
            values: list[float | None] = [None] * n
            if threads[name].is_alive():
                error = f"timed out after {self.timeout_s:g} s (thread abandoned; it cannot be killed)"
                seconds[name] = self.timeout_s
            else:
                seconds[name] = box.get("seconds", 0.0)
                if "error" in box:
                    error = f"raised {box['error']}"
                else:
                    try:
                        values = _check(box.get("values"), n)
                    except Exception as e:
                        error = str(e)
            if error is not None:
                log.warning("reward function %r failed: %s; it contributes 0 to this batch", name, error)
                values = [None] * n
            per_function[name], errors[name], failed[name] = values, error, error is not None
        total = [0.0] * n
        for name, _, weight in self.functions:
            for i, v in enumerate(per_function[name]):
                if v is not None:
                    total[i] += weight * v
        return RewardResult(total, per_function, errors, failed, seconds)


def _call(fn: Callable, prompts: list, completions: list, kwargs: dict, box: dict, start: float) -> None:
    try:
        box["values"] = fn(prompts=prompts, completions=completions, **kwargs)
    except BaseException as e:  # noqa: BLE001 - reported by the runner, never swallowed
        box["error"] = f"{type(e).__name__}: {str(e)[:500]}"
    box["seconds"] = time.monotonic() - start
