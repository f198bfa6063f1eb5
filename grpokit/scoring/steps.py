"""The shape of a process reward's result (the contract: `grpokit.rewards.process`): whether a function
gives step rewards, a completion's steps checked against its text, and the value that stands for them.
Here, below the verifiers, because the reward runner checks and reduces them in its workers."""

from __future__ import annotations

import math
from numbers import Real


def is_process_reward(fn: object) -> bool:
    return bool(getattr(fn, "step_rewards", False))


def check_char_steps(steps: object, length: int) -> list[tuple[int, float]]:
    """`steps` as [(char_end, score)] after checking them against a completion of `length` characters;
    ValueError saying which step is wrong and how."""
    if isinstance(steps, (str, bytes, dict)) or not isinstance(steps, (list, tuple)):
        raise ValueError(
            f"returned {type(steps).__name__} {str(steps)[:40]!r} for a completion; a process reward "
            "(step_rewards = True) returns a list of (char_end, score) per completion, or None"
        )
    out: list[tuple[int, float]] = []
    last = 0
    for k, step in enumerate(steps):
        if not (isinstance(step, (list, tuple)) and len(step) == 2):
            raise ValueError(f"step {k}: expected a (char_end, score) pair, got {str(step)[:40]!r}")
        end, score = step
        if isinstance(end, bool) or not isinstance(end, int):
            raise ValueError(f"step {k}: char_end {end!r} is not an integer character offset")
        if end > length:
            raise ValueError(f"step {k} ends at character {end}, beyond the completion's {length} characters")
        if end <= last:
            raise ValueError(
                f"step {k} ends at character {end}, not after the previous step's end ({last}); "
                "char_end must be strictly ascending and >= 1"
            )
        if isinstance(score, bool) or not isinstance(score, Real) or not math.isfinite(float(score)):
            raise ValueError(f"step {k}: score {score!r} is not a finite number")
        out.append((end, float(score)))
        last = end
    return out


def step_outcome(value: object) -> float | None:
    """The sequence-level value of a process reward's result for one completion: its last step's score
    (None for None or no steps; a plain number, e.g. the 0 of a timed-out completion, stays)."""
    if isinstance(value, list):
        return value[-1][1] if value else None
    return value  # type: ignore[return-value]
