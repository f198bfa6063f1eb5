"""What scoring a batch returns (`RewardResult`, with its metrics and its stop-the-run verdict) and
what a reward function gets as `trainer_state` (`TrainerState`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class TrainerState:
    """What a reward function gets as `trainer_state` (the fields of transformers' TrainerState that
    a reward can use, e.g. for a curriculum: `trainer_state.global_step / trainer_state.max_steps`)."""

    global_step: int = 0
    """Optimizer steps done before this batch (0 at the first step)."""
    max_steps: int = 0
    """Steps the run is set to do (train.steps)."""
    epoch: float = 0.0
    """Passes over the training prompts so far (fractional)."""
    num_train_epochs: float = 0.0
    """Passes over the training prompts the whole run makes (train.steps x prompts per step / prompts)."""
    log_history: list = field(default_factory=list)
    """Every finished step's metrics ({"step": n, ...}), as transformers' TrainerState.log_history."""


@dataclass
class RewardResult:
    total: list[float]
    """Weighted sum per completion; None (not applicable) and failed completions contribute 0."""
    per_function: dict[str, list[float | None]]
    """Each function's values (None where it does not apply or failed; 0.0 for a completion that timed out)."""
    errors: dict[str, str | None]
    """The first thing that went wrong per function, None when it was fine."""
    failed: dict[str, bool]
    """True when the function produced no value at all: it failed on every completion."""
    seconds: dict[str, float] = field(default_factory=dict)
    """Wall time per function (timeout_s for a timed-out one)."""
    timeouts: dict[str, int] = field(default_factory=dict)
    """Completions that ran past completion_timeout_s and scored 0, per function."""
    row_errors: dict[str, dict[int, str]] = field(default_factory=dict)
    """Per function, the completions (by index) it failed on and why."""
    logged: dict[str, float] = field(default_factory=dict)
    """log_metric(name, value) calls as reward/<function>/<name>, averaged over the batch's calls."""
    extra: dict[str, list] = field(default_factory=dict)
    """log_extra(column, values) calls, concatenated per column."""
    steps: dict[str, list] = field(default_factory=dict)
    """Process rewards (functions with step_rewards = True, grpokit.rewards.process): per function, per
    completion its steps [(char_end, score)] or None; `per_function` holds the last step's score."""

    COUNTERS = ("failed", "failed_rows", "timeouts", "seconds")
    """reward/<name>/<counter> metrics that count or cost per call: they add up over several calls
    (the trainer's dynamic-sampling rounds), where means and logged values are averaged."""

    def metrics(self) -> dict[str, float]:
        """reward/<name>/{mean,std,applicable,failed,failed_rows,timeouts,seconds}, reward/total/{mean,std}
        and reward/<name>/<metric> for each metric the function logged with log_metric. mean and std are over applicable (non-None) values and
        left out when there are none; failed is 1 when the function failed on every completion."""
        out: dict[str, float] = {}
        for name, values in self.per_function.items():
            vals = [v for v in values if v is not None]
            if vals:
                out[f"reward/{name}/mean"] = _mean(vals)
                out[f"reward/{name}/std"] = _std(vals)
            out[f"reward/{name}/applicable"] = len(vals) / len(values) if values else 0.0
            out[f"reward/{name}/failed"] = float(self.failed[name])
            out[f"reward/{name}/failed_rows"] = float(len(self.row_errors.get(name, {})))
            out[f"reward/{name}/timeouts"] = float(self.timeouts.get(name, 0))
            out[f"reward/{name}/seconds"] = self.seconds.get(name, 0.0)
        if self.total:
            out["reward/total/mean"] = _mean(self.total)
            out["reward/total/std"] = _std(self.total)
        out.update(self.logged)
        return out

    def failure(self, max_failure_frac: float, prompts: list | None, completions: list) -> str | None:
        """Why this batch's reward failures must stop the run, or None when they may be tolerated.

        A function stops it when it failed on every completion (timeouts included), or on more than
        `max_failure_frac` of them (0 = on any). The message names the function, how many rows failed,
        the first failing row's reason, prompt and completion."""
        n = len(completions)
        problems = []
        for name, rows in self.row_errors.items():
            bad = len(rows)
            if not bad and not (n and self.timeouts.get(name, 0) == n):
                continue
            if bad and bad + self.timeouts.get(name, 0) < n and bad / max(n, 1) <= max_failure_frac:
                continue
            if not bad:
                problems.append(
                    f"reward function {name!r} timed out on all {n} completions "
                    f"(each past its per-completion budget); they all score 0"
                )
                continue
            row = min(rows)
            prompt = prompts[row] if prompts is not None else None
            allowed = f"(allowed: {max_failure_frac:g} of them)"
            share = f"every one of the {n}" if bad == n else f"{bad} of {n} {allowed}"
            problems.append(
                f"reward function {name!r} failed on {share} completions; first failing row {row}: "
                f"{rows[row]}\n  prompt: {_excerpt(prompt)}\n  completion: {_excerpt(completions[row])}"
            )
        return "\n".join(problems) or None


def _excerpt(item: object, limit: int = 300) -> str:
    text = repr(item)
    return text if len(text) <= limit else text[:limit] + "...'"


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _std(xs: list[float]) -> float:
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))
