"""Argument checks shared by the algos modules (shape and name checks only: no device syncs)."""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import TypeVar

T = TypeVar("T")


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


def lookup(what: str, name: str, table: dict[str, T], also: Iterable[str] = ()) -> T:
    """table[name]; a name "package.module:attr" is imported (a user's own estimator or loss) and cached.

    Raises ValueError naming the choices (and the import error, for a "module:attr" that fails)."""
    if name in table:
        return table[name]
    if ":" in name:
        module_name, _, attr = name.partition(":")
        try:
            fn = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as e:
            raise ValueError(f"{what}={name!r} could not be imported: {e}") from e
        if not callable(fn):
            raise ValueError(f"{what}={name!r} is not callable")
        table[name] = fn
        return fn
    raise ValueError(
        f"{what}={name!r} is not valid; choose one of {', '.join(map(repr, [*table, *also]))} "
        "or name your own as 'package.module:function'"
    )
