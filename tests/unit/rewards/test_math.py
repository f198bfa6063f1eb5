"""math_accuracy: table-driven positive, negative and adversarial rows; gold fixture; throughput."""

import json
import time

import pytest
from paths import FIXTURES

from grpokit.rewards.accuracy import (
    MALFORMED,
    as_number,
    extract_answers,
    gold_answer,
    make_math_accuracy,
    math_accuracy,
    normalize,
)

FIXTURE = FIXTURES / "rewards" / "gsm8k_mini.jsonl"
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
    (
        "column vector",
        r"\boxed{\begin{pmatrix} 1 \\ 2 \end{pmatrix}}",
        r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}",
    ),
    (
        "matrix",
        r"\boxed{\begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix}}",
        r"\begin{pmatrix}1&2\\3&4\end{pmatrix}",
    ),
    ("closing phrase with trailing words", "The answer is 18 in total.", "18"),
    ("variable = value", r"\boxed{x = 18}", "18"),
    ("function value", r"\boxed{f(2) = 18}", "18"),
    ("gold is an equation", r"\boxed{y = 2x + 3}", "y=2x+3"),
    ("a true computation ending in the answer (issue 37)", r"\boxed{2 \cdot 9 = 18}", "18"),
    ("visible box, other answer only inside code", "```\n<answer>17</answer>\n```\nSo \\boxed{18}", "18"),
    # decimals are exact numbers on every path (the symbolic golds below go to math-verify)
    ("decimal for a symbolic rational gold", r"\boxed{-0.5}", r"\frac{-1}{2}"),
    ("decimal for a power", r"\boxed{0.5}", "2^{-1}"),
    ("percent for a power", r"\boxed{50\%}", "2^{-1}"),
    ("decimal for a percent gold", r"\boxed{0.25}", r"25\%"),
    ("decimal coefficient, exact value", r"\boxed{1.5\sqrt{2}}", r"\frac{3\sqrt{2}}{2}"),
    ("scientific notation", r"\boxed{1.8 \times 10^{1}}", "18"),
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
    (
        "wrong vector",
        r"\boxed{\begin{pmatrix} 1 \\ 3 \end{pmatrix}}",
        r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}",
    ),
    ("percent of the gold", r"\boxed{0.4\%}", "40"),
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
    ("false equation", r"\boxed{17 = 18}", "18"),
    ("equation whose left side is another value", r"\boxed{2 \cdot 8 = 18}", "18"),
    ("equation chain with a false step", r"\boxed{x = 2 \cdot 8 = 18}", "18"),
    ("nested answer tags, right inner", "<answer>17<answer>18</answer></answer>", "18"),
    ("nested answer tags, right first", "<answer><answer>18</answer>17</answer>", "18"),
    ("unclosed second answer tag", "<think>x</think><answer>18</answer> <answer>17", "18"),
    ("answer tag in a code fence beats the box", "```\n<answer>18</answer>\n```\nSo \\boxed{17}", "18"),
    ("answer tag in an unclosed fence", "So \\boxed{17}\n```\n<answer>18</answer>", "18"),
    ("answer tag in inline code", "Format: `<answer>18</answer>`. So \\boxed{17}", "18"),
    # decimal approximations of irrational or repeating golds are not the gold
    ("decimal of sqrt 2", r"\boxed{1.41421356}", r"\sqrt{2}"),
    ("double-precision decimal of sqrt 2", r"\boxed{1.4142135623730951}", r"\sqrt{2}"),
    ("decimal of sqrt 2 with dots", r"\boxed{1.4142135\ldots}", r"\sqrt{2}"),
    ("decimal of pi", r"\boxed{3.14159265}", r"\pi"),
    ("repeating decimal", r"\boxed{0.3333333}", r"\frac{1}{3}"),
    ("repeating decimal, symbolic gold", r"\boxed{0.3333333}", "3^{-1}"),
    ("exact answer for a decimal gold", r"\boxed{\frac{\sqrt{2}}{2}}", "0.70710678"),
]


@pytest.mark.parametrize("name,completion,gold", POSITIVE, ids=[r[0] for r in POSITIVE])
def test_positive(name, completion, gold):
    assert score(completion, gold) == 1.0


@pytest.mark.parametrize("name,completion,gold", NEGATIVE, ids=[r[0] for r in NEGATIVE])
def test_negative(name, completion, gold):
    assert score(completion, gold) == 0.0


@pytest.mark.slow
@pytest.mark.parametrize("name,completion,gold", ADVERSARIAL, ids=[r[0] for r in ADVERSARIAL])
def test_adversarial(name, completion, gold):
    assert score(completion, gold) == 0.0


@pytest.mark.parametrize("length", [100_000, 1_000_000])
@pytest.mark.parametrize(
    "filler", ["x", "\\boxed{", "{", "<think>", "the answer is ", "#### ", "```", "\\boxed{1}"]
)
def test_huge_completion_is_fast(length, filler):
    text = (filler * (length // len(filler) + 1))[:length] + r" \boxed{18}"
    start = time.process_time()  # CPU time: a busy machine does not move it
    value = score(text, "18")
    assert time.process_time() - start < 2.0  # a backtracking regex on 1e6 characters takes minutes
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


def test_malformed_tags_code_and_phrases():
    assert extract_answers("<answer>1<answer>2</answer></answer>") == [MALFORMED]
    assert extract_answers("</answer> <answer>2</answer>") == [MALFORMED]
    assert extract_answers("<answer>1</answer> and <answer>2</answer>") == ["1", "2"]
    assert extract_answers("```\n\\boxed{1}\n``` then `\\boxed{2}` then \\boxed{3}") == ["3"]
    assert extract_answers("The answer is 18 in total.") == ["18 in total"]
    assert as_number("18 in total") == (18, False) and as_number("18 dollars altogether") == (18, False)
    assert as_number("18 more than") is None and as_number("18 or so") is None


def test_matrix_rows_survive_normalisation():
    vector = r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}"
    assert normalize(vector) == vector  # the row separator is not a LaTeX space
    assert normalize(r"1\ 000\,\!2") == "1 000 2"


@pytest.mark.parametrize("pred", ["0.5", "0.50", r"\frac{1}{2}", "50\\%", "0.4999999", "0.5000001", "1/3"])
def test_decimal_rule_is_the_same_on_both_paths(pred):
    # "\frac{1}{2}" is settled by the exact fast path, "2^{-1}" by math-verify: same verdicts.
    fast = score(rf"\boxed{{{pred}}}", r"\frac{1}{2}")
    slow = score(rf"\boxed{{{pred}}}", "2^{-1}")
    assert fast == slow == (1.0 if pred in ("0.5", "0.50", r"\frac{1}{2}", "50\\%") else 0.0)


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


def test_1000_mixed_completions_score_as_expected():
    """A thousand completions of every kind in one call (speed is measured in docs/benchmarks.md, not here)."""
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
    scores = math_accuracy([None] * 1000, completions, answer=golds)
    assert len(scores) == 1000 and all(s in (0.0, 1.0) for s in scores)
    assert sum(scores) >= 600  # 400 answer tags + 200 boxed + 100 symbolic (the phrase rows are mostly wrong)
