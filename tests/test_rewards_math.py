"""math_accuracy: table-driven positive, negative and adversarial rows; gold fixture; throughput."""

import json
import time
from pathlib import Path

import pytest

from grpokit.rewards.accuracy import (
    as_number,
    extract_answers,
    gold_answer,
    make_math_accuracy,
    math_accuracy,
)

FIXTURE = Path(__file__).parent / "fixtures" / "rewards" / "gsm8k_mini.jsonl"
fast_math = make_math_accuracy(timeout_s=1.0)


def score(completion, gold):
    return fast_math([None], [completion], answer=[gold])[0]


POSITIVE = [
    ("boxed", r"so \boxed{18}", "18"),
    ("answer tag", "<think>3*6</think><answer>18</answer>", "18"),
    ("boxed inside answer tag", r"<think>3*6</think><answer>The result is \boxed{18}.</answer>", "18"),
    ("gsm8k hashes", "3 * 6 = 18\n#### 18", "18"),
    ("closing phrase", "3 * 6 = 18. The answer is 18.", "18"),
    ("closing phrase with unit", "So the answer is 18 apples.", "18"),
    ("gold is a full gsm8k solution", r"\boxed{72}", "48 + 24 = <<48+24=72>>72\n#### 72"),
    ("thousands separator", r"\boxed{1,000}", "1000"),
    ("latex thousands separator", r"\boxed{1{,}000}", "1000"),
    ("gold with separator", r"\boxed{3000}", "#### 3,000"),
    ("decimal vs integer", r"\boxed{18.0}", "18"),
    ("fraction vs decimal", r"\boxed{\frac{1}{2}}", "0.5"),
    ("slash fraction", r"\boxed{7/4}", "1.75"),
    ("percent vs fraction", r"\boxed{50\%}", "0.5"),
    ("percent sign dropped", r"\boxed{40\%}", "40"),
    ("currency", r"\boxed{\$18}", "18"),
    ("text unit", r"\boxed{18 \text{ dollars}}", "18"),
    ("negative", r"\boxed{-6}", "-6"),
    ("latex symbolic", r"\boxed{\dfrac{\sqrt{2}}{2}}", r"\frac{\sqrt{2}}{2}"),
    ("polynomial", r"\boxed{(x+1)^2}", "x^2+2x+1"),
    ("same answer boxed twice", r"\boxed{18} ... so \boxed{18}", "18"),
    ("think opened by the template", r"3*6 is 18</think><answer>18</answer>", "18"),
    ("chat-format completion", [{"role": "assistant", "content": r"\boxed{18}"}], "18"),
    ("integer gold cell", r"\boxed{18}", 18),
]

NEGATIVE = [
    ("wrong number", r"\boxed{17}", "18"),
    ("no answer at all", "I think it is probably eighteen-ish", "18"),
    ("empty", "", "18"),
    ("wrong fraction", r"\boxed{\frac{1}{3}}", "0.5"),
    ("rounded", r"\boxed{0.33}", r"\frac{1}{3}"),
    ("multiplier word", r"\boxed{18 million}", "18"),
    ("unbalanced box", r"\boxed{18", "18"),
    ("wrong sign", r"\boxed{6}", "-6"),
]

ADVERSARIAL = [
    ("several boxed answers that disagree", r"\boxed{17} or maybe \boxed{18}", "18"),
    ("several answer tags that disagree", "<think>x</think><answer>17</answer><answer>18</answer>", "18"),
    ("several gsm8k answers", "#### 17\n#### 18", "18"),
    ("answer only in the reasoning", r"<think>it is \boxed{18}</think><answer>19</answer>", "18"),
    ("answer only in the reasoning, empty answer", r"<think>it is \boxed{18}</think><answer></answer>", "18"),
    ("answer tag only in the reasoning", "<think><answer>18</answer></think>", "18"),
    ("unclosed think hides the answer", r"<think>so \boxed{18}", "18"),
    ("boxed disjunction", r"\boxed{18 or 19}", "18"),
    ("boxed text disjunction", r"\boxed{18 \text{ or } 19}", "18"),
    ("boxed list", r"\boxed{18, 19}", "18"),
    ("answer is, disjunction", "The answer is 18 or 19.", "18"),
    ("fullwidth digits", r"\boxed{１８}", "18"),
    ("arabic-indic digits", r"\boxed{١٨}", "18"),
    ("mathematical bold digits", r"\boxed{𝟏𝟖}", "18"),
    ("fullwidth digits in the answer tag", "<think>x</think><answer>１８</answer>", "18"),
    ("enumerating many boxes", "".join(rf"\boxed{{{i}}}" for i in range(40)), "18"),
    ("tower of powers (math-verify timeout)", r"\boxed{9^{9^{9^{9}}}}", "18"),
    ("answer of 5,000 characters", r"\boxed{" + "1+" * 2500 + "}", "18"),
    ("not a string", 12345, "18"),
    ("None completion", None, "18"),
    ("malformed chat message", [{"role": "assistant"}], "18"),
]


@pytest.mark.parametrize("name,completion,gold", POSITIVE, ids=[r[0] for r in POSITIVE])
def test_positive(name, completion, gold):
    assert score(completion, gold) == 1.0


@pytest.mark.parametrize("name,completion,gold", NEGATIVE, ids=[r[0] for r in NEGATIVE])
def test_negative(name, completion, gold):
    assert score(completion, gold) == 0.0


@pytest.mark.parametrize("name,completion,gold", ADVERSARIAL, ids=[r[0] for r in ADVERSARIAL])
def test_adversarial(name, completion, gold):
    assert score(completion, gold) == 0.0


@pytest.mark.parametrize("length", [100_000, 1_000_000])
@pytest.mark.parametrize(
    "filler", ["x", "\\boxed{", "{", "<think>", "the answer is ", "#### ", "```", "\\boxed{1}"]
)
def test_huge_completion_is_fast(length, filler):
    text = (filler * (length // len(filler) + 1))[:length] + r" \boxed{18}"
    start = time.perf_counter()
    value = score(text, "18")
    assert time.perf_counter() - start < 1.0
    assert value in (0.0, 1.0)


def test_missing_gold_is_not_applicable_and_missing_column_raises():
    assert math_accuracy([None, None], [r"\boxed{1}", r"\boxed{1}"], answer=[None, ""]) == [None, None]
    with pytest.raises(KeyError, match="answer"):
        math_accuracy([None], [r"\boxed{1}"], solution=["1"])


def test_extraction_levels():
    assert extract_answers(r"<think>\boxed{1}</think> \boxed{2} #### 3") == ["2"]
    assert extract_answers("#### 3\nThe answer is 4") == ["3"]
    assert extract_answers("blah. The answer is: 4. Done") == ["4"]
    assert gold_answer("work\n#### 1,234") == "1,234"
    assert gold_answer(r"so $\boxed{\frac{1}{2}}$") == r"\frac{1}{2}"


def test_as_number_is_exact_and_ascii_only():
    from fractions import Fraction

    assert as_number("1,234.5") == (Fraction(2469, 2), False)
    assert as_number(r"\$-3") == (Fraction(-3), False)
    assert as_number("12%") == (Fraction(12), True)
    assert as_number("١٨") is None and as_number("1,2") is None and as_number("18 or") is None


def _fixture_rows():
    return [json.loads(line) for line in FIXTURE.read_text().splitlines()]


def test_gold_solutions_score_one_and_perturbed_answers_zero():
    rows = _fixture_rows()
    assert len(rows) == 20
    solutions = [r["answer"] for r in rows]  # each reference solution, graded as a completion
    assert math_accuracy([r["question"] for r in rows], solutions, answer=solutions) == [1.0] * 20
    finals = [float(gold_answer(s).replace(",", "")) for s in solutions]
    perturbed = [f"#### {f + 1:g}" for f in finals]
    assert math_accuracy([None] * 20, solutions, answer=perturbed) == [0.0] * 20
    bare = [gold_answer(s) for s in solutions]
    boxed = [rf"The total is \boxed{{{b}}}." for b in bare]
    assert math_accuracy([None] * 20, boxed, answer=solutions) == [1.0] * 20


def test_throughput_1000_completions_under_5s():
    rows = _fixture_rows()
    completions, golds = [], []
    for i in range(1000):
        r = rows[i % 20]
        final = gold_answer(r["answer"])
        kind = i % 10
        if kind < 4:
            completions.append(f"<think>{r['answer']}</think><answer>{final}</answer>")
        elif kind < 7:
            completions.append(f"Working: {r['answer'][:200]}\nThe answer is {i}.")
        elif kind < 9:
            completions.append(rf"Thus \boxed{{{final}}} is it.")
        else:  # symbolic answers that need math-verify, all distinct
            completions.append(rf"\boxed{{\frac{{{i}}}{{{i + 1}}} + \sqrt{{{i % 7 + 2}}}}}")
        golds.append(r["answer"] if kind < 9 else rf"\frac{{{i}}}{{{i + 1}}}+\sqrt{{{i % 7 + 2}}}")
    start = time.perf_counter()
    scores = math_accuracy([None] * 1000, completions, answer=golds)
    elapsed = time.perf_counter() - start
    assert elapsed < 5.0, elapsed
    assert len(scores) == 1000 and all(s in (0.0, 1.0) for s in scores)
    assert sum(scores) >= 600  # 400 answer tags + 200 boxed + 100 symbolic (the phrase rows are mostly wrong)
