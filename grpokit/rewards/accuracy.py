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

Words after a number: with the prompt (the trainer always gives it), a number may be followed only
by words its question uses, singular or plural ("18 apples"), the currency its currency sign names,
"in total" / "altogether" / "each", and units (time, length, mass, volume, angle, money) of a quantity
the question gives in no unit ("18 years" to "How old is Tom?"); a unit of a quantity the question
measures in another unit states another value ("18 cents" for dollars, "18 km" for metres, "18
minutes" for hours), and so does any other word ("18 doubled", "18 thousandths", "18 dozen"); a percent
("18%", "18 per cent") to a question that speaks of no percent. Without a prompt, any word but those
of _NOT_UNITS. Read as the value they show: "18 (dollars)" as "18 dollars", "eighteen (18)" as 18 (words
that spell another number score 0), a repeating decimal 18.\\overline{3} as 55/3, and a trailing check mark
is dropped.

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
import json
import math
import os
import queue
import re
import select
import subprocess
import sys
import threading
import time
import unicodedata
from collections.abc import Callable
from fractions import Fraction
from functools import lru_cache
from pathlib import Path

from grpokit.rewards._answers import MALFORMED, MAX_ANSWER_CHARS, extract_answers, gold_answer
from grpokit.rewards._text import to_text

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
    r"\s*(?P<pct>%|percent)?(?P<words>(?:\s+[a-z]{2,}){0,4})$",
    re.ASCII | re.IGNORECASE,
)
_NOT_UNITS = frozenset(
    "or and nor not to plus minus times over divided mod hundred hundreds thousand thousands million "
    "millions billion billions trillion dozen dozens squared cubed half halves thirds quarters pi sqrt "
    "doubled tripled quadrupled halved tenths hundredths thousandths millionths score scores "
    "factorial percent more less fewer than about approximately roughly nearly almost around least "
    "most at is are was were if".split()
)


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
    if paren:  # "18 (dollars)" reads "18 dollars"; "eighteen (18)" is 18 when the words say 18
        value, words = paren.group(1), paren.group(2)
        said = number_words(value.lower())
        if said is not None and _DIGITS_RE.fullmatch(words.replace(",", "")):
            s = words if said == int(words.replace(",", "")) else "\x00disagrees"
        elif said is None and re.fullmatch(r"[A-Za-z][A-Za-z ]*", words):
            s = f"{value} {words}"
    return s


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
    """False when `pred` is a number followed by a word that may change its value: with a question,
    any word it does not use (singular or plural); without one, the words of _NOT_UNITS."""
    m = _NUMBER_RE.match(pred)
    if m is None or not m.group("words").strip():
        return True
    words = _WORD_RE.findall(m.group("words").lower())
    if units is None:
        return not any(w in _NOT_UNITS for w in words)
    asked = {UNIT_DIMENSIONS[u] for u in units if u in UNIT_DIMENSIONS}
    for w in words:
        one = singular(w)
        if w in units or one in units or w + "s" in units or w in _NEUTRAL or one in _NEUTRAL:
            continue
        if one in UNIT_DIMENSIONS and UNIT_DIMENSIONS[one] not in asked:
            continue  # "18 years" to "How old is Tom?": a unit of what the question measures in no unit
        return False  # a word the question does not use, or a unit other than the question's (cents for $)
    return True


_NEUTRAL = frozenset("in total altogether all together overall each".split())
"""Trailing words that never change a value, whatever the question."""
UNIT_DIMENSIONS = {
    **dict.fromkeys("second sec minute min hour hr day week month year decade century".split(), "time"),
    **dict.fromkeys(
        "millimeter millimetre mm centimeter centimetre cm meter metre m kilometer kilometre km inch foot ft "
        "yard yd mile mi".split(),
        "length",
    ),
    **dict.fromkeys("milligram mg gram g kilogram kg lb ounce oz ton tonne".split(), "mass"),
    **dict.fromkeys(
        "milliliter millilitre ml liter litre l gallon quart pint cup teaspoon tablespoon".split(), "volume"
    ),
    **dict.fromkeys("degree radian".split(), "angle"),
    **dict.fromkeys("dollar cent penny nickel dime euro pound yen rupee".split(), "money"),
}
"""Units by what they measure (singular). A number may be followed by a unit its question uses, or by any
unit of a quantity the question gives in no unit; a unit of the same quantity that the question does not
use states another value ("18 cents" for dollars, "18 km" for metres, "18 minutes" for hours)."""
_IRREGULAR = {"feet": "foot", "inches": "inch", "pennies": "penny", "centuries": "century"}


def singular(word: str) -> str:
    if word in _IRREGULAR:
        return _IRREGULAR[word]
    if word.endswith(("ches", "shes", "xes")):
        return word[:-2]
    return word[:-1] if word.endswith("s") and not word.endswith("ss") and len(word) > 2 else word


_CURRENCY_SIGNS = {"$": "dollar", "€": "euro", "£": "pound", "¥": "yen", "₹": "rupee"}


def question_units(prompt: object) -> frozenset[str] | None:
    """The words a number may be followed by in an answer to `prompt`: its own words (and their singular
    forms), the currency its currency sign names, "%" when it speaks of percent; minus the words that
    change a value. None without a prompt."""
    text = to_text(prompt).lower()
    if not text:
        return None
    found = _WORD_RE.findall(text)
    words = (set(found) | {singular(w) for w in found}) - _NOT_UNITS
    words |= {unit for sign, unit in _CURRENCY_SIGNS.items() if sign in text}
    if "%" in text or re.search(r"\bper\s?cent|\bpercent", text):
        words.add("%")
    return frozenset(words)


def _exact_values(pred: str, gold: str) -> tuple | None:
    """When exactly one side is a plain number: (which side, its accepted values as (num, den)) so
    the worker compares the other side with them exactly (decimals are never approximations)."""
    p, g = _plain_number(pred), _plain_number(gold)
    if (p is None) == (g is None):
        return None
    side, (value, pct) = ("pred", p) if p is not None else ("gold", g)
    values = [value, value / 100] if pct else [value]
    return side, tuple((v.numerator, v.denominator) for v in values)


# --- math-verify in worker processes ---------------------------------------------------------------
class VerifierPool:
    """A few long-lived `_math_worker` processes, each answering one (gold, pred) at a time.

    Thread-safe; usable from any thread (no signals in this process). A worker that misses its
    deadline is killed and replaced, and that item counts as incorrect.
    """

    def __init__(self, workers: int | None = None):
        self.workers = workers or max(1, min(4, os.cpu_count() or 1))
        self._idle: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._live = 0
        self.timeouts = 0

    def _spawn(self) -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, "-B", str(Path(__file__).with_name("_math_worker.py"))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            bufsize=1,
        )
        if self._readline(proc, 60.0) != "@ready":
            proc.kill()
            raise RuntimeError("math-verify worker failed to start (is math-verify installed?)")
        return proc

    def warm(self, starting: Callable[[], None] | None = None) -> None:
        """Start one worker now unless one is live, so that the first answer math-verify must read does
        not wait for its start (1-2 s on an idle core, 10 s and more under load). `starting()` is
        called just before a start (RewardRunner's workers then stop the completion's budget)."""
        with self._lock:
            if self._live > 0:
                return
            self._live += 1
        if starting is not None:
            starting()
        try:
            proc = self._spawn()
        except BaseException:
            with self._lock:
                self._live -= 1
            raise
        self._idle.put(proc)

    def _checkout(self) -> subprocess.Popen:
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            pass
        with self._lock:
            spawn = self._live < self.workers
            if spawn:
                self._live += 1
        if not spawn:
            return self._idle.get()
        try:
            return self._spawn()
        except BaseException:
            with self._lock:
                self._live -= 1
            raise

    @staticmethod
    def _readline(proc: subprocess.Popen, timeout: float) -> str | None:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([proc.stdout], [], [], left)
            if ready:
                line = proc.stdout.readline()
                if not line:
                    return None
                if line.startswith("@"):
                    return line.strip()

    def verify(self, groups: list[list[tuple[str, str, tuple | None]]], timeout_s: float) -> list[bool]:
        """For each group (one completion's items), whether verify(gold, pred) holds for all its
        (gold, pred, exact) items; `exact` is None or _exact_values(): compare the other side exactly
        with those rational values. Groups run in parallel over the workers, the items of a group one
        after the other within ONE budget for the group, budget_s(timeout_s): past it the group is
        False (counted in `timeouts`) and its worker is replaced. A group stops at its first False."""
        results = [False] * len(groups)
        todo = iter(range(len(groups)))
        lock = threading.Lock()
        errors: list[BaseException] = []
        budget = budget_s(timeout_s)

        def work() -> None:
            proc = None
            try:
                while True:
                    with lock:
                        g = next(todo, None)
                    if g is None:
                        return
                    left, ok = budget, True  # time spent waiting for answers (not starting workers)
                    for gold, pred, exact in groups[g]:
                        if proc is None:
                            proc = self._checkout()
                        request = {"gold": gold, "pred": pred, "timeout_s": timeout_s, "exact": exact}
                        proc.stdin.write(json.dumps(request) + "\n")
                        proc.stdin.flush()
                        asked = time.monotonic()
                        reply = self._readline(proc, left)
                        left -= time.monotonic() - asked
                        if reply is None:  # stuck or dead: replace it
                            self.timeouts += 1
                            proc.kill()
                            proc.wait()
                            proc = None
                            with self._lock:
                                self._live -= 1
                        if reply != "@1":
                            ok = False
                            break
                    results[g] = ok
            except BaseException as e:
                errors.append(e)
            finally:
                if proc is not None:
                    self._idle.put(proc)

        threads = [threading.Thread(target=work, daemon=True) for _ in range(min(self.workers, len(groups)))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return results


def budget_s(timeout_s: float) -> float:
    """math-verify's time for one completion, all its answers together (gold parse + pred parse + verify)."""
    return 2 * max(1, math.ceil(timeout_s)) + 2.0


_POOL: VerifierPool | None = None
_POOL_LOCK = threading.Lock()
_POOL_WORKERS: int | None = None  # None: VerifierPool's default; 1 in a forked child


def _pool() -> VerifierPool:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = VerifierPool(_POOL_WORKERS)
        return _POOL


def _forget_pool_in_child() -> None:
    """A forked child (the reward runner's workers) starts its own math-verify workers: sharing the
    parent's pipes would interleave two processes' requests and replies. One: the runner already
    spreads completions over its workers, and its warm_up starts one (a second would start, cold,
    inside a completion's budget)."""
    global _POOL, _POOL_LOCK, _POOL_WORKERS
    _POOL, _POOL_LOCK, _POOL_WORKERS = None, threading.Lock(), 1


os.register_at_fork(after_in_child=_forget_pool_in_child)


def _warm_up(starting: Callable[[], None]) -> None:
    """math_accuracy's warm_up hook (see grpokit.rewards._workers): this process's math-verify worker
    started before a completion's budget runs; a no-op once one is live."""
    _pool().warm(starting)


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
        for key, ok in zip(keys, _pool().verify([list(k) for k in keys], timeout_s)):
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
    math_accuracy.warm_up = _warm_up  # RewardRunner's workers: math-verify starts outside any budget
    math_accuracy.chunked = True  # RewardRunner: several completions per call, still one budget each
    math_accuracy.columns = (
        answer_column,
    )  # checked in the data before the model loads (grpokit.data.prompts)
    return math_accuracy


math_accuracy = make_math_accuracy()
