"""Which answer of a completion `math_accuracy` grades: the visible final answer (see accuracy.py).

Only what a reader of the rendered completion sees is graded:
  - reasoning (up to the last </think>, or from an unclosed <think>) and code (fenced blocks, inline
    spans) are removed, so an answer written there never counts;
  - hidden text is removed: HTML comments, LaTeX comments (a `%` that is not a percent sign, i.e.
    not escaped and not after a number, to the end of its line), and \\phantom / \\hphantom /
    \\vphantom with their argument;
  - a completion whose graded part recolours, scales or redefines text (\\color, \\textcolor,
    \\colorbox, \\scalebox, \\resizebox, \\def, \\newcommand, \\renewcommand, \\let, \\iffalse, HTML
    tags with a style, class or hidden attribute, <details>, <style>, <script>) cannot be graded
    from what a reader sees: it scores 0 (MALFORMED).
Then the answer is, at the first level present: the <answer>...</answer> blocks (a \\boxed{} inside
one wins over its text), every \\boxed{} / \\fbox{}, every GSM8K "#### n", else the last answer
marker: "answer" followed by "is", "would/will/should be", ":" or "=" ("The final answer is 18",
"**Answer:** 18", "Answer = 18"), or a heading or bold label "Answer" / "Final Answer" alone on its
line with the value on the next one; markdown emphasis around the marker or the value is dropped, and
so is the sentence's closing ".", "!" or "?" ("The answer is 18!" is 18, not 18 factorial: a boxed
"18!" stays a factorial).
"""

from __future__ import annotations

import collections
import re

from grpokit.rewards._text import tag_blocks

MAX_ANSWER_CHARS = 1000
MALFORMED = "\x00malformed"
"""The candidate returned for a completion whose answer cannot be graded (scores 0)."""
_MAX_BOXES = 32
_HASH_RE = re.compile(r"####[ \t]*([^\n]*)")
_PHRASE_RE = re.compile(
    r"\banswer\b(?:[ \t]*[*_]+)?[ \t]*(?:is\b[ \t]*:?|would[ \t]+be\b|will[ \t]+be\b|should[ \t]+be\b|:|=)[ \t*_:]*"
    r"|^[ \t]*#*[ \t]*[*_]*[ \t]*(?:final[ \t]+)?answer[ \t]*[*_]*[ \t]*:?[ \t]*[*_]*[ \t]*$",
    re.IGNORECASE | re.MULTILINE,
)
_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*")
_INLINE_CODE_RE = re.compile(r"`[^`\n]*`")
_HTML_COMMENT_RE = re.compile(r"<!--.*?(?:-->|\Z)", re.DOTALL)
_PHANTOM_RE = re.compile(r"\\[hv]?phantom\s*")
_HIDING_RE = re.compile(
    r"\\(?:color|textcolor|colorbox|fcolorbox|pagecolor|scalebox|resizebox|def|edef|gdef|newcommand|"
    r"renewcommand|providecommand|let|iffalse|if0|DeclareRobustCommand)(?![A-Za-z])"
    r"|<\s*(?:details|style|script)\b|<\s*[A-Za-z][^>]*\b(?:style|class|hidden)\b",
    re.IGNORECASE,
)


def _group_end(text: str, i: int, limit: int) -> int | None:
    """The index of the brace closing the group opened at text[i] == "{", None when unbalanced."""
    depth, end = 0, min(len(text), i + limit)
    for j in range(i, end):
        c = text[j]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return j
    return None


def _boxed(text: str) -> list[str]:
    out = []
    for m in _BOX_RE.finditer(text):
        i = m.end()
        if i < len(text) and text[i] == "{":
            j = _group_end(text, i, MAX_ANSWER_CHARS + 2)
            out.append(text[i + 1 : j] if j is not None else "\x00unbalanced")
        else:  # "\boxed 5"
            token = re.match(r"[^\s$]+", text[i : i + 100])
            out.append(token.group(0) if token else "")
        if len(out) > _MAX_BOXES:
            break
    return out


def _phrase(text: str) -> str | None:
    last = collections.deque(_PHRASE_RE.finditer(text), maxlen=1)
    if not last:
        return None
    end = last[0].end()
    rest = text[end : end + 300].lstrip().split("\n", 1)[0]
    rest = re.split(r"[.!?]\s", rest, maxsplit=1)[0].strip()
    while rest and rest[-1] in ".!?*_ " and not rest.endswith(("\\!", "\\?")):
        rest = rest[:-1]
    return rest.lstrip("*_ ").strip() or None


def _without_code(text: str) -> str:
    """`text` without fenced code blocks (an unclosed fence runs to the end) and inline code spans."""
    kept, i = [], 0
    while True:
        start = text.find("```", i)
        if start < 0:
            kept.append(text[i:])
            break
        kept.append(text[i:start])
        end = text.find("```", start + 3)
        if end < 0:
            break
        i = end + 3
    return _INLINE_CODE_RE.sub(" ", "".join(kept))


def _without_latex_comments(text: str) -> str:
    """Each line cut at its first `%` that is neither escaped (\\%) nor a percent sign after a number."""
    if "%" not in text:
        return text
    lines = text.split("\n")
    for k, line in enumerate(lines):
        i = line.find("%")
        while i >= 0:
            before = line[:i].rstrip()
            if line[i - 1 : i] == "\\" or (before and before[-1].isdigit()):
                i = line.find("%", i + 1)
                continue
            lines[k] = line[:i]
            break
    return "\n".join(lines)


def _without_phantoms(text: str) -> str:
    while True:
        m = _PHANTOM_RE.search(text)
        if m is None:
            return text
        i = m.end()
        j = _group_end(text, i, len(text)) if i < len(text) and text[i] == "{" else None
        text = text[: m.start()] + " " + (text[j + 1 :] if j is not None else text[i:])


def visible_region(text: str) -> str | None:
    """The part of a completion graded (see module doc), None when it hides or redefines text."""
    if "</think>" in text:  # everything up to the last </think> is reasoning (maybe opened by the template)
        text = text.rsplit("</think>", 1)[1]
    if "<think>" in text:  # unclosed: everything after it is reasoning
        text = text.split("<think>", 1)[0]
    text = _without_code(text)
    text = _HTML_COMMENT_RE.sub(" ", text) if "<!--" in text else text
    if _HIDING_RE.search(text):
        return None
    return _without_phantoms(_without_latex_comments(text))


def extract_answers(completion: str) -> list[str]:
    """Every final-answer candidate of the completion at the highest level present (see module doc);
    [MALFORMED] when its answer tags nest or do not pair up, or it hides or redefines text."""
    region = visible_region(completion)
    if region is None:
        return [MALFORMED]
    tags = tag_blocks(region, "answer")
    if tags is None:
        return [MALFORMED]
    if tags:
        out = []
        for tag in tags:
            out.extend(_boxed(tag) or [_phrase(tag) or tag.strip()])
        return out
    return (
        _boxed(region) or [h.strip() for h in _HASH_RE.findall(region)] or [p for p in [_phrase(region)] if p]
    )


def gold_answer(gold: object) -> str:
    """The final answer inside a ground-truth cell: after the last '####', the last \\boxed{}, or all."""
    text = str(gold).strip()
    if "####" in text:
        return text.rsplit("####", 1)[1].strip()
    boxed = _boxed(text)
    return boxed[-1] if boxed else text
