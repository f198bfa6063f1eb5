"""The settings reference, generated from the declarations (grpokit.config.declare): for each config tree
(``grpokit train``, ``grpokit sft``, ``grpokit sample``) a table per section with each key's type, default,
allowed values and description. The docs build calls ``settings_markdown()``; nothing here is typed twice.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from typing import Any

import yaml

from grpokit.config.declare import Setting, base_type, declaration, knob_of, section_class
from grpokit.core.intervals import describe_interval


def _trees() -> list[tuple[str, str, type]]:
    """(command, what it runs, config class) of every config tree."""
    from grpokit.config.sample import SampleConfig
    from grpokit.config.schema import Config
    from grpokit.config.sft import SFTConfig

    return [
        ("grpokit train", "GRPO-family RL fine-tuning", Config),
        ("grpokit sft", "supervised fine-tuning", SFTConfig),
        ("grpokit sample", "rejection sampling", SampleConfig),
    ]


def value_text(value: Any) -> str:
    """A value as YAML writes it on one line: null, true, 1.0e-06, [q_proj, k_proj], ''."""
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000, sort_keys=False).strip()
    return text.removesuffix("\n...").removesuffix("...").strip()


def type_text(tp: Any) -> str:
    """An annotation as written: int, str | None, list[str], dict[str, Any]."""
    return tp.__name__ if isinstance(tp, type) else str(tp).replace("typing.", "")


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell: pipes, asterisks and tag-like <words> escaped."""
    return re.sub(r"<(?=[A-Za-z/])", "&lt;", text.replace("|", "\\|").replace("*", "\\*"))


def allowed_words(declared: Setting, tp: Any) -> str:
    """The allowed values in words: the range (and what its edge means), the choices, or the declared words."""
    if declared.allowed:
        return declared.allowed
    if declared.range is not None:
        words = describe_interval(declared.range)
        return words + (f"; {declared.meaning}" if declared.meaning else "")
    if declared.choices is not None:
        names = ", ".join(f"`{n}`" for n in declared.names())
        return names + (", or your own `package.module:function`" if declared.own else "")
    if base_type(tp) is bool:
        return "`true`, `false`"
    return ""


def _default_cell(f: dataclasses.Field, value: Any) -> str:
    key = knob_of(f)
    if key is None:
        return f"`{value_text(value)}`"
    from grpokit.algos import PRESETS  # lazy: grpokit.algos imports torch

    return f"`{value_text(value)}` (the preset's; grpo: `{value_text(PRESETS['grpo'].get(key))}`)"


def section_table(prefix: str, section: Any) -> list[str]:
    """One Markdown table: a row per setting of ``section`` (a config dataclass instance: its defaults)."""
    hints = typing.get_type_hints(type(section))
    rows = ["| key | type | default | allowed | description |", "|---|---|---|---|---|"]
    for f in dataclasses.fields(section):
        declared = declaration(f)
        if declared is None:
            raise TypeError(f"{prefix}.{f.name} is not declared with grpokit.config.declare.setting")
        tp = hints[f.name]
        if section_class(tp) is not None:
            continue  # a section inside a section (rollout.vllm): its own table, nested_tables
        cells = [
            f"`{prefix}.{f.name}`",
            _cell(type_text(tp)),
            _cell(_default_cell(f, getattr(section, f.name))),
            _cell(allowed_words(declared, tp)),
            _cell(declared.doc),
        ]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def tree_markdown(command: str, what: str, cls: type) -> str:
    """The reference of one config tree: a heading per section, its description and its table."""
    cfg = cls()
    hints = typing.get_type_hints(cls)
    out = [f"## `{command}`: {what}", ""]
    for f in dataclasses.fields(cls):
        declared = declaration(f)
        value = getattr(cfg, f.name)
        out += [f"### {f.name}", ""]
        if declared is not None:
            out += [declared.doc, ""]
        if isinstance(value, list):
            item_cls = section_class(hints[f.name])
            out += [f"A list; default `{value_text(dataclasses.asdict(cfg)[f.name])}`. Each entry:", ""]
            out += section_table(f"{f.name}[]", item_cls())
        else:
            out += section_table(f.name, value)
            out += nested_tables(f.name, value)
        out.append("")
    return "\n".join(out)


def nested_tables(prefix: str, section: Any) -> list[str]:
    """A heading, description and table for each section inside ``section`` (rollout.vllm)."""
    out: list[str] = []
    hints = typing.get_type_hints(type(section))
    for f in dataclasses.fields(section):
        if section_class(hints[f.name]) is not None:
            key = f"{prefix}.{f.name}"
            out += ["", f"#### {key}", "", declaration(f).doc, "", *section_table(key, getattr(section, f.name))]
    return out


def settings_markdown() -> str:
    """The complete settings reference as Markdown: every key of every config tree."""
    head = [
        "# Settings reference",
        "",
        "Every setting of every command, generated from its declaration in the code (grpokit.config.declare): "
        "the same dotted key works in a YAML file and on the command line (`optim.lr=1e-6`). "
        "`grpokit config` prints the `grpokit train` keys with their values.",
        "",
    ]
    return "\n".join([*head, *(tree_markdown(*tree) for tree in _trees())])
