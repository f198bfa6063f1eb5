"""R1's language-consistency reward: the share of the chain of thought written in the target language.

Detection is by script, not by language: each word is a maximal run of letters of one script
(Latin, Cyrillic, Greek, Arabic, Hebrew, Devanagari, Hangul, Thai, ...), except Han ideographs and
kana, which count one word per character (those scripts do not separate words by spaces). The
reward is (words in the target's scripts) / (all words) over the reasoning: the <think> blocks when
present, else the whole completion. Code blocks, inline code, $...$ maths and LaTeX commands are
removed first, so \\frac is not English and x is not a word. No letters at all gives None.

Limits: languages sharing a script are not told apart ("en" and "fr" are both Latin); look-alike
letters from another script (Cyrillic "а" in English text, fullwidth "Ａ") count against the target.
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

from grpokit.rewards._text import reasoning_text, to_text

LANGUAGE_SCRIPTS: dict[str, frozenset[str]] = {
    **{
        code: frozenset({"LATIN"})
        for code in "en fr de es it pt nl sv da no fi pl cs ro hu tr vi id ms sw".split()
    },
    **{code: frozenset({"CYRILLIC"}) for code in "ru uk bg sr be kk mk".split()},
    "zh": frozenset({"CJK"}),
    "ja": frozenset({"CJK", "HIRAGANA", "KATAKANA"}),
    "ko": frozenset({"HANGUL"}),
    "el": frozenset({"GREEK"}),
    "ar": frozenset({"ARABIC"}),
    "fa": frozenset({"ARABIC"}),
    "he": frozenset({"HEBREW"}),
    "hi": frozenset({"DEVANAGARI"}),
    "th": frozenset({"THAI"}),
}
_PER_CHAR = frozenset({"CJK", "HIRAGANA", "KATAKANA"})
_STRIP = re.compile(r"```.*?```|`[^`\n]*`|\$\$.*?\$\$|\$[^$\n]*\$|\\[a-zA-Z]+", re.DOTALL)


@lru_cache(maxsize=16384)
def script_of(ch: str) -> str | None:
    """The script of a letter ("LATIN", "CJK", ...), None for non-letters."""
    if not ch.isalpha():
        return None
    if ch.isascii():
        return "LATIN"
    name = unicodedata.name(ch, "")
    first = name.split(" ", 1)[0]
    return "CJK" if first == "CJK" else first or "UNKNOWN"


def script_words(text: str) -> list[str]:
    """The script of each word of `text` (see module doc)."""
    out, prev = [], None
    for ch in text:
        s = script_of(ch)
        if s is not None and (s != prev or s in _PER_CHAR):
            out.append(s)
        prev = s
    return out


def make_language_consistency(target: str = "en"):
    """A language_consistency reward for `target` (a language code from LANGUAGE_SCRIPTS or a script name)."""
    scripts = LANGUAGE_SCRIPTS.get(target.lower()) or frozenset({target.upper()})
    known = {s for v in LANGUAGE_SCRIPTS.values() for s in v}
    if not scripts & known:
        raise ValueError(
            f"unknown language or script {target!r}; known: {sorted(LANGUAGE_SCRIPTS)} or {sorted(known)}"
        )

    def language_consistency(prompts: list, completions: list, **columns) -> list[float | None]:
        out: list[float | None] = []
        for c in completions:
            words = script_words(_STRIP.sub(" ", reasoning_text(to_text(c))))
            out.append(sum(w in scripts for w in words) / len(words) if words else None)
        return out

    return language_consistency


language_consistency = make_language_consistency()
