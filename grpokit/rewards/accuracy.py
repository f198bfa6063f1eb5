"""`math_accuracy`: is the completion's final answer mathematically equal to the ground truth?

Which answer is graded (the reasoning never is):
  1. reasoning is removed first: everything up to the last </think> (whether <think> is in the
     completion or was opened by the chat template), and an unclosed <think> to the end;
  2. code is removed next: fenced blocks (```...```, an unclosed fence to the end) and inline
     `...` spans, so an <answer> or \\boxed{} written inside code never counts;
  3. if <answer>...</answer> blocks remain, only they are graded (a \\boxed{} inside one wins over
     its bare text); answer tags that nest or do not pair up score 0;
  4. else every \\boxed{} / \\fbox{}; else every GSM8K "#### n"; else the last "the answer is ...".
Every candidate found at the chosen level must be correct: \\boxed{17} ... \\boxed{18} scores 0.
More than 8 distinct candidates, or one longer than 1,000 characters, scores 0. An equation is
graded by its right-hand side only when its left-hand side is a variable name (`x = 18`,
`a_1 = 18`, `f(2) = 18`); any other equation (`17 = 18`, `2+3 = 5`) scores 0 unless the ground
truth is itself an equation.

Equivalence: an exact match after light normalisation (done once), then an exact rational
comparison when both sides are plain numbers (thousands separators, decimals, a/b and
\\frac{a}{b}, %, a currency sign, trailing words such as "dollars" or "in total"; "18 million" or
"18 or 19" are not plain numbers), and otherwise math-verify (LaTeX, matrices, sets, intervals,
symbolic equality) in worker processes with a per-item time limit.

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
from fractions import Fraction
from functools import lru_cache
from pathlib import Path

from grpokit.rewards._text import tag_blocks, to_text

MAX_ANSWER_CHARS = 1000
MAX_CANDIDATES = 8
_HASH_RE = re.compile(r"####[ \t]*([^\n]*)")
_PHRASE_RE = re.compile(r"answer\s*(?:is|:)\s*:?", re.IGNORECASE)
_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*")


# --- extraction -----------------------------------------------------------------------------------
def _boxed(text: str) -> list[str]:
    out = []
    for m in _BOX_RE.finditer(text):
        i = m.end()
        if i < len(text) and text[i] == "{":
            depth, j, end = 0, i, min(len(text), i + MAX_ANSWER_CHARS + 2)
            while j < end:
                c = text[j]
                if c == "{":
                    depth += 1
                elif c == "}":
                    depth -= 1
                    if depth == 0:
                        break
                j += 1
            out.append(text[i + 1 : j] if depth == 0 and j < end else "\x00unbalanced")
        else:  # "\boxed 5"
            token = re.match(r"[^\s$]+", text[i : i + 100])
            out.append(token.group(0) if token else "")
        if len(out) > 4 * MAX_CANDIDATES:
            break
    return out


def _phrase(text: str) -> str | None:
    matches = list(_PHRASE_RE.finditer(text))
    if not matches:
        return None
    last = matches[-1]
    if last is None:
        return None
    rest = text[last.end() : last.end() + 300].strip().split("\n", 1)[0]
    rest = re.split(r"\.\s", rest, maxsplit=1)[0]
    return rest.strip().rstrip(".").strip()


_INLINE_CODE_RE = re.compile(r"`[^`\n]*`")
MALFORMED = "\x00malformed"
"""The candidate returned for a completion whose answer cannot be graded (scores 0)."""


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


def _graded_region(text: str) -> str:
    if "</think>" in text:  # everything up to the last </think> is reasoning (maybe opened by the template)
        text = text.rsplit("</think>", 1)[1]
    if "<think>" in text:  # unclosed: everything after it is reasoning
        text = text.split("<think>", 1)[0]
    return _without_code(text)


def extract_answers(completion: str) -> list[str]:
    """Every final-answer candidate of the completion at the highest level present (see module doc);
    [MALFORMED] when its answer tags nest or do not pair up."""
    region = _graded_region(completion)
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


# --- normalisation and the exact fast path --------------------------------------------------------
_WRAPPERS = re.compile(r"\\(?:text|textbf|mathrm|mathbf|textup|operatorname)\s*\{([^{}]*)\}")
# A LaTeX space ("\\ ", "\\,", "\\quad", "~") becomes " "; the row separator "\\\\" is matched
# first so that the "\\ " inside "\\\\ " (a matrix row break then a space) stays a row break.
_SPACES = re.compile(r"\\\\|\\[,!;: ]|\\q?quad|~")
_NUMBER_RE = re.compile(
    r"^(?P<sign>[-+]?)\s*(?:\\?\$|€|£)?\s*(?P<sign2>[-+]?)"
    r"(?P<num>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+|\d+\s*/\s*\d+|\\[dt]?frac\{\d+\}\{\d+\})"
    r"\s*(?P<pct>%|percent)?(?P<words>(?:\s+[a-z]{2,}){0,4})$",
    re.ASCII | re.IGNORECASE,
)
_NOT_UNITS = frozenset(
    "or and nor not to plus minus times over divided mod hundred hundreds thousand thousands million "
    "millions billion billions trillion dozen dozens squared cubed half halves thirds quarters pi sqrt "
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
        _SPACES.sub(lambda m: m.group(0) if m.group(0) == "\\\\" else " ", s)
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
    s = re.sub(r"\s+", " ", s).strip().rstrip(".").strip()
    return s


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
    num = m.group("num").replace(",", "")
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


def answer_side(pred: str, gold: str) -> str | None:
    """`pred` (normalised) without a leading "name =", or None when it is an equation of another kind
    ("17 = 18"). Left unchanged when the gold (normalised) is itself an equation."""
    if "=" not in pred or "=" in gold:
        return pred
    *lhs, rhs = pred.split("=")
    if rhs.strip() and all(_VARIABLE_RE.fullmatch(part.strip()) for part in lhs):
        return rhs.strip()
    return None


def quick_verdict(pred: str, gold: str) -> bool | None:
    """True/False when decidable without math-verify, None to ask it. Both already normalised."""
    if _has_foreign_digits(pred):
        return False
    if pred == gold and gold:
        return True
    p, g = _plain_number(pred), _plain_number(gold)
    if p is not None and g is not None:
        return numbers_equal(p, g)
    return None


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

    def verify(self, pairs: list[tuple[str, str, tuple | None]], timeout_s: float) -> list[bool]:
        """verify(gold, pred) for each (gold, pred, exact) item, in parallel over the workers; `exact`
        is None or _exact_values(): compare the other side exactly with those rational values."""
        results = [False] * len(pairs)
        todo = iter(range(len(pairs)))
        lock = threading.Lock()
        errors: list[BaseException] = []
        deadline = 2 * max(1, math.ceil(timeout_s)) + 2.0  # gold parse + pred parse + verify

        def work() -> None:
            proc = None
            try:
                while True:
                    with lock:
                        i = next(todo, None)
                    if i is None:
                        return
                    if proc is None:
                        proc = self._checkout()
                    gold, pred, exact = pairs[i]
                    request = {"gold": gold, "pred": pred, "timeout_s": timeout_s, "exact": exact}
                    proc.stdin.write(json.dumps(request) + "\n")
                    proc.stdin.flush()
                    reply = self._readline(proc, deadline)
                    if reply is None:  # stuck or dead: replace it
                        self.timeouts += 1
                        proc.kill()
                        proc.wait()
                        proc = None
                        with self._lock:
                            self._live -= 1
                    else:
                        results[i] = reply == "@1"
            except BaseException as e:
                errors.append(e)
            finally:
                if proc is not None:
                    self._idle.put(proc)

        threads = [threading.Thread(target=work, daemon=True) for _ in range(min(self.workers, len(pairs)))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return results


_POOL: VerifierPool | None = None
_POOL_LOCK = threading.Lock()


def _pool() -> VerifierPool:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = VerifierPool()
        return _POOL


def _forget_pool_in_child() -> None:
    """A forked child (the reward runner's workers) starts its own math-verify workers: sharing the
    parent's pipes would interleave two processes' requests and replies."""
    global _POOL, _POOL_LOCK
    _POOL, _POOL_LOCK = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_pool_in_child)


def _latex_gold(gold: str) -> str:
    return gold if "$" in gold or "\\boxed" in gold else f"${gold}$"


def score_answers(completions: list[str], golds: list[object], timeout_s: float = 2.0) -> list[float | None]:
    """1.0/0.0 per completion (None where the ground truth is missing). Never raises on odd input."""
    scores: list[float | None] = [None] * len(completions)
    pending: dict[tuple[str, str, tuple | None], list[int]] = {}
    verdicts: list[list[bool | None]] = [[] for _ in completions]
    for i, (completion, gold) in enumerate(zip(completions, golds)):
        if gold is None or (isinstance(gold, float) and math.isnan(gold)) or not str(gold).strip():
            continue
        try:
            raw_gold = gold_answer(gold)  # math-verify reads it raw: it knows \\text{} units, for one
            g = normalize(raw_gold)
            cands = list(dict.fromkeys(normalize(c) for c in extract_answers(completion)))
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
            v = False if c is None else quick_verdict(c, g)
            verdicts[i].append(v)
            if v is False:  # already wrong: math-verify need not see its other candidates
                keys = []
                break
            if v is None:
                keys.append((_latex_gold(raw_gold), "\\boxed{" + c + "}", _exact_values(c, g)))
        for key in keys:
            pending.setdefault(key, []).append(i)
    slow = {}
    if pending:
        keys = list(pending)
        slow = dict(zip(keys, _pool().verify(keys, timeout_s)))
    failed_slow = {i for key, rows in pending.items() if not slow.get(key, False) for i in rows}
    for i, vs in enumerate(verdicts):
        if scores[i] is None and vs:
            scores[i] = 1.0 if all(v is not False for v in vs) and i not in failed_slow else 0.0
    return scores


def make_math_accuracy(answer_column: str = "answer", timeout_s: float = 2.0):
    """A `math_accuracy` reading the ground truth from `answer_column`, with a per-item time limit."""

    def math_accuracy(prompts: list, completions: list, **columns) -> list[float | None]:
        if answer_column not in columns:
            raise KeyError(
                f"math_accuracy needs the ground truth in column {answer_column!r}; got {sorted(columns)}"
            )
        return score_answers([to_text(c) for c in completions], list(columns[answer_column]), timeout_s)

    math_accuracy.per_completion = True  # RewardRunner: one time budget per completion, not per batch
    return math_accuracy


math_accuracy = make_math_accuracy()
