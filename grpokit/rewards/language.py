"""R1's language-consistency reward: the share of the chain of thought written in the target language.

Detection is by script, not by language: each word is a maximal run of letters of one script
(Latin, Cyrillic, Greek, Arabic, Hebrew, Devanagari, Hangul, Thai, ...), except Han ideographs and
kana, which count one word per character (those scripts do not separate words by spaces). The
reward is (words in the target's scripts) / (all words) over the reasoning: everything the model
wrote except its <answer> blocks (inside the think tags and outside them: text placed after
</think> is reasoning too). No letters at all gives None.

What counts as words, so that no part of the text is a hiding place:
  - prose, and the names of LaTeX commands written as words (`\\Let \\us \\compute`): a command
    counts unless it takes an argument (`\\textbf{`, `\\frac{`) or is one of LaTeX's mathematical
    symbols, operators or layout commands (MATH_COMMANDS: `\\alpha`, `\\sin`, `\\cdot`, `\\quad`);
  - in maths ($...$, $$...$$, \\(...\\), \\[...\\]): the arguments of \\text{}, \\mathrm{}, ... as prose,
    and runs of three or more letters (any script) and Han or kana characters; single and double
    letters are variables (x, ab), not words;
  - code (fenced blocks, inline spans) counts as written: its keywords and identifiers are words
    of their script like any other (a chain of thought that writes code is that much not in a
    non-Latin target language; prose hidden in a code block is not hidden).

Limits: languages sharing a script are not told apart ("en" and "fr" are both Latin); look-alike
letters from another script (Cyrillic "а" in English text, fullwidth "Ａ") count against the target.
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

from grpokit.scoring.completions import to_text

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
MATH_COMMANDS = frozenset(
    """alpha beta gamma delta epsilon varepsilon zeta eta theta vartheta iota kappa lambda mu nu xi pi
    varpi rho varrho sigma varsigma tau upsilon phi varphi chi psi omega Gamma Delta Theta Lambda Xi Pi
    Sigma Upsilon Phi Psi Omega sin cos tan cot sec csc arcsin arccos arctan sinh cosh tanh log ln lg
    exp lim limsup liminf sup inf max min arg det dim gcd lcm deg ker Pr mod bmod pmod sum prod coprod
    int iint iiint oint cdot cdots ldots dots vdots ddots times div pm mp le leq ge geq neq ne approx
    equiv sim simeq cong propto infty partial nabla forall exists nexists in notin ni subset subseteq
    supset supseteq cup cap bigcup bigcap emptyset varnothing setminus to gets rightarrow leftarrow
    Rightarrow Leftarrow leftrightarrow Leftrightarrow longrightarrow implies iff mapsto circ bullet
    star ast prime angle triangle perp parallel mid nmid neg lnot land lor wedge vee oplus otimes odot
    quad qquad left right big Big bigg Bigg bigl bigr Bigl Bigr displaystyle textstyle scriptstyle
    limits nolimits hbar ell Re Im aleph langle rangle lfloor rfloor lceil rceil vert Vert lvert rvert
    lVert rVert therefore because colon dagger top bot hat bar vec dot ddot tilde check breve acute
    grave overline underline widehat widetilde overrightarrow not degree circledast square blacksquare
    checkmark item newline linebreak hline noindent centering par smallskip medskip bigskip LaTeX TeX
    tiny small large Large LARGE huge normalsize bf it rm sf tt cal displaylimits over choose atop
    frac dfrac tfrac sqrt binom dbinom tbinom""".split()
)
_MATH_RE = re.compile(r"\$\$.*?(?:\$\$|\Z)|\\\[.*?(?:\\\]|\Z)|\\\(.*?(?:\\\)|\Z)|\$[^$\n]*\$", re.DOTALL)
_PROSE_ARG_RE = re.compile(r"\\(?:text\w*|mathrm|mbox|hbox|operatorname|emph)\s*\{([^{}]*)\}")
_COMMAND_RE = re.compile(r"\\([A-Za-z]+)(\s*[{\[])?")
_LETTERS_RE = re.compile(r"[^\W\d_]+")
_ANSWER_RE = re.compile(r"<answer>.*?(?:</answer>|\Z)", re.DOTALL)


def _commands(text: str) -> str:
    """Each LaTeX command replaced by its name when it is a word (see module doc), else by a space."""
    return _COMMAND_RE.sub(
        lambda m: " " if m.group(2) or m.group(1) in MATH_COMMANDS else f" {m.group(1)} ", text
    )


def _math_words(m: re.Match) -> str:
    body = m.group(0)
    prose = " ".join(_PROSE_ARG_RE.findall(body))
    body = _commands(_PROSE_ARG_RE.sub(" ", body))
    runs = [w for w in _LETTERS_RE.findall(body) if len(w) >= 3 or any(script_of(c) in _PER_CHAR for c in w)]
    return f" {prose} {' '.join(runs)} "


def prose_text(completion: str) -> str:
    """The reasoning's words as plain text: the completion without its <answer> blocks, think tags,
    maths but for its words, and LaTeX commands that are not words."""
    text = _ANSWER_RE.sub(" ", completion).replace("<think>", " ").replace("</think>", " ")
    text = _MATH_RE.sub(_math_words, text)
    return _commands(text)


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
            words = script_words(prose_text(to_text(c)))
            out.append(sum(w in scripts for w in words) / len(words) if words else None)
        return out

    return language_consistency


language_consistency = make_language_consistency()
