"""R1's format reward: reasoning in <think>...</think>, then the answer in <answer>...</answer>.

strict:  the whole completion is "<think>\\n...\\n</think>\\n<answer>\\n...\\n</answer>" (open-r1's pattern)
lenient: "<think>...</think> <answer>...</answer>" with any whitespace around and between the blocks
Both: each tag exactly once (no nesting, no second answer), think and answer bodies with at least one
visible character (whitespace, zero-width and other invisible characters alone score 0: see
has_visible_text). Windows line ends (CRLF) count as newlines. If the
prompt (a string) ends with "<think>" -- chat templates that open the reasoning for the model --
the completion is read as if it started with "<think>\\n".
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

from grpokit.scoring.completions import to_text

_STRICT = re.compile(r"<think>\n(?P<think>.*?)\n</think>\n<answer>\n(?P<answer>.*?)\n</answer>", re.DOTALL)
_LENIENT = re.compile(r"\s*<think>(?P<think>.*?)</think>\s*<answer>(?P<answer>.*?)</answer>\s*", re.DOTALL)
_TAGS = ("<think>", "</think>", "<answer>", "</answer>")
# Categories that draw nothing: separators, controls and format characters (zero-width space and
# joiners, BOM, bidi marks), private use, unassigned, surrogates, and combining marks on their own.
_INVISIBLE_CATEGORIES = frozenset({"Zs", "Zl", "Zp", "Cc", "Cf", "Co", "Cn", "Cs", "Mn", "Me"})
# Letters and symbols that render blank: Hangul fillers, the halfwidth filler, the blank Braille
# pattern, the Mongolian vowel separator.
_BLANK_CHARS = frozenset("\u115f\u1160\u3164\uffa0\u2800\u180e")


# Characters whose Unicode name says they draw nothing (fillers, blanks, null glyphs, spaces,
# separators, joiners, selectors, tags), whatever their category: the Hangul and Khitan fillers, the
# blank Braille pattern, MUSICAL SYMBOL NULL NOTEHEAD, ...
_BLANK_NAME = re.compile(
    r"\b(?:FILLER|BLANK|NULL|SPACE|SEPARATOR|JOINER|SELECTOR|INVISIBLE|TAG|ZERO WIDTH)\b"
)


@lru_cache(maxsize=65536)
def _draws(c: str) -> bool:
    if c.isspace() or c in _BLANK_CHARS or unicodedata.category(c) in _INVISIBLE_CATEGORIES:
        return False
    return c.isascii() or _BLANK_NAME.search(unicodedata.name(c, "")) is None


def has_visible_text(text: str) -> bool:
    """True when `text` has a character that draws something: not whitespace, not of a category that
    draws nothing, and not named as drawing nothing (a filler, a blank, a null glyph, a space ...)."""
    return any(_draws(c) for c in text)


def _with_opened_think(prompt: object, text: str) -> str:
    if isinstance(prompt, str) and prompt.rstrip().endswith("<think>") and "<think>" not in text:
        return "<think>\n" + text.lstrip("\n")
    return text


def _format_score(pattern: re.Pattern, prompt: object, completion: object) -> float:
    text = _with_opened_think(prompt, to_text(completion).replace("\r\n", "\n"))  # line ends are not format
    if any(text.count(tag) != 1 for tag in _TAGS):
        return 0.0
    m = pattern.fullmatch(text)
    return 1.0 if m and has_visible_text(m.group("think")) and has_visible_text(m.group("answer")) else 0.0


def format_strict(prompts: list, completions: list, **columns) -> list[float]:
    """1.0 when the completion is exactly <think>\\n...\\n</think>\\n<answer>\\n...\\n</answer>, else 0.0."""
    prompts = prompts if prompts is not None else [None] * len(completions)
    return [_format_score(_STRICT, p, c) for p, c in zip(prompts, completions)]


def format_lenient(prompts: list, completions: list, **columns) -> list[float]:
    """1.0 when the completion is <think>...</think> then <answer>...</answer>, whitespace free, else 0.0."""
    prompts = prompts if prompts is not None else [None] * len(completions)
    return [_format_score(_LENIENT, p, c) for p, c in zip(prompts, completions)]
