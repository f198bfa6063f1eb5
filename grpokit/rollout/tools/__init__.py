"""Tools for multi-turn rollouts: definitions (spec), call parsing (parsers), running calls with a time
budget (runner) and the built-in sandboxed ``python`` tool (python). See grpokit.rollout.multiturn for the rollout."""

from grpokit.rollout.tools.parsers import PARSERS, ToolCall, get_parser, hermes
from grpokit.rollout.tools.runner import ToolResult, ToolRunner
from grpokit.rollout.tools.spec import Tool, ToolDefinitionError, check_arguments, load_tools, tool_schema

__all__ = [
    "PARSERS",
    "Tool",
    "ToolCall",
    "ToolDefinitionError",
    "ToolResult",
    "ToolRunner",
    "check_arguments",
    "get_parser",
    "hermes",
    "load_tools",
    "tool_schema",
]
