"""Completions and prompts in TRL's two shapes: plain strings or chat messages."""

from __future__ import annotations

import re
from typing import Any

THINK_RE = re.compile(r"<think>(.*?)</think>", re.DOTALL)


def to_text(item: Any) -> str:
    """The text of a completion or prompt: a string, a message dict, or a list of messages.

    For a list of messages the assistant messages are joined (a completion is normally a single
    assistant message); a list without roles is joined whole. Content given as a list of parts
    ({"type": "text", "text": ...}) is flattened. Anything else becomes "" (never raises).
    """
    try:
        if item is None:
            return ""
        if isinstance(item, str):
            return item
        if isinstance(item, dict):
            return _content(item.get("content"))
        if isinstance(item, (list, tuple)):
            messages = [m for m in item if isinstance(m, dict)]
            if not messages:
                return "".join(x for x in item if isinstance(x, str))
            assistant = [m for m in messages if m.get("role") == "assistant"]
            return "\n".join(_content(m.get("content")) for m in (assistant or messages))
        return ""
    except Exception:
        return ""


def _content(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def reasoning_text(completion: str) -> str:
    """The chain of thought: the <think> blocks if any, an unclosed <think> to the end, else all."""
    blocks = THINK_RE.findall(completion)
    if blocks:
        return "\n".join(blocks)
    if "<think>" in completion:
        return completion.split("<think>", 1)[1]
    if "</think>" in completion:  # the chat template put <think> in the prompt
        return completion.split("</think>", 1)[0]
    return completion
