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
  - a completion whose graded part holds TeX that does not print what it holds as written, by an
    allowlist (`_tex.py`: a command or environment not known to print, such as \\color, \\rlap, \\def,
    \\setbox, \\iffalse, \\begin{comment} or an environment of its own), or holds an HTML element other
    than plain text markup (b, i, em, strong, sup, sub, p, br, lists, tables, headings: any other, such as
    <template>, <noscript>, <textarea>, <font>, <span>, <details>, <script>), any HTML attribute, or CDATA,
    cannot be graded from what a reader sees: it scores 0 (MALFORMED).
Then the answer is, at the first level present: the <answer>...</answer> blocks (a \\boxed{} inside
one wins over its text), every \\boxed{} / \\fbox{} the text owns (`disowned`: not one it negates, "not
\\boxed{18}", "\\boxed{18} is wrong", "rather than"; gives as someone else's or hypothetically, "Tom thinks",
"one might say", "Tom's answer"; gives up, "at first I thought"; calls a mistake; or asks, "\\boxed{18}?"),
every GSM8K "#### n", else the last answer
marker the text owns: "answer" followed by "is", "would/will/should be", ":" or "=" ("The final answer is 18",
"**Answer:** 18", "Answer = 18"), or a heading or bold label "Answer" / "Final Answer" alone on its
line with the value on the next one; markdown emphasis around the marker or the value is dropped, and
so is the sentence's closing ".", "!" or "?" ("The answer is 18!" is 18, not 18 factorial: a boxed
"18!" stays a factorial).
"""

from __future__ import annotations

import re

from grpokit.rewards._tex import first_unprinted
from grpokit.rewards._units import unit_after
from grpokit.scoring.completions import tag_blocks

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
_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])\s*")
_INLINE_CODE_RE = re.compile(r"`[^`\n]*`")
_HTML_COMMENT_RE = re.compile(r"<!--.*?(?:-->|\Z)", re.DOTALL)
_PHANTOM_RE = re.compile(r"\\[hv]?phantom(?![A-Za-z])\s*")
_HIDING_RE = re.compile(
    r"<\s*(?:details|style|script)\b|<\s*[A-Za-z][^>]*\b(?:style|class|hidden)\b|<!\[CDATA\[|<!(?!--)",
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
_STRUCK_LATEX_RE = re.compile(
    r"\\(?:(?:sout|st|cancel|bcancel|xcancel|xout)(?![A-Za-z])|cancelto\s*\{[^{}]*\})\s*"
)
_MD_DEFINITION_RE = re.compile(r"^[ \t]{0,3}\[[^\]\n]+\]:[ \t]*\S.*$", re.MULTILINE)
_MD_IMAGE_RE = re.compile(r"!\[[^\]\n]*\]\([^)\n]*\)|!\[[^\]\n]*\]\[[^\]\n]*\]")
_MD_LINK_RE = re.compile(r"\[([^\]\n]*)\]\([^)\n]*\)|\[([^\]\n]*)\]\[[^\]\n]*\]")
_INVISIBLE_ARG_RE = re.compile(r"\\(?:label|href|url|hyperref)(?![A-Za-z])\s*")
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


_NOT_THIS_RE = re.compile(r",?\s+(?:rather\s+than|instead\s+of|not)\b", re.IGNORECASE)
_CLAUSE_RE = re.compile(r"[,;]\s+(?=[A-Za-z]{2,}\b)(?![A-Za-z]\w*\s*=)")


def _boxes(text: str) -> list[tuple[int, int, str]]:
    """(start, end, content) of every \\boxed{} / \\fbox{} of `text` (at most _MAX_BOXES + 1)."""
    out = []
    for m in _BOX_RE.finditer(text):
        i = m.end()
        if i < len(text) and text[i] == "{":
            j = _group_end(text, i, MAX_ANSWER_CHARS + 2)
            out.append(
                (
                    m.start(),
                    j + 1 if j is not None else len(text),
                    text[i + 1 : j] if j is not None else "\x00unbalanced",
                )
            )
        else:  # "\boxed 5"
            token = re.match(r"[^\s$]+", text[i : i + 100])
            out.append((m.start(), i + (token.end() if token else 0), token.group(0) if token else ""))
        if len(out) > _MAX_BOXES:
            break
    return out


def _boxed(text: str) -> list[str]:
    return [content for _, _, content in _boxes(text)]


def _owned_boxes(text: str) -> list[str]:
    """The boxes the text states as its own answer (see `disowned`), each with the unit written right after
    it ("\\boxed{120} hours" is "120 hours")."""
    out = []
    for start, end, content in _boxes(text):
        if not disowned(text, start, end):
            unit = unit_after(text[end:])
            out.append(
                content if unit is None else f"{content}{unit}" if unit == "%" else f"{content} {unit}"
            )
    return out


def _phrase(text: str) -> str | None:
    """The value after the last answer marker the text states as its own (see `disowned`)."""
    for match in reversed(list(_PHRASE_RE.finditer(text))[-_MAX_BOXES:]):
        end = match.end()
        rest = text[end : end + 300].lstrip().split("\n", 1)[0]
        rest = re.split(r"[.!?]\s", rest, maxsplit=1)[0].strip()
        rest = _CLAUSE_RE.split(rest, maxsplit=1)[0].strip()  # "18, which is ...": not the answer
        rest = _NOT_THIS_RE.split(rest, maxsplit=1)[0].strip()  # "17 rather than 18": 17
        while rest and rest[-1] in ".!?*_ " and not rest.endswith(("\\!", "\\?")):
            rest = rest[:-1]
        value = rest.lstrip("*_ ").strip()
        if not value:
            return None
        if not disowned(text, match.start(), match.end()):
            return value
    return None


# --- answers the text itself disowns -------------------------------------------------------------------
_CLAUSE_END_RE = re.compile(
    r"(?<!\d)[.!?](?=\s|$)|\n|;|,?\s+(?:but|however|whereas|yet|so|thus|hence|therefore)\b,?", re.IGNORECASE
)

_FILLER = (
    r"(?:(?:equal|equals|exactly|quite|simply|just|really|actually|the|a|an|to|be|is|was|answer|result|value|"
    r"correct|right|final|of)\s+)*"
)
_NEGATED_BEFORE_RE = re.compile(
    r"(?:\bnot|n't|\bnever|\bno\s+longer|\brather\s+than|\binstead\s+of|\bother\s+than|\bexcept(?:\s+for)?)"
    rf"\s+{_FILLER}[$(\[]*\s*$",
    re.IGNORECASE,
)
_NEGATED_AFTER_RE = re.compile(
    r"^[\s$)\]*_]*(?:\?|[,(]?\s*(?:(?:(?:is|was|would\s+be|seems|looks|are)\s+(?:not\b|never\b|wrong|incorrect|false\b|"
    r"invalid|mistaken|a\s+mistake|an\s+error))|isn't|wasn't|wrong\b|incorrect|false\b|invalid|mistaken|erroneous|"
    r"ruled\s+out|rejected)|[\u2717\u2718\u274c])",
    re.IGNORECASE,
)
_SAYING = (
    r"say|says|said|claim|claims|claimed|think|thinks|thought|believe|believes|believed|guess|guesses|guessed|"
    r"answered|write|"
    r"writes|wrote|suggest|suggests|suggested|propose|proposes|proposed|argue|argues|argued|assert|asserts|"
    r"asserted|insist|insists|insisted|expect|expects|expected|assume|assumes|assumed|get|gets|got"
)
_SUBJECT = (
    r"[A-Z][a-z]+|(?i:he|she|they|one|someone|somebody|anyone|everyone|people|others|many|most|students?|"
    r"teachers?|friends?|classmates?|i|we|you)"
)
_ATTRIBUTED_RE = re.compile(
    rf"\b(?!(?i:my|our|your|its|the|this|that|a|an)\b)(?P<subject>{_SUBJECT})\s+(?:(?P<modal>(?i:might|may|would|could|will|should))\s+(?:have\s+)?)?"
    r"(?:(?i:wrongly|mistakenly|incorrectly|often|usually|also|first|initially|naively)\s+)?"
    rf"(?P<verb>(?i:{_SAYING}))\b"
    r"|\b(?!(?i:my|our)\b)(?:[A-Za-z]+'s|(?i:his|her|their))\s+"
    r"(?i:answer|guess|claim|result|value|solution|attempt)\b"
)
_SELF = frozenset("i we you i'd we'd".split())
_PAST_BELIEF = frozenset("thought believed guessed assumed expected".split())
_MISTAKE_RE = re.compile(
    r"\b(?:mistake|mistaken|mistakenly|wrong|wrongly|incorrect|incorrectly|erroneous|error|pitfall|trap|naive|"
    r"naively|careless|tempting)\w*\s+(?:[\w$]+\s+){0,4}[$(\[]*\s*$",
    re.IGNORECASE,
)


def _clause(text: str, start: int, end: int) -> tuple[str, str]:
    """(the text of the clause before `start`, the text after `end` to the clause's end)."""
    lo = max(0, start - 300)
    before = text[lo:start]
    cut = None
    for m in _CLAUSE_END_RE.finditer(before):
        cut = m.end()
    before = before[cut:] if cut is not None else before
    after = text[end : end + 300]
    m = _CLAUSE_END_RE.search(after)
    return before, (after[: m.start() + 1] if m else after)


def disowned(text: str, start: int, end: int) -> bool:
    """Whether the text itself rejects the answer at text[start:end] or gives it as another's: negated
    ("not \\boxed{18}", "rather than", "\\boxed{18} is wrong", a question "\\boxed{18}?"), said or believed
    by someone else or hypothetically ("Tom thinks", "one might say", "Tom's answer", "you might guess"), a
    belief given up ("I thought"), or named a mistake ("a common mistake is to answer"). The clause around
    it decides (up to a sentence end, a semicolon or a "but")."""
    before, after = _clause(text, start, end)
    if _NEGATED_BEFORE_RE.search(before) or _NEGATED_AFTER_RE.match(after) or _MISTAKE_RE.search(before):
        return True
    for m in _ATTRIBUTED_RE.finditer(before):
        between = before[m.end() :]
        if "," in between or len(between.split()) > 8:
            continue  # "Tom said he has 3 boxes, which makes 18": the saying is not about the answer
        subject, verb = (m.group("subject") or "").lower(), (m.group("verb") or "").lower()
        if not verb or m.group("modal") or subject not in _SELF or verb in _PAST_BELIEF:
            return True
    return False


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
    text = _without_phantoms(_without_latex_comments(_without_markup(text)))
    return None if first_unprinted(text) is not None else text


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
            out.extend(_owned_boxes(tag) or [_phrase(tag) or tag.strip()])
        return out
    return (
        _owned_boxes(region)
        or [h.strip() for h in _HASH_RE.findall(region)]
        or [p for p in [_phrase(region)] if p]
    )


def gold_answer(gold: object) -> str:
    """The final answer inside a ground-truth cell: after the last '####', the last \\boxed{}, or all."""
    text = str(gold).strip()
    if "####" in text:
        return text.rsplit("####", 1)[1].strip()
    boxed = _boxed(text)
    return boxed[-1] if boxed else text
