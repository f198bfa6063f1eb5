"""R1's format reward: reasoning in <think>...</think>, then the answer in <answer>...</answer>.

strict:  the whole completion is "<think>\\n...\\n</think>\\n<answer>\\n...\\n</answer>" (open-r1's pattern)
lenient: "<think>...</think> <answer>...</answer>" with any whitespace around and between the blocks
Both: each tag exactly once (no nesting, no second answer), non-empty think and answer bodies. If the
prompt (a string) ends with "<think>" -- chat templates that open the reasoning for the model --
the completion is read as if it started with "<think>\\n".
"""

from __future__ import annotations

import re

from grpokit.rewards._text import to_text

_STRICT = re.compile(r"<think>\n(?P<think>.*?)\n</think>\n<answer>\n(?P<answer>.*?)\n</answer>", re.DOTALL)
_LENIENT = re.compile(r"\s*<think>(?P<think>.*?)</think>\s*<answer>(?P<answer>.*?)</answer>\s*", re.DOTALL)
_TAGS = ("<think>", "</think>", "<answer>", "</answer>")


def _with_opened_think(prompt: object, text: str) -> str:
    if isinstance(prompt, str) and prompt.rstrip().endswith("<think>") and "<think>" not in text:
        return "<think>\n" + text.lstrip("\n")
    return text


def _format_score(pattern: re.Pattern, prompt: object, completion: object) -> float:
    text = _with_opened_think(prompt, to_text(completion))
    if any(text.count(tag) != 1 for tag in _TAGS):
        return 0.0
    m = pattern.fullmatch(text)
    return 1.0 if m and m.group("think").strip() and m.group("answer").strip() else 0.0


def format_strict(prompts: list, completions: list, **columns) -> list[float]:
    """1.0 when the completion is exactly <think>\\n...\\n</think>\\n<answer>\\n...\\n</answer>, else 0.0."""
    prompts = prompts if prompts is not None else [None] * len(completions)
    return [_format_score(_STRICT, p, c) for p, c in zip(prompts, completions)]


def format_lenient(prompts: list, completions: list, **columns) -> list[float]:
    """1.0 when the completion is <think>...</think> then <answer>...</answer>, whitespace free, else 0.0."""
    prompts = prompts if prompts is not None else [None] * len(completions)
    return [_format_score(_LENIENT, p, c) for p, c in zip(prompts, completions)]
