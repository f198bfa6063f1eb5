"""How an algorithm setting is declared: a dataclass field made by `knob()`, with its one-line doc, its flat name
(the config's and the command line's `algo.<name>`) and the values it allows; KNOBS, every declared setting by
its flat name.

Two kinds of dataclass declare knobs: the parts of AlgoSettings (settings.py: advantage, ratio, kl, ...) and the
parameter types of the registered surrogates and advantage estimators (objectives.SapoParams,
advantages.GAEParams, ...), declared when they are registered. A knob of a parameter type names it as its
`owner`, so what reads it is known from the registrations alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from grpokit.core.intervals import in_interval


def knob(
    default: Any,
    doc: str,
    *,
    key: str | None = None,
    choices: Callable[[], tuple[str, ...]] | None = None,
    interval: str | None = None,
    example: Any = None,
    meaning: str = "",
    user_defined: bool = False,
) -> Any:
    """A settings field with its one-line doc, its flat name, and what values it allows: `choices()`
    (names; with `user_defined` a registry's, where "package.module:function" names your own) or a
    numeric `interval` ("[0, inf)"), with an example value and a note on what the edge value means."""
    meta = {"doc": doc, "key": key, "choices": choices, "interval": interval, "example": example}
    return field(default=default, metadata={**meta, "meaning": meaning, "user_defined": user_defined})


@dataclass(frozen=True)
class Knob:
    """One leaf of AlgoSettings under its flat name."""

    key: str
    part: str  # the AlgoSettings attribute holding it ("params" for a parameter type's)
    name: str  # the field's name in its dataclass
    doc: str
    default: Any
    choices: Callable[[], tuple[str, ...]] | None
    interval: str | None
    example: Any
    meaning: str
    user_defined: bool
    owner: type | None = None  # the surrogate's or estimator's parameter type declaring it; None in a part


KNOBS: dict[str, Knob] = {}
"""Every setting by its flat name (YAML / command line): AlgoSettings' parts, then the registered parameter types."""


def declare(cls: type, part: str = "params") -> None:
    """Add the knob fields of dataclass ``cls`` to KNOBS: a part of AlgoSettings (``part`` its attribute) or, by
    default, a surrogate's or estimator's own parameter type. Declaring the same type twice changes nothing."""
    owner = cls if part == "params" else None
    for f in dataclasses.fields(cls):
        m = f.metadata
        key = m.get("key") or f.name
        known = KNOBS.get(key)
        if known is not None and known.owner is cls and owner is cls:
            continue
        if known is not None or "doc" not in m:
            raise ValueError(
                f"{cls.__name__}.{f.name}: "
                + (f"the flat name {key!r} is taken ({known.part})" if known else "declare it with knob()")
            )
        KNOBS[key] = Knob(
            key, part, f.name, m["doc"], f.default, m["choices"], m["interval"], m["example"], m["meaning"],
            m["user_defined"], owner,
        )  # fmt: skip


def flat_keys(cls: type | None) -> dict[str, str]:
    """{flat name: field name} of a parameter type's knobs ({} for None)."""
    return {} if cls is None else {(f.metadata.get("key") or f.name): f.name for f in dataclasses.fields(cls)}


def check_knob(key: str, value: Any) -> None:
    """Raise ValueError if `value` is not allowed for setting `key` (choices or interval)."""
    k = KNOBS[key]
    if k.choices is not None:
        valid = k.choices()
        if value not in valid and not (k.user_defined and isinstance(value, str) and ":" in value):
            raise ValueError(f"{key}={value!r} is not one of {list(valid)}")
    if k.interval is not None and isinstance(value, (int, float)) and not isinstance(value, bool):
        if not in_interval(value, k.interval):
            raise ValueError(f"{key}={value!r} is out of range: it must be in {k.interval}")
