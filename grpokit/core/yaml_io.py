"""Reading config YAML: numbers that remember how they were written, and no key given twice.

PyYAML follows YAML 1.1, which rewrites text a user meant literally: ``output_dir: 007`` reads as the
octal 7, ``1e3`` as a string here and a float there, and a key given twice silently keeps the last one
(a repeated section drops every key of the earlier one). This loader resolves plain scalars by the
YAML 1.2 core schema (``true``/``false`` only, decimal ints, ``1e-6`` a float) and returns numbers as
``int``/``float`` subclasses that keep their source text, so that a field typed ``str`` (a path, a
name) gets exactly what was written (``grpokit.config.checks._coerce``); a mapping with a repeated key
is refused with both line numbers. PyYAML is kept (it parses); only the scalar rules are ours.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import yaml

from grpokit.core.errors import ConfigError

_BOOL = "tag:yaml.org,2002:bool"
_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"


class WrittenInt(int):
    """An int that keeps the text it was read from (``text``: "007" for 7)."""

    text: str


class WrittenFloat(float):
    """A float that keeps the text it was read from (``text``: "1e3" for 1000.0)."""

    text: str


def written(value: int | float, text: str) -> WrittenInt | WrittenFloat:
    out = WrittenFloat(value) if isinstance(value, float) else WrittenInt(value)
    out.text = text
    return out


class _Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 core-schema scalars and duplicate keys refused (``source`` names the file)."""

    source = "the config"

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            first: dict[tuple[str, str], yaml.Node] = {}
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                ident = (key_node.tag, key_node.value)
                if ident in first:
                    raise ConfigError(
                        f"{self.source}: key {key_node.value!r} is given twice in one mapping (line "
                        f"{first[ident].start_mark.line + 1} and line {key_node.start_mark.line + 1}); YAML "
                        "would silently keep only the last: merge them into one."
                    )
                first[ident] = key_node
        return super().construct_mapping(node, deep=deep)


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in (_BOOL, _INT, _FLOAT)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(_BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
_Loader.add_implicit_resolver(
    _INT, re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"), list("-+0123456789")
)
_Loader.add_implicit_resolver(
    _FLOAT,
    re.compile(
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)


def _construct_int(loader: _Loader, node: yaml.ScalarNode) -> WrittenInt:
    text = loader.construct_scalar(node)
    low = text.lower()
    if low.startswith("0o"):
        return written(int(text[2:], 8), text)
    if low.startswith("0x"):
        return written(int(text[2:], 16), text)
    try:
        return written(int(text, 10), text)
    except ValueError:
        raise ConfigError(
            f"{loader.source}: {text!r} (line {node.start_mark.line + 1}) is not an integer"
        ) from None


def _construct_float(loader: _Loader, node: yaml.ScalarNode) -> WrittenFloat:
    text = loader.construct_scalar(node)
    low = text.lower().lstrip("+")
    if low in (".inf", "-.inf"):
        return written(-math.inf if low.startswith("-") else math.inf, text)
    if low == ".nan":
        return written(math.nan, text)
    try:
        return written(float(text), text)
    except ValueError:
        raise ConfigError(
            f"{loader.source}: {text!r} (line {node.start_mark.line + 1}) is not a number"
        ) from None


_Loader.add_constructor(_INT, _construct_int)
_Loader.add_constructor(_FLOAT, _construct_float)


def load_yaml(text: str, source: str) -> Any:
    """The YAML document in ``text`` (``source`` names it in errors): ConfigError on bad YAML or a repeated key."""
    try:
        loader = _Loader(text)  # a control character (a binary file) fails here already
    except yaml.YAMLError as e:
        raise ConfigError(f"{source}: not valid YAML: {_one_line(e)}") from None
    loader.source = source
    try:
        return loader.get_single_data()
    except yaml.YAMLError as e:
        raise ConfigError(f"{source}: not valid YAML: {_one_line(e)}") from None
    finally:
        loader.dispose()


def _one_line(e: yaml.YAMLError) -> str:
    """PyYAML's error on one line: what, where (line and column, 1-based), and while doing what; its own
    text spans several lines and draws a caret under the place."""
    problem = getattr(e, "problem", None)
    if isinstance(e, yaml.reader.ReaderError):  # a character YAML does not allow
        return f"{e.reason}: character #x{e.character:04x} at offset {e.position} (is it a binary file?)"
    if problem is None:
        return " ".join(str(e).split())
    mark = getattr(e, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    context = getattr(e, "context", None)
    return f"{problem}{where}" + (f" ({context})" if context else "")


def read_yaml_file(path: Path) -> Any:
    """A YAML file's document; a missing, unreadable or non-UTF-8 file is a ConfigError naming it."""
    if not path.is_file():
        raise ConfigError(
            f"config file {path} does not exist" + (" (it is a folder)" if path.is_dir() else "")
        )
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ConfigError(
            f"config file {path} cannot be read ({e.strerror}); check its permissions"
        ) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise ConfigError(
            f"{path} is not UTF-8 text (byte {e.start}, line {line}); save it as UTF-8 "
            f"(e.g. iconv -f latin1 -t utf-8 {path.name} > fixed.yaml)."
        ) from None
    return load_yaml(text, str(path))


def parse_value(raw: str, source: str) -> Any:
    """A command-line override's value as YAML (numbers, bools, lists, null); text YAML cannot read stays
    text, and words Python reads as numbers (nan, inf) become numbers that keep their text."""
    if not raw.strip():
        return ""
    try:
        value = load_yaml(raw, source)
    except ConfigError as e:
        if "given twice" in str(e):
            raise
        return raw
    if isinstance(value, str):
        try:
            return written(float(raw), raw)
        except ValueError:
            return value
    return value


def plain(value: Any) -> Any:
    """``value`` with every WrittenInt/WrittenFloat (also inside lists and mappings) made a plain number."""
    if isinstance(value, bool):
        return value
    if isinstance(value, WrittenInt):
        return int(value)
    if isinstance(value, WrittenFloat):
        return float(value)
    if isinstance(value, dict):
        return {plain(k): plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value
