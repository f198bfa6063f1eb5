"""Which answer of a completion `math_accuracy` grades: the visible final answer (see accuracy.py).

Only what a reader of the rendered completion sees is graded:
  - reasoning (up to the last </think>, or from an unclosed <think>) and code (fenced blocks, inline
    spans) are removed, so an answer written there never counts;
  - hidden text is removed: HTML comments, LaTeX comments (a `%` that is not a percent sign, i.e.
    not escaped and not after a number, to the end of its line), and \\phantom / \\hphantom /
    \\vphantom with their argument;
  - what a reader does not see, or sees withdrawn, is removed: struck-out text (~~x~~, <del>, <s>,
    \\sout, \\cancel), markdown comments and link reference definitions ([//]: # (x)), images with
    their alt text, link targets and titles, \\label; \\textbf{x} and its kind are read as x;
  - a completion whose graded part recolours, scales, overlaps or redefines text (\\color,
    \\textcolor, \\colorbox, \\scalebox, \\resizebox, \\style, \\htmlStyle, \\class, \\rlap, \\smash,
    \\raisebox, \\def, \\newcommand, \\renewcommand, \\let, \\iffalse), or holds an HTML element other
    than plain text markup (b, i, em, strong, sup, sub, p, br, lists, tables, headings: any other, such as
    <template>, <noscript>, <textarea>, <font>, <span>, <details>, <script>), any HTML attribute, or CDATA,
    cannot be graded from what a reader sees: it scores 0 (MALFORMED).
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
    r"renewcommand|providecommand|let|iffalse|if0|DeclareRobustCommand|style|htmlStyle|htmlClass|htmlId|"
    r"htmlData|class|cssId|mathcolor|rlap|llap|clap|mathrlap|mathllap|mathclap|smash|raisebox|"
    r"mathchoice|hidden)(?![A-Za-z])"
    r"|<\s*(?:details|style|script)\b|<\s*[A-Za-z][^>]*\b(?:style|class|hidden)\b|<!\[CDATA\[|<!(?!--)",
    re.IGNORECASE,
)
_TAG_RE = re.compile(r"<\s*(/?)\s*([A-Za-z][A-Za-z0-9-]*)((?:\s+[^<>]*?)?)\s*(/?)\s*>")
HTML_ELEMENTS = frozenset(
    """a abbr acronym address applet area article aside audio b base basefont bdi bdo big blink blockquote body
    br button canvas caption center cite code col colgroup data datalist dd del details dfn dialog dir div dl
    dt em embed fieldset figcaption figure font footer form frame frameset h1 h2 h3 h4 h5 h6 head header hr
    html i iframe img input ins kbd label legend li link listing main map mark marquee math menu meta meter
    nav nobr noembed noframes noscript object ol optgroup option output p param picture plaintext pre
    progress q rp rt ruby s samp script section select slot small source spacer span strike strong style
    sub summary sup svg table tbody td template textarea tfoot th thead time title tr track tt u ul var
    video wbr xmp""".split()
)
SHOWN_ELEMENTS = frozenset(
    """b strong i em u sup sub br p hr ul ol li h1 h2 h3 h4 h5 h6 blockquote pre code table tr td th thead
    tbody tfoot small big mark tt ins center caption""".split()
)
"""HTML elements whose content a reader sees as it is written (and without attributes). Any other element
(<template>, <noscript>, <textarea>, <font>, <span>, <a>, ...) or any attribute may hide or restyle text:
the completion cannot be graded from what a reader sees."""
STRUCK_RE = re.compile(
    r"~~(?=\S)(?:.*?\S)?~~|<\s*(del|s|strike)\s*>.*?<\s*/\s*\1\s*>",
    re.IGNORECASE | re.DOTALL,
)
_STRUCK_LATEX_RE = re.compile(r"\\(?:sout|st|cancel|bcancel|xcancel|xout|cancelto\s*\{[^{}]*\})\s*")
_MD_DEFINITION_RE = re.compile(r"^[ \t]{0,3}\[[^\]\n]+\]:[ \t]*\S.*$", re.MULTILINE)
_MD_IMAGE_RE = re.compile(r"!\[[^\]\n]*\]\([^)\n]*\)|!\[[^\]\n]*\]\[[^\]\n]*\]")
_MD_LINK_RE = re.compile(r"\[([^\]\n]*)\]\([^)\n]*\)|\[([^\]\n]*)\]\[[^\]\n]*\]")
_INVISIBLE_ARG_RE = re.compile(r"\\(?:label|href|url|hyperref)\s*")
_FORMAT_RE = re.compile(
    r"\\(?:textbf|textit|textsl|emph|underline|textsf|texttt|textrm|textup)\s*\{([^{}]*)\}"
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


_CLAUSE_RE = re.compile(r"[,;]\s+(?=[A-Za-z]{2,}\b)(?![A-Za-z]\w*\s*=)")


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
    rest = _CLAUSE_RE.split(rest, maxsplit=1)[0].strip()  # "18, which is ...": the clause is not the answer
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


def _hides_in_html(text: str) -> bool:
    """An HTML element a reader does not see as written (not in SHOWN_ELEMENTS) or any attribute."""
    for m in _TAG_RE.finditer(text):
        name, attributes = m.group(2).lower(), m.group(3).strip()
        if name in ("answer", "think"):
            continue
        if name in HTML_ELEMENTS and (name not in SHOWN_ELEMENTS or "=" in attributes or attributes):
            return True
    return False


def _without_latex_args(text: str, pattern: re.Pattern, keep_last: bool) -> str:
    """`text` with each command of `pattern` and its brace arguments removed (keep_last: all but the last
    argument removed, as \\href{url}{text} shows only its text)."""
    while True:
        m = pattern.search(text)
        if m is None:
            return text
        i, groups = m.end(), []
        while i < len(text) and text[i] == "{":
            j = _group_end(text, i, len(text))
            if j is None:
                break
            groups.append((i, j))
            i = j + 1
            while i < len(text) and text[i] in " \t":
                i += 1
        kept = text[groups[-1][0] + 1 : groups[-1][1]] if keep_last and len(groups) > 1 else ""
        text = text[: m.start()] + " " + kept + " " + text[i:]


def _without_markup(text: str) -> str:
    """What a reader sees of markdown and LaTeX markup: struck-out text (~~x~~, <del>, <s>, \\sout,
    \\cancel) is withdrawn, so removed; link reference definitions and markdown comments ([//]: # (x)),
    images (their alt text) and link targets and titles are not shown; \\label is invisible, \\href shows
    its text; \\textbf{x} and its kind are x."""
    if "~~" in text or "<" in text:
        text = STRUCK_RE.sub(" ", text)
    if "<" in text:  # the plain markup a reader sees through (<b>Answer:</b> 18 reads "Answer: 18")
        text = _TAG_RE.sub(lambda m: " " if m.group(2).lower() in SHOWN_ELEMENTS else m.group(0), text)
    if "\\" in text:
        text = _without_latex_args(text, _STRUCK_LATEX_RE, keep_last=False)
        text = _without_latex_args(text, _INVISIBLE_ARG_RE, keep_last=True)
        for _ in range(4):
            text, n = _FORMAT_RE.subn(r"\1", text)
            if not n:
                break
    if "]" in text:
        text = _MD_DEFINITION_RE.sub(" ", text)
        text = _MD_IMAGE_RE.sub(" ", text)
        text = _MD_LINK_RE.sub(lambda m: m.group(1) if m.group(1) is not None else m.group(2), text)
    return text


def visible_region(text: str) -> str | None:
    """The part of a completion graded (see module doc), None when it hides or redefines text."""
    if "</think>" in text:  # everything up to the last </think> is reasoning (maybe opened by the template)
        text = text.rsplit("</think>", 1)[1]
    if "<think>" in text:  # unclosed: everything after it is reasoning
        text = text.split("<think>", 1)[0]
    text = _without_code(text)
    text = _HTML_COMMENT_RE.sub(" ", text) if "<!--" in text else text
    if _HIDING_RE.search(text) or ("<" in text and _hides_in_html(STRUCK_RE.sub(" ", text))):
        return None
    return _without_phantoms(_without_latex_comments(_without_markup(text)))


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
