"""Argument checks shared by the algos modules (shape and name checks only: no device syncs)."""

from __future__ import annotations

from collections.abc import Iterable


def check_choice(name: str, value: object, valid: Iterable[str]) -> None:
    """Raise ValueError naming `name`, the bad `value` and the valid choices."""
    valid = tuple(valid)
    if value not in valid:
        raise ValueError(f"{name}={value!r} is not valid; choose one of {', '.join(map(repr, valid))}")


def check_groups(num_rewards: int, group_size: int) -> None:
    """Groups are contiguous blocks of `group_size` rows; need group_size >= 2 and exact division."""
    if not isinstance(group_size, int) or group_size < 2:
        raise ValueError(
            f"group_size={group_size!r}: a group-relative advantage needs at least 2 completions per "
            "prompt (with 1 every advantage is 0 and there is no learning signal)"
        )
    if num_rewards % group_size != 0:
        raise ValueError(
            f"got {num_rewards} rewards, which is not a multiple of group_size={group_size}; rewards "
            "must hold whole groups laid out contiguously (rows [g*G:(g+1)*G] are prompt g)"
        )
