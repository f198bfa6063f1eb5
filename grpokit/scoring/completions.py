"""Completions and prompts in TRL's two shapes: plain strings or chat messages."""

from __future__ import annotations

from typing import Any


def tag_blocks(text: str, tag: str) -> list[str] | None:
    """Contents of every <tag>...</tag> in order, [] when there is none, and None when the tags are
    malformed: nested ("<t> a <t> b </t> </t>"), a closing tag without an opening one, or an opening
    tag left unclosed. Linear time (a regex with .*? is quadratic on thousands of unclosed tags)."""
    open_, close = f"<{tag}>", f"</{tag}>"
    out, i = [], 0
    while True:
        start = text.find(open_, i)
        stray = text.find(close, i)
        if start < 0:
            return out if stray < 0 else None
        if 0 <= stray < start:  # "</t>" before any "<t>"
            return None
        end = text.find(close, start + len(open_))
        if end < 0 or text.find(open_, start + len(open_), end) >= 0:  # unclosed, or nested
            return None
        out.append(text[start + len(open_) : end])
        i = end + len(close)


def is_conversational(prompt: Any) -> bool:
    """A prompt given as chat messages, decided as TRL's data_utils.is_conversational does (a list
    whose first item is a dict with a "role"): its completions then reach reward functions as messages."""
    return (
        isinstance(prompt, (list, tuple))
        and len(prompt) > 0
        and isinstance(prompt[0], dict)
        and "role" in prompt[0]
    )


def as_completions(prompts: list, texts: list[str]) -> list:
    """The completions as TRL's GRPOTrainer passes them to reward functions: for a conversational
    prompt one assistant message, [{"role": "assistant", "content": text}], otherwise the text."""
    return [
        [{"role": "assistant", "content": text}] if is_conversational(prompt) else text
        for prompt, text in zip(prompts, texts, strict=True)
    ]


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
        return "".join(
            p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
        )
    return ""


def reasoning_text(completion: str) -> str:
    """The chain of thought: everything up to the last </think> (the chat template may have opened
    <think> in the prompt), else from an unclosed <think> to the end, else the whole completion."""
    if "</think>" in completion:
        text = completion.rsplit("</think>", 1)[0]
    elif "<think>" in completion:
        text = completion.split("<think>", 1)[1]
    else:
        return completion
    return text.replace("<think>", " ").replace("</think>", " ")
