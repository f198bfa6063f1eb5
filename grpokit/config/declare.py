"""Every setting of a config tree declared once, in its dataclass field: the type (the annotation), the
default, the allowed values (a range or choices) and the description.

    lr: float = setting(1e-6, "AdamW learning rate.", range="(0, 1]", example="1e-6")
    template: str = setting("auto", "Prompt template ...", choices=TEMPLATES)

From the declaration come the check of a value (check_tree / check_section, with the messages the CLI
prints), the comments of ``grpokit config`` and the CLI's help (Setting.doc) and the reference page
(grpokit.config.reference). Rules between settings (group_size >= 2 for GRPO, critic.* without a critic)
are code in grpokit.config.checks.

The algo.* fields are declared once in grpokit.algos.settings (KNOBS, below the config layer); their config
field says only which knob it is (``algo_knob("eps_high")``) and its Setting is read from there when asked:
grpokit.algos imports torch, which importing a config module does not.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import types
import typing
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from grpokit.core.errors import ConfigError
from grpokit.core.intervals import describe_interval, in_interval

SETTING = "grpokit.setting"
"""The dataclass field metadata key of a declaration: a Setting, or the flat name of an algo knob."""


@dataclass(frozen=True)
class Setting:
    """What a setting allows and means; the type and default are the field's own."""

    doc: str
    """One or more sentences; printed on one line by ``grpokit config``."""
    range: str | None = None
    """Interval of a number, "[1, inf)" ("[" includes the bound); None (an unset optional) always passes."""
    example: Any = None
    """A good value, shown in the range message (e.g. optim.lr=1e-6); default: the field's default."""
    meaning: str = ""
    """What an edge value means ("0 = off"), shown with the range."""
    choices: tuple[str, ...] | Callable[[], Iterable[str]] | None = None
    """The names allowed: a tuple, or a function reading a registry when asked (registries may grow)."""
    own: bool = False
    """With choices: "package.module:function" (your own, imported when the run starts) is allowed too."""
    check: Callable[[Any, str], None] | None = None
    """A rule of its own, ``check(value, key)`` raising ConfigError, instead of the range/choices check
    (which then only document the setting)."""
    allowed: str = ""
    """Allowed values in words, for the reference, where neither a range nor choices say it."""

    def names(self) -> tuple[str, ...]:
        """The choices now (a registry is read when asked)."""
        if self.choices is None:
            return ()
        return tuple(self.choices() if callable(self.choices) else self.choices)


def setting(
    default: Any,
    doc: str,
    *,
    range: str | None = None,  # noqa: A002 (the word the reference uses)
    example: Any = None,
    meaning: str = "",
    choices: tuple[str, ...] | Callable[[], Iterable[str]] | None = None,
    own: bool = False,
    check: Callable[[Any, str], None] | None = None,
    allowed: str = "",
) -> Any:
    """A dataclass field declaring one setting: ``default`` (a list, dict or section is copied for each
    config), its description and its allowed values (see Setting)."""
    declared = Setting(" ".join(doc.split()), range, example, meaning, choices, own, check, allowed)
    metadata = {SETTING: declared}
    if isinstance(default, (list, dict)) or dataclasses.is_dataclass(default):
        return dataclasses.field(default_factory=functools.partial(copy.deepcopy, default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def algo_knob(key: str) -> Any:
    """An algo.* field: None (the preset's value) by default; its description, range and choices are the
    knob's of that flat name in grpokit.algos.settings.KNOBS."""
    return dataclasses.field(default=None, metadata={SETTING: key})


@functools.cache
def _knob_setting(key: str) -> Setting:
    from grpokit.algos.settings import KNOBS  # lazy: grpokit.algos imports torch

    k = KNOBS[key]
    return Setting(" ".join(k.doc.split()), k.interval, k.example, k.meaning, k.choices, k.user_defined)


def declaration(f: dataclasses.Field) -> Setting | None:
    """The Setting a field declares (an algo knob's read from grpokit.algos); None for an undeclared field."""
    declared = f.metadata.get(SETTING)
    return _knob_setting(declared) if isinstance(declared, str) else declared


def knob_of(f: dataclasses.Field) -> str | None:
    """The flat name of the algo knob a field stands for, or None."""
    declared = f.metadata.get(SETTING)
    return declared if isinstance(declared, str) else None


def undeclared(cls: type, prefix: str = "") -> list[str]:
    """Dotted keys of a config tree's fields declared without setting() / algo_knob() (a test keeps it empty)."""
    out = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        if declaration(f) is None:
            out.append(key)
        section = section_class(hints[f.name])
        if section is not None:
            out += undeclared(section, f"{key}.")
    return out


def section_class(tp: Any) -> type | None:
    """The dataclass a section field holds (``ModelConfig``, or ``RewardSpec`` of ``list[RewardSpec]``)."""
    if typing.get_origin(tp) is list:
        (tp,) = typing.get_args(tp)
    return tp if isinstance(tp, type) and dataclasses.is_dataclass(tp) else None


def field_docs(cls: type) -> dict[str, str]:
    """``{field: description}`` of a config dataclass, from its declarations."""
    return {f.name: d.doc for f in dataclasses.fields(cls) if (d := declaration(f)) is not None}


# ----------------------------------------------------------------------------- checks


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _allows_none(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in typing.get_args(tp)


def base_type(tp: Any) -> Any:
    """int of ``int | None``; the annotation itself otherwise."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0] if len(args) == 1 else tp
    return tp


def out_of_range(key: str, value: Any, declared: Setting, tp: Any, default: Any) -> str:
    """The message of a number outside its range: what it must be, what the edge means, a good value."""
    note = f"; {declared.meaning}" if declared.meaning else ""
    example = declared.example if declared.example is not None else default
    return (
        f"{key}={value!r} is out of range: it must be {describe_interval(declared.range)}{note} "
        f"(e.g. {key}={example})."
    )


def not_a_choice(key: str, value: Any, valid: tuple[str, ...]) -> str:
    """The message of a name not among the choices, with the nearest one."""
    hint = difflib.get_close_matches(str(value), valid, n=1, cutoff=0.3)
    near = f" Did you mean '{hint[0]}'?" if hint else ""
    return f"{key}={value!r} is not one of {list(valid)}.{near}"


def allowed_text(declared: Setting, tp: Any) -> str:
    """The allowed values in a few words: "an integer >= 1, e.g. 8", "in (0, 1]", "fast or hf"."""
    if declared.choices is not None:
        return " or ".join(declared.names())
    if declared.range is None:
        return declared.allowed
    lo, hi = (t.strip() for t in declared.range[1:-1].split(","))
    if lo != "-inf" and hi != "inf":
        text = f"in {declared.range}"
    else:
        kind = {int: "an integer ", float: "a number "}.get(base_type(tp), "")
        text = kind + describe_interval(declared.range)
    text += f" ({declared.meaning})" if declared.meaning else ""
    text += f", e.g. {declared.example}" if declared.example is not None else ""
    return text + (" or null" if _allows_none(tp) else "")


def not_allowed(key: str, value: Any, declared: Setting, tp: Any, default: Any) -> str:
    """The message of grpokit sample's own sections (sample, keep, output): range or choice in one form."""
    return f"{key}={value!r} is not allowed: expected {allowed_text(declared, tp)}."


def check_value(
    key: str,
    value: Any,
    declared: Setting,
    tp: Any,
    default: Any = None,
    says: Callable[..., str] | None = None,
) -> None:
    """One value against its declaration: its own check if it has one, else its choices and range. ``says``:
    the message of a bad value (default: out_of_range / not_a_choice)."""
    if declared.check is not None:
        declared.check(value, key)
        return
    if value is None:
        return
    if declared.choices is not None:
        valid = declared.names()
        own = declared.own and isinstance(value, str) and ":" in value
        if value not in valid and not own:
            raise ConfigError(
                says(key, value, declared, tp, default) if says else not_a_choice(key, value, valid)
            )
    if declared.range is not None and _is_number(value) and not in_interval(value, declared.range):
        raise ConfigError((says or out_of_range)(key, value, declared, tp, default))


def check_section(section: Any, prefix: str, says: Callable[..., str] | None = None) -> None:
    """Every declared setting of one section (a config dataclass) against its declaration; keys are
    shown as ``prefix.name``. The first bad value raises ConfigError."""
    hints = typing.get_type_hints(type(section))
    for f in dataclasses.fields(section):
        declared = declaration(f)
        if declared is None or section_class(hints[f.name]) is not None:
            continue
        default = f.default if f.default is not dataclasses.MISSING else None
        check_value(f"{prefix}.{f.name}", getattr(section, f.name), declared, hints[f.name], default, says)


def sections(cfg: Any) -> Iterator[tuple[str, Any]]:
    """(key, section) of a config tree's sections in order; a list section gives ``rewards[0]``, ..."""
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if isinstance(value, list):
            yield from (
                (f"{f.name}[{i}]", item) for i, item in enumerate(value) if dataclasses.is_dataclass(item)
            )
        elif dataclasses.is_dataclass(value):
            yield f.name, value
            yield from ((f"{f.name}.{key}", inner) for key, inner in sections(value))  # rollout.vllm


def check_tree(cfg: Any, skip: Iterable[str] = ()) -> None:
    """Every section of a config tree (but those named in ``skip``) against its declarations."""
    skipped = set(skip)
    for key, section in sections(cfg):
        if key.split("[")[0] not in skipped:
            check_section(section, key)
