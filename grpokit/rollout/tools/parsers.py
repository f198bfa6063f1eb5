"""Tool calls read from a model turn's text. A parser maps the text to a list of :class:`ToolCall`;
a call the parser cannot read is a ToolCall with ``error`` set, which the model is told about (never
an exception). Built in: ``hermes``, the Qwen/Hermes format

    I will compute it.<tool_call>
    {"name": "multiply", "arguments": {"a": 1234, "b": 5678}}
    </tool_call>

Your own parser: any ``fn(text) -> list[ToolCall]``, named in config as "package.module:function".
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

from grpokit.rollout.tools.spec import ToolDefinitionError


@dataclass
class ToolCall:
    """A call the model wrote: the tool's name and its arguments, or what made it unreadable."""

    name: str | None
    arguments: dict = field(default_factory=dict)
    error: str | None = None  # set when the call could not be read; it is then not run


OPEN, CLOSE = "<tool_call>", "</tool_call>"
MAX_CALLS_PER_TURN = 8
"""More calls than this in one turn: the rest are errors (a model looping on calls would otherwise
run a tool hundreds of times per turn)."""


def _loads(text: str) -> object:
    """json.loads for model-written text: every way it can fail (bad JSON, nesting past the recursion
    limit, an integer of more than 4,300 digits: Python's int_max_str_digits) raises ValueError."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError, MemoryError) as e:  # JSONDecodeError is a ValueError
        raise ValueError(f"{type(e).__name__}: {str(e)[:80]}") from None


def _one_call(body: str) -> ToolCall:
    try:
        data = _loads(body)
    except ValueError as e:
        return ToolCall(None, error=f"the tool call is not valid JSON ({e})")
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return ToolCall(None, error='a tool call must be a JSON object {"name": ..., "arguments": {...}}')
    arguments = data.get("arguments", data.get("parameters", {}))
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = _loads(arguments)
        except ValueError:
            return ToolCall(data["name"], error="the arguments are a string that is not a JSON object")
    if not isinstance(arguments, dict):
        return ToolCall(data["name"], error="the arguments of a tool call must be a JSON object")
    return ToolCall(data["name"], arguments)


def hermes(text: str) -> list[ToolCall]:
    """Every ``<tool_call>{json}</tool_call>`` block of ``text`` in order; an unclosed block at the end
    is read to the end of the text (a turn may stop at EOS right after the JSON)."""
    calls: list[ToolCall] = []
    i = 0
    while (start := text.find(OPEN, i)) >= 0:
        end = text.find(CLOSE, start + len(OPEN))
        body = text[start + len(OPEN) : end if end >= 0 else len(text)]
        if len(calls) >= MAX_CALLS_PER_TURN:
            calls.append(
                ToolCall(
                    None, error=f"at most {MAX_CALLS_PER_TURN} tool calls per turn; this one was not run"
                )
            )
        else:
            calls.append(_one_call(body.strip()))
        if end < 0:
            break
        i = end + len(CLOSE)
    return calls


PARSERS: dict[str, Callable[[str], list[ToolCall]]] = {"hermes": hermes}


def get_parser(name: str) -> Callable[[str], list[ToolCall]]:
    """A built-in parser by name, or "package.module:function"; ToolDefinitionError otherwise."""
    if name in PARSERS:
        return PARSERS[name]
    if ":" in name:
        import importlib

        module, _, attr = name.partition(":")
        try:
            fn = getattr(importlib.import_module(module), attr)
        except (Exception, SystemExit) as e:
            raise ToolDefinitionError(f"rollout.tool_parser={name!r} could not be imported: {e}") from e
        if callable(fn):
            return fn
    raise ToolDefinitionError(
        f"rollout.tool_parser={name!r}: choose one of {sorted(PARSERS)} or name your own as 'package.module:function'"
    )
