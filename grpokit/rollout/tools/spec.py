"""Tool definitions as TRL takes them: plain Python functions with type hints and a Google-style
docstring, described to the model by the tokenizer's chat template (``apply_chat_template(tools=...)``).

The JSON schema of each function is transformers' ``get_json_schema``; a function it cannot describe
(no docstring, an argument without a type hint or without a line under ``Args:``) is a
:class:`ToolDefinitionError` naming the tool and what to add, raised when the tools are loaded (before
any model is). Call arguments the model writes are checked against the schema here
(:func:`check_arguments`): a wrong type, a missing or unknown argument is an error message to the model.

    def multiply(a: int, b: int) -> int:
        \"\"\"Multiply two integers.

        Args:
            a: the first factor
            b: the second factor
        \"\"\"
        return a * b

    tools = load_tools([multiply, "python"])   # "python": the built-in sandboxed interpreter
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from grpokit.core.errors import ConfigError
from grpokit.core.user_code import UserCodeError, load_module


class ToolDefinitionError(ConfigError):
    """A tool the model cannot be told about: the message names the tool and what to fix."""


@dataclass(frozen=True)
class Tool:
    """One callable tool: its name (the function's), the function, and its JSON schema."""

    name: str
    fn: Callable[..., Any]
    schema: dict  # {"type": "function", "function": {"name", "description", "parameters"}}


def tool_schema(fn: Callable[..., Any]) -> dict:
    """The function's JSON schema (transformers' get_json_schema), or a ToolDefinitionError saying what is missing."""
    from transformers.utils import get_json_schema

    name = getattr(fn, "__name__", repr(fn))
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError) as e:
        raise ToolDefinitionError(
            f"tool {name!r}: its signature cannot be read ({e}); use a plain def"
        ) from e
    starred = [p.name for p in params if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if starred:
        raise ToolDefinitionError(
            f"tool {name!r}: *{starred[0]} cannot be described to the model; name each argument with a type hint"
        )
    try:
        return get_json_schema(fn)
    except Exception as e:  # DocstringParsingException / TypeHintParsingException
        raise ToolDefinitionError(
            f"tool {name!r}: {e}. A tool needs a docstring with a one-line description and an 'Args:' "
            "section naming every argument, and a type hint on every argument (e.g. def f(x: int) -> str)"
        ) from e


def load_tools(specs: list, where: str = "rollout.tools") -> list[Tool]:
    """Tools from functions or names: "python" (the built-in sandboxed interpreter), "module:function"
    or "path/to/file.py:function". Names must be unique. Raises ToolDefinitionError, naming the tool as
    ``where[k]`` (its list: rollout.tools, or an environment's tools attribute)."""
    tools: list[Tool] = []
    for k, spec in enumerate(specs):
        fn = _resolve(spec, f"{where}[{k}]")
        try:
            schema = tool_schema(fn)
        except ToolDefinitionError as e:
            raise ToolDefinitionError(f"{where}[{k}]: {e}") from e.__cause__
        tools.append(Tool(schema["function"]["name"], fn, schema))
    names = [t.name for t in tools]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ToolDefinitionError(
            f"{where}: two tools are named {dupes[0]!r}; tool names must be unique"
        )
    return tools


def _resolve(spec: object, where: str) -> Callable[..., Any]:
    if callable(spec):
        return spec
    if not isinstance(spec, str):
        raise ToolDefinitionError(f"{where}={spec!r}: give a function, 'python', or 'module:function'")
    if spec == "python":
        from grpokit.rollout.tools.python import make_python_tool

        return make_python_tool()
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr:
        raise ToolDefinitionError(
            f"{where}={spec!r}: not a tool name; use 'python', 'package.module:function' or 'file.py:function'"
        )
    try:
        module = load_module(target, attr, where, prefix="grpokit_user_tool")
        fn = getattr(module, attr)
    except (UserCodeError, AttributeError) as e:
        raise ToolDefinitionError(f"{where}={spec!r}: loading it failed: {e}") from e
    if not callable(fn):
        raise ToolDefinitionError(f"{where}={spec!r} is a {type(fn).__name__}, not a function")
    return fn


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "integer": (int,),
    "number": (int, float),
    "string": (str,),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
    "null": (type(None),),
}


def _type_ok(value: object, spec: dict) -> bool:
    kinds = spec.get("type")
    if kinds is None:
        return True  # Any, or a schema this checker does not read: the tool itself judges
    for kind in [kinds] if isinstance(kinds, str) else kinds:
        types = _JSON_TYPES.get(kind)
        if types is None:
            return True
        if isinstance(value, bool) and kind in ("integer", "number"):
            continue  # JSON true is not a number
        if isinstance(value, types):
            return True
    return False


def check_arguments(tool: Tool, arguments: object) -> str | None:
    """None when ``arguments`` fit the tool's schema, else what is wrong, for the model to read.

    Checked: a JSON object; no unknown names; every required name present; each value of the JSON type the
    type hint gives (top level only; enum too). Written here rather than with the jsonschema package
    because get_json_schema emits only these few keywords and the message must speak to the model."""
    params = tool.schema["function"].get("parameters", {})
    props: dict = params.get("properties", {})
    if not isinstance(arguments, dict):
        return f"the arguments of {tool.name} must be a JSON object, got {type(arguments).__name__}"
    unknown = sorted(set(arguments) - set(props))
    if unknown:
        return f"{tool.name} has no argument {echo(unknown[0])}; its arguments are {sorted(props)}"
    missing = [n for n in params.get("required", []) if n not in arguments]
    if missing:
        return f"{tool.name} needs the argument {missing[0]!r}"
    for name, value in arguments.items():
        spec = props[name]
        if not _type_ok(value, spec):
            return f"argument {name!r} of {tool.name} must be of type {spec.get('type')}, got {echo(value)}"
        if "enum" in spec and value not in spec["enum"]:
            return f"argument {name!r} of {tool.name} must be one of {spec['enum']}, got {echo(value)}"
    return None


ECHO_CHARS = 60
"""The most characters of the model's own text that an error message repeats back (a name, a value)."""


def echo(value: object) -> str:
    """repr(value) cut to ECHO_CHARS characters, for an error message the model reads; never raises (a
    value nested past the recursion limit, an int of more than 4,300 digits: its type)."""
    try:
        text = repr(value)
    except (ValueError, RecursionError, MemoryError):
        return f"<a {type(value).__name__}>"
    return text if len(text) <= ECHO_CHARS else text[:ECHO_CHARS] + "..."
