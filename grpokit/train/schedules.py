"""Learning-rate schedules: the factor on optim.lr before scheduler step `step` (0-based), pure maths.

grpokit's scheduler steps once per training step (one rollout); with optim.mini_batches x optim.epochs
optimizer steps per rollout they share one learning rate (TRL changes it every optimizer step).

  constant  warm-up (step+1)/(W+1), then 1
  cosine    warm-up as constant, then 0.5 (1 + cos(pi (step-W)/(T-W)))
  linear    transformers' get_linear_schedule_with_warmup (TRL's default lr_scheduler_type):
            step/W during warm-up (0 at the first step), then (T - step)/(T - W), floored at 0

W = optim.warmup_steps, or ceil(optim.warmup_ratio * T) when the ratio is set (transformers'
get_warmup_steps); T = train.steps. Worked example, linear, T=4, W=0: factors 1, 0.75, 0.5, 0.25.
"""

from __future__ import annotations

import math

from grpokit.config.schema import SCHEDULES  # the names, declared with optim.schedule


def warmup_steps(steps: int, warmup_steps: int, warmup_ratio: float) -> int:
    """W: warmup_steps, or ceil(warmup_ratio * steps) when warmup_ratio > 0 (as transformers)."""
    return math.ceil(warmup_ratio * steps) if warmup_ratio > 0 else warmup_steps


def lr_factor(step: int, schedule: str, warmup: int, total: int) -> float:
    """Factor on the base learning rate at scheduler step `step`; see the module doc."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; one of {SCHEDULES}")
    if schedule == "linear":  # transformers.get_linear_schedule_with_warmup, exactly
        if step < warmup:
            return step / max(1, warmup)
        return max(0.0, (total - step) / max(1, total - warmup))
    if step < warmup:
        return (step + 1) / (warmup + 1)
    if schedule == "cosine":
        span = max(1, total - warmup)
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / span)))
    return 1.0
