"""`math_accuracy`: is the completion's final answer mathematically equal to the ground truth?

Which answer is graded: the visible final answer, never the reasoning, code or hidden text (see
`_answers.py`: <answer> blocks, else \\boxed{}, else "#### n", else the last answer marker such as
"The final answer is 18" or "**Answer:** 18"). Every candidate found at the chosen level must be
correct: \\boxed{17} ... \\boxed{18} scores 0. More than 8 distinct candidates, or one longer than
1,000 characters, scores 0. An equation is graded by its last side when every other side is a
variable name (`x = 18`, `a_1 = 18`, `f(2) = 18`) or plain arithmetic of the same value (`9 * 2 = 18`,
`x = 2 \\cdot 9 = 18`); any other equation (`17 = 18`, `2 \\cdot 8 = 18`) scores 0 unless the ground
truth is itself an equation. So does any other relation, LaTeX (`\\approx`, `\\le`, `\\lesssim`, `\\to`,
any command of that kind) or Unicode (every mathematical relation or arrow character: ≈ ≃ ≤ ≪ ⊂ →),
unless the ground truth has one; a number with a subscript or a prime mark (`18_8`, `18'`) the ground
truth lacks; and an ellipsis (`18\\ldots`, `18...`): they state another value.

Words after a number (`_units.py`): with the prompt (the trainer always gives it), a number may be
followed by the unit the question asks for ("How many minutes ...": "120 minutes" or "120 min", never "120
hours", even where the question mentions hours), else a unit the question uses or a unit of a quantity it
gives in no unit ("18 years" to "How old is Tom?"), a rate in the unit the question asks ("$18 per day",
"$18 a day", "$18/day" to "How much does he earn each day?"), words its question uses, singular or plural
("18 apples"), the currency its currency sign names, and "in total" / "altogether" / "each"; any other
word states another value ("18 doubled", "18 thousandths", "18 dozen"), and so does a percent ("18%", "18
per cent") to a question that speaks of no percent. A unit written right after a box is the box's
("\\boxed{120} hours"), and one glued to its number is read apart ("18cm"). Without a prompt, any word but
those of NOT_UNITS. Read as the value they show: "18 (dollars)" as "18 dollars", "eighteen (18)" and "18
(eighteen)" as 18 (words that spell another number score 0), a repeating decimal 18.\\overline{3} as 55/3,
and a trailing check mark is dropped. A gold of several values (the roots "2, 3") is matched by the same
values in any order, joined by commas, "or" or "and", each alone or as "x = 2" (`several_values`).

Equivalence: an exact match after light normalisation (done once), then an exact rational
comparison when both sides are plain numbers (thousands separators, decimals, a/b and
\\frac{a}{b}, %, a currency sign, trailing words such as "dollars" or "in total"; "18 million" or
"18 or 19" are not plain numbers), and otherwise math-verify (LaTeX, matrices, sets, intervals,
symbolic equality) in worker processes, with one budget per completion for all its answers
together (`budget_s`): a completion past it scores 0, and no other completion waits for it.

Decimals are exact numbers, never approximations, on every path: a decimal answer equals the gold
only if it is the same rational number (0.5 = \\frac{1}{2}, 18.0 = 18), so 0.333 is not 1/3 and
1.41421356 is not \\sqrt{2}; a decimal gold is matched the same way (\\frac{\\sqrt{2}}{2} is not
0.7071). Percent: "p%" matches a gold of p or of p/100 (40% for 40 or 0.4), and a gold "p%" is
matched by p, p% or p/100. Answers written with non-ASCII digits (fullwidth "１８", Arabic-Indic
"١٨", mathematical bold "𝟏𝟖") are deliberately *not* normalised and score 0: the policy should
write what the dataset writes, and look-alike digits are a known way to confuse checkers.

Ground truth: the `answer` column, a bare value ("18", "\\frac{1}{2}") or a full solution ending in
"#### 18" (GSM8K) or containing \\boxed{} (MATH). A missing ground truth (None or "") gives None.
"""

from __future__ import annotations

import ast
import math
import re
import unicodedata
from fractions import Fraction
from functools import lru_cache

from grpokit.rewards._answers import MALFORMED, MAX_ANSWER_CHARS, extract_answers, gold_answer
from grpokit.rewards._units import NOT_UNITS, question_units, spaced_units, words_allowed
from grpokit.rewards._verify_pool import shared_pool, warm_up
from grpokit.scoring.completions import to_text

__all__ = [
    "MALFORMED",
    "extract_answers",
    "gold_answer",
    "make_math_accuracy",
    "math_accuracy",
    "score_answers",
]
MAX_CANDIDATES = 8


# --- normalisation and the exact fast path --------------------------------------------------------
_WRAPPERS = re.compile(r"\\(?:text|textbf|mathrm|mathbf|textup|operatorname)\s*\{([^{}]*)\}")
# A LaTeX space ("\\ ", "\\,", "\\quad", "~") becomes " "; the row separator "\\\\" is matched
# first so that the "\\ " inside "\\\\ " (a matrix row break then a space) stays a row break.
_SPACES = re.compile(r"\\\\|\\[,!;: ]|\\q?quad|~")
_NUMBER_RE = re.compile(
    r"^(?P<sign>[-+]?)\s*(?:\\?\$|€|£)?\s*(?P<sign2>[-+]?)"
    r"(?P<num>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d{1,3}(?: \d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+|\d+\s*/\s*\d+|\\[dt]?frac\{\d+\}\{\d+\})"
    r"\s*(?P<pct>%|percent)?(?P<words>(?:\s+(?:[a-z]{2,}|[mglsh]\b)){0,4})$",
    re.ASCII | re.IGNORECASE,
)
_NOT_UNITS = NOT_UNITS


def _has_foreign_digits(s: str) -> bool:
    return any(not c.isascii() and unicodedata.category(c) == "Nd" for c in s)


@lru_cache(maxsize=65536)
def normalize(s: str) -> str:
    s = s.strip().replace("\u2212", "-")
    for left, right in (("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"), ("**", "**")):
        if len(s) >= 2 * len(left) and s.startswith(left) and s.endswith(right):
            s = s[len(left) : -len(right)].strip()
    s = _WRAPPERS.sub(r"\1", s)
    s = (
        _SPACES.sub(lambda m: m.group(0) if m.group(0) == "\\\\" else " ", s.replace(",\\!", ","))
        .replace("{,}", ",")
        .replace("\\%", "%")
        .replace("\\left", "")
        .replace("\\right", "")
    )
    s = (
        s.replace("\\dfrac", "\\frac")
        .replace("\\tfrac", "\\frac")
        .replace("^\\circ", "")
        .replace("^{\\circ}", "")
    )
    s = re.sub(r"\s+", " ", s).strip()
    s = s if s.endswith("...") else s.rstrip(".").strip()  # a sentence's full stop, not an ellipsis
    s = _CHECK_MARK_RE.sub("", s).strip()  # "18 ✓": a tick after the answer is not part of it
    s = _PER_CENT_RE.sub("%", s)  # "18 per cent", "18 percent", "18 pct"
    s = _REPEATING_RE.sub(_repeating_fraction, s)  # 18.\overline{3} = \frac{165}{9}
    paren = _PAREN_WORDS_RE.match(s)
    if paren:  # "18 (dollars)" is "18 dollars"; "eighteen (18)", "18 (eighteen)" are 18 when both say 18
        value, words = paren.group(1), paren.group(2)
        said = number_words(value.lower())
        spelled = number_words(words.lower().replace("-", " "))
        if said is not None and _DIGITS_RE.fullmatch(words.replace(",", "")):
            s = words if said == int(words.replace(",", "")) else "\x00disagrees"
        elif spelled is not None and _DIGITS_RE.fullmatch(value.replace(",", "")):
            s = value if spelled == int(value.replace(",", "")) else "\x00disagrees"
        elif said is None and re.fullmatch(r"[A-Za-z][A-Za-z ]*", words):
            s = f"{value} {words}"
    return spaced_units(s)


_CHECK_MARK_RE = re.compile(r"(?:\s*(?:[\u2713\u2714\u2611\u2705]|\\checkmark\b))+$")
_PER_CENT_RE = re.compile(r"(?<=[0-9}])\s*(?:per[\s-]?cent|percent|pct)\b\.?", re.IGNORECASE)
_REPEATING_RE = re.compile(r"(?<![\d.])(\d+)\.(\d*)\\overline\s*\{(\d+)\}")
_PAREN_WORDS_RE = re.compile(r"^(.*?\S)\s*\(\s*([^()]+?)\s*\)$")
_DIGITS_RE = re.compile(r"\d+")


def _repeating_fraction(m: re.Match) -> str:
    whole, fixed, repeat = m.group(1), m.group(2), m.group(3)
    numerator = int(whole + fixed + repeat) - int(whole + fixed)
    denominator = 10 ** len(fixed) * (10 ** len(repeat) - 1)
    return f"\\frac{{{numerator}}}{{{denominator}}}"


_ONES = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen".split()
_TENS = "twenty thirty forty fifty sixty seventy eighty ninety".split()


def number_words(text: str) -> int | None:
    """The integer English words spell ("eighteen", "two hundred and five", "forty-two"), None otherwise."""
    words = text.replace("-", " ").replace(",", " ").split()
    if not words or len(words) > 12:
        return None
    total, current = 0, 0
    for w in words:
        if w in _ONES:
            current += _ONES.index(w)
        elif w in _TENS:
            current += 10 * (_TENS.index(w) + 2)
        elif w == "hundred" and current:
            current *= 100
        elif w in ("thousand", "million") and current:
            total += current * (1000 if w == "thousand" else 1_000_000)
            current = 0
        elif w == "and":
            continue
        else:
            return None
    return total + current


def as_number(s: str) -> tuple[Fraction, bool] | None:
    """(value, is_percent) when `s` is a plain number, else None. Exact: no floats involved."""
    return _plain_number(normalize(s))


@lru_cache(maxsize=65536)
def _plain_number(s: str) -> tuple[Fraction, bool] | None:
    """as_number of an already normalised string."""
    m = _NUMBER_RE.match(s)
    if m is None or any(w in _NOT_UNITS for w in m.group("words").lower().split()):
        return None
    if m.group("sign") and m.group("sign2"):
        return None
    num = m.group("num").replace(",", "").replace(" ", "") if "/" not in m.group("num") else m.group("num")
    frac = re.match(r"\\[dt]?frac\{(\d+)\}\{(\d+)\}$|(\d+)\s*/\s*(\d+)$", num)
    if frac:
        a, b = (frac.group(1), frac.group(2)) if frac.group(1) else (frac.group(3), frac.group(4))
        if int(b) == 0:
            return None
        value = Fraction(int(a), int(b))
    else:
        value = Fraction(num)
    if "-" in (m.group("sign") + m.group("sign2")):
        value = -value
    return value, m.group("pct") is not None


def numbers_equal(pred: tuple[Fraction, bool], gold: tuple[Fraction, bool]) -> bool:
    (p, p_pct), (g, g_pct) = pred, gold
    if p == g:
        return True
    if p_pct and not g_pct:  # "50%" for 0.5
        return p / 100 == g
    if g_pct and not p_pct:  # "0.5" for 50%
        return p == g / 100
    return False


_VARIABLE_RE = re.compile(r"(?:[A-Za-z]+|\\[A-Za-z]+)(?:_\{?[A-Za-z0-9]+\}?)?(?:\([^()=]*\))?")
_RELATION_WORDS = (
    "EQUAL", "LESS-THAN", "GREATER-THAN", "LESS THAN", "GREATER THAN", "TILDE", "EQUIVALENT", "ASYMPTOTIC",
    "SUBSET", "SUPERSET", "ELEMENT OF", "CONTAINS AS MEMBER", "ARROW", "PROPORTIONAL", "APPROXIMATELY",
    "IDENTICAL", "PRECEDES", "SUCCEEDS", "ALMOST", "MUCH", "CORRESPONDS", "ESTIMATES", "DIVIDES",
)  # fmt: skip
_RELATION_CHARS = "".join(
    sorted(
        c
        for c in map(chr, range(0x2190, 0x2C00))
        if unicodedata.category(c) == "Sm" and any(w in unicodedata.name(c, "") for w in _RELATION_WORDS)
    )
)
"""Every Unicode mathematical relation and arrow (≈ ≃ ≅ ≡ ≠ ≤ ≲ ≪ ⊂ ∈ → ⇒ ...), from the characters' names."""
_RELATION_RE = re.compile(
    r"\\(?:[a-zA-Z]*(?:eq|sim|approx|arrow|less|gtr)[a-zA-Z]*|ne|le|ge|lt|gt|ll|gg|lll|ggg|prec|succ|asymp|"
    r"cong|propto|to|gets|implies|impliedby|iff|mapsto|in|ni|owns|notin|subset|supset|sqsubset|sqsupset|"
    r"models|vdash|dashv|perp|parallel|mid|nmid|divides|leqslant|geqslant)(?![A-Za-z])"
    rf"|[<>{re.escape(_RELATION_CHARS)}]|!="
)
_ELLIPSIS_RE = re.compile(r"\\(?:ldots|dots|cdots|dotsc|dotsb|dotso|vdots|ddots)(?![A-Za-z])|…|\.\.\.")
_MARKED_NUMBER_RE = re.compile(r"[0-9}]\s*(?:_|'|′|″|\^\s*\{?\s*\\prime)")
"""A number with a subscript (a base: 18_8, 18_{10}) or a prime mark (18', 18^\\prime): another value."""


def answer_side(pred: str, gold: str) -> str | None:
    """`pred` (normalised) without a leading "name =", or None when it cannot be the gold's kind of
    answer: an equation of another kind ("17 = 18"), a relation other than "=" (≈, <, \\le, \\to,
    ...) unless the gold has one too, or a number with a subscript or prime mark the gold lacks."""
    if _RELATION_RE.search(pred) and not _RELATION_RE.search(gold):
        return None
    if _MARKED_NUMBER_RE.search(pred) and not _MARKED_NUMBER_RE.search(gold):
        return None
    if _ELLIPSIS_RE.search(pred) and not _ELLIPSIS_RE.search(gold):  # 18\ldots, 18...: not a value
        return None
    if "=" not in pred or "=" in gold:
        return pred
    *lhs, rhs = pred.split("=")
    rhs = rhs.strip()
    if not rhs:
        return None
    value = _arithmetic(rhs)
    for part in lhs:  # x = 18, f(2) = 18, 9 * 2 = 18, 9 * 2 = x = 18: every side states the same value
        part = part.strip()
        if _VARIABLE_RE.fullmatch(part):
            continue
        computed = _arithmetic(part)
        if computed is None or value is None or computed != value:
            return None
    return rhs


_ARITHMETIC_RE = re.compile(r"[0-9.+\-*/() ]+")


def _arithmetic(text: str) -> Fraction | None:
    """The exact value of a plain arithmetic expression (numbers, + - * / × · ÷, \\times, \\cdot, \\div,
    \\frac{a}{b}, parentheses), None for anything else."""
    text = re.sub(r"\\[dt]?frac\{([^{}]+)\}\{([^{}]+)\}", r"((\1)/(\2))", text)
    for a, b in (("\\times", "*"), ("\\cdot", "*"), ("\\div", "/"), ("×", "*"), ("·", "*"), ("÷", "/")):
        text = text.replace(a, b)
    text = text.replace("{", "(").replace("}", ")").replace(",", "")
    if len(text) > 200 or not _ARITHMETIC_RE.fullmatch(text) or "**" in text:
        return None
    try:
        return _evaluate(ast.parse(text, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError):
        return None


def _evaluate(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return Fraction(str(node.value))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div)):
        a, b = _evaluate(node.left), _evaluate(node.right)
        ops = {ast.Add: a.__add__, ast.Sub: a.__sub__, ast.Mult: a.__mul__, ast.Div: a.__truediv__}
        return ops[type(node.op)](b)
    raise ValueError("not arithmetic")


def quick_verdict(pred: str, gold: str, units: frozenset[str] | None = None) -> bool | None:
    """True/False when decidable without math-verify, None to ask it. Both already normalised.
    `units`: the words a plain number may be followed by (the question's words); None: any word but
    those that change a value (_NOT_UNITS)."""
    if _has_foreign_digits(pred):
        return False
    if pred == gold and gold:
        return True
    if not _words_allowed(pred, units):  # "18 doubled", "18 thousandths": another value
        return False
    p, g = _plain_number(pred), _plain_number(gold)
    if p is not None and g is not None:
        if p[1] and not g[1] and units is not None and "%" not in units:
            return False  # "18%" / "18 per cent" to a question that speaks of no percent: another value
        return numbers_equal(p, g)
    return None


_WORD_RE = re.compile(r"[a-z]+")


def _words_allowed(pred: str, units: frozenset[str] | None) -> bool:
    """False when `pred` is a number followed by words that may change its value (see `_units.py`)."""
    m = _NUMBER_RE.match(pred)
    if m is None or not m.group("words").strip():
        return True
    return words_allowed(_WORD_RE.findall(m.group("words").lower()), units)


_SEVERAL_RE = re.compile(r"\s*(?:,|;|\bor\b|\band\b)\s*")
_NAMED_VALUE_RE = re.compile(r"^[A-Za-z](?:_\{?\w+\}?)?\s*=\s*")


def _values(s: str) -> list[str] | None:
    """The values of a list of alternatives ("2, 3", "2 or 3", "x = 2 or x = 3", "\\{2, 3\\}"), each without
    its "x =", None for one value (a thousands separator does not split one: "1,000") or a tuple "(2, 3)"."""
    s = s.strip()
    if s.startswith("\\{") and s.endswith("\\}"):
        s = s[2:-2]
    elif s[:1] in "([" or _plain_number(s) is not None:
        return None
    parts = [part for part in _SEVERAL_RE.split(s) if part.strip()]
    return [_NAMED_VALUE_RE.sub("", part).strip() for part in parts] if len(parts) > 1 else None


def several_values(pred: str, gold: str) -> bool | None:
    """For a gold of several values (the roots of an equation, "2, 3"), whether `pred` states the same
    values in any order and in any of the ways of `_values` ("x = 3 or x = 2"); None when the gold is one
    value, or a value is not a plain number (math-verify decides)."""
    golds = _values(gold)
    preds = _values(pred) if golds is not None else None
    if golds is None or preds is None:
        return None
    p, g = [_plain_number(v) for v in preds], [_plain_number(v) for v in golds]
    if None in p or None in g:
        return None
    return sorted(v for v, _ in p) == sorted(v for v, _ in g)


def _exact_values(pred: str, gold: str) -> tuple | None:
    """When exactly one side is a plain number: (which side, its accepted values as (num, den)) so
    the worker compares the other side with them exactly (decimals are never approximations)."""
    p, g = _plain_number(pred), _plain_number(gold)
    if (p is None) == (g is None):
        return None
    side, (value, pct) = ("pred", p) if p is not None else ("gold", g)
    values = [value, value / 100] if pct else [value]
    return side, tuple((v.numerator, v.denominator) for v in values)


def _latex_gold(gold: str) -> str:
    return gold if "$" in gold or "\\boxed" in gold else f"${gold}$"


def score_answers(
    completions: list[str], golds: list[object], timeout_s: float = 2.0, prompts: list | None = None
) -> list[float | None]:
    """1.0/0.0 per completion (None where the ground truth is missing). Never raises on odd input.
    With `prompts`, a plain number may be followed only by words of its question ("18 apples")."""
    scores: list[float | None] = [None] * len(completions)
    groups: dict[
        tuple, list[int]
    ] = {}  # one completion's math-verify items -> the completions that have them
    for i, (completion, gold) in enumerate(zip(completions, golds)):
        if gold is None or (isinstance(gold, float) and math.isnan(gold)) or not str(gold).strip():
            continue
        try:
            raw_gold = gold_answer(gold)  # math-verify reads it raw: it knows \\text{} units, for one
            g = normalize(raw_gold)
            cands = list(dict.fromkeys(normalize(c) for c in extract_answers(completion)))
            units = question_units(prompts[i]) if prompts is not None else None
        except Exception:
            scores[i] = 0.0
            continue
        if (
            not cands
            or len(cands) > MAX_CANDIDATES
            or any(len(c) > MAX_ANSWER_CHARS or "\x00" in c for c in cands)
        ):
            scores[i] = 0.0
            continue
        keys = []
        for c in cands:
            v = several_values(c, g)
            if v is None:
                c = answer_side(c, g)
                v = False if c is None else quick_verdict(c, g, units)
            if v is False:  # already wrong: math-verify need not see its other candidates
                scores[i] = 0.0
                break
            if v is None:
                keys.append((_latex_gold(raw_gold), "\\boxed{" + c + "}", _exact_values(c, g)))
        if scores[i] is None:
            if keys:
                groups.setdefault(tuple(keys), []).append(i)
            else:
                scores[i] = 1.0
    if groups:
        keys = list(groups)
        for key, ok in zip(keys, shared_pool().verify([list(k) for k in keys], timeout_s)):
            for i in groups[key]:
                scores[i] = 1.0 if ok else 0.0
    return scores


def make_math_accuracy(answer_column: str = "answer", timeout_s: float = 2.0):
    """A `math_accuracy` reading the ground truth from `answer_column`; math-verify's limit per step is
    timeout_s, and one completion's answers together get budget_s(timeout_s)."""

    def math_accuracy(prompts: list, completions: list, **columns) -> list[float | None]:
        if answer_column not in columns:
            raise KeyError(
                f"math_accuracy needs the ground truth in column {answer_column!r}; got {sorted(columns)}"
            )
        texts = [to_text(c) for c in completions]
        return score_answers(texts, list(columns[answer_column]), timeout_s, prompts)

    math_accuracy.per_completion = True  # RewardRunner: one time budget per completion, not per batch
    math_accuracy.warm_up = warm_up  # RewardRunner's workers: math-verify starts outside any budget
    math_accuracy.chunked = True  # RewardRunner: several completions per call, still one budget each
    math_accuracy.columns = (
        answer_column,
    )  # checked in the data before the model loads (grpokit.data.prompts)
    return math_accuracy


math_accuracy = make_math_accuracy()
