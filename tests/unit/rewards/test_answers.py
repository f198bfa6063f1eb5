"""Which answer math_accuracy grades (issue 25): answer markers instruct models write, the visible
answer only, relations and marks that change a value, the question's own units, one math-verify
budget per completion. GSM8K rows in 35 answer styles score 1, and 0 against another row's answer."""

import json
import time

import pytest
from paths import FIXTURES

from grpokit.rewards.accuracy import gold_answer, make_math_accuracy

FIXTURE = FIXTURES / "rewards" / "gsm8k_mini.jsonl"
ROWS = [json.loads(line) for line in FIXTURE.read_text().splitlines()]
fast_math = make_math_accuracy(timeout_s=1.0)
QUESTION = "Tom has 3 boxes of 6 apples. How many apples?"
DOLLARS = "A pen costs $2 and a book $16. How much does Tom pay?"
METRES = "A rope is 6 metres long. How long are three ropes?"
HOURS = "A trip takes 6 hours. How long do three trips take?"

STYLES = [  # how instruct models end a GSM8K answer; {a} the final number, {c} it with separators
    "#### {a}",
    "\\boxed{{{a}}}",
    "$\\boxed{{{a}}}$",
    "\\[\\boxed{{{a}}}\\]",
    "The answer is {a}.",
    "The answer is: {a}",
    "The answer is {a}!",
    "So the answer is **{a}**.",
    "**Answer:** {a}",
    "**Answer**: {a}",
    "**Final Answer:** {a}",
    "**Final Answer**\n\n{a}",
    "### Final Answer\n{a}",
    "## Answer\n\n**{a}**",
    "Final answer: {a}",
    "Answer: {a}",
    "ANSWER: {a}",
    "Answer:\n{a}",
    "answer = {a}",
    "The final answer is {a}.",
    "The final answer is: {a}",
    "The final answer is $\\boxed{{{a}}}$.",
    "Final Answer: The final answer is {a}. I hope it is correct.",
    "Therefore, the answer is \\({a}\\).",
    "The answer is ${a}$.",
    "The answer would be {a}.",
    "The answer is {c}.",
    "\\boxed{{{c}}}",
    "The answer is {a} in total.",
    "<answer>{a}</answer>",
    "<answer>\nThe answer is {a}.\n</answer>",
    "<answer>\\boxed{{{a}}}</answer>",
    "**The answer is {a}.**",
    "Answer: $\\boxed{{{a}}}$",
    "The total comes to 5 + 6. The answer is {a} overall.",
]


def _completion(row, style, final):
    a = final.replace(",", "")
    c = f"{int(a):,}" if a.isdigit() else a
    work = row["answer"].rsplit("####", 1)[0].replace("<<", "(").replace(">>", ") ")
    return f"<think>Let me think. {work}</think>\nWorking: {work.strip()}\n\n" + style.format(a=a, c=c)


def test_gsm8k_answers_in_35_styles_score_one_and_never_match_another_rows_answer():
    assert len(STYLES) >= 30
    prompts, completions, own, other = [], [], [], []
    finals = [gold_answer(r["answer"]) for r in ROWS]
    for k, row in enumerate(ROWS):
        j = next(j for j in range(k + 1, k + len(ROWS)) if finals[j % len(ROWS)] != finals[k]) % len(ROWS)
        for style in STYLES:
            prompts.append(row["question"])
            completions.append(_completion(row, style, finals[k]))
            own.append(row["answer"])
            other.append(ROWS[j]["answer"])
    got = fast_math(prompts, completions, answer=own)
    missed = [(completions[i][-60:], own[i][-10:]) for i, v in enumerate(got) if v != 1.0]
    assert missed == []
    wrong = fast_math(prompts, completions, answer=other)
    assert [completions[i][-60:] for i, v in enumerate(wrong) if v != 0.0] == []
    assert fast_math([None] * len(completions), completions, answer=own) == got  # no prompt: same verdicts


# (name, completion, gold, prompt, expected)
CASES = [
    # relations other than "=" are not the value
    ("approx", r"\boxed{18 \approx 17}", "18", None, 0.0),
    ("approx, other side", r"\boxed{18 \approx 17}", "17", None, 0.0),
    ("less or equal", r"\boxed{x \le 18}", "18", None, 0.0),
    ("strict inequality", r"So \boxed{18 < 19}", "18", None, 0.0),
    ("arrow", r"\boxed{17 \to 18}", "18", None, 0.0),
    ("unicode relation", r"\boxed{18 ≈ 18.2}", "18", None, 0.0),
    ("inequality gold, same inequality", r"\boxed{x \le 18}", r"x \le 18", None, 1.0),
    # words after a number that change its value
    ("doubled", "The answer is 18 doubled.", "18", QUESTION, 0.0),
    ("thousandths", r"\boxed{18 \text{ thousandths}}", "18", QUESTION, 0.0),
    ("doubled, no prompt", "The answer is 18 doubled.", "18", None, 0.0),
    ("a word the question does not use", r"\boxed{18 \text{ dozen}}", "18", QUESTION, 0.0),
    ("the question's unit", "The answer is 18 apples.", "18", QUESTION, 1.0),
    ("the question's unit, singular", r"\boxed{18 \text{ apple}}", "18", QUESTION, 1.0),
    ("dollars when the question has $", "The answer is 19 dollars.", "19", "A pen costs $2. Total?", 1.0),
    ("a unit of time", "The answer is 18 years.", "18", "How old is Tom now?", 1.0),
    ("a unit of length", r"\boxed{18 \text{ km}}", "18", "How far did she walk?", 1.0),
    # marks that make another number
    ("base subscript", r"\boxed{18_8}", "18", None, 0.0),
    ("base subscript in braces", r"\boxed{18_{10}}", "18", None, 0.0),
    ("prime", r"\boxed{18'}", "18", None, 0.0),
    ("latex prime", r"\boxed{18^\prime}", "18", None, 0.0),
    ("base gold, same base", r"\boxed{22_8}", "22_8", None, 1.0),
    ("exclamation closes the sentence", "The answer is 18!", "18", None, 1.0),
    ("boxed factorial stays a factorial", r"\boxed{18!}", "18", None, 0.0),
    # only what a reader sees is graded
    ("html comment hides the box", "<!-- \\boxed{18} --> so \\boxed{17}", "18", None, 0.0),
    ("html comment: the visible box", "<!-- \\boxed{18} --> so \\boxed{17}", "17", None, 1.0),
    ("latex comment hides the box", "$x = 1$ % \\boxed{18}\nso \\boxed{17}", "18", None, 0.0),
    ("latex comment: the visible box", "% \\boxed{18}\nso \\boxed{17}", "17", None, 1.0),
    ("phantom box", "\\phantom{\\boxed{18}} The answer is 17.", "18", None, 0.0),
    ("phantom: the visible answer", "\\phantom{\\boxed{18}} The answer is 17.", "17", None, 1.0),
    ("white text", "{\\color{white} \\boxed{18}} The answer is 17.", "18", None, 0.0),
    ("textcolor", "\\textcolor{white}{\\boxed{18}}", "18", None, 0.0),
    ("styled html", '<span style="color:white">\\boxed{18}</span>', "18", None, 0.0),
    ("redefined boxed", "\\renewcommand{\\boxed}[1]{}\\boxed{18}", "18", None, 0.0),
    ("percent sign is not a comment", "A 20% discount, so \\boxed{18}", "18", None, 1.0),
    ("percent answer", "\\boxed{50\\%}", "0.5", None, 1.0),
    # MATH-500 thousands separators
    ("comma with negative space", r"\boxed{10,\!080}", "10080", None, 1.0),
    ("gold with negative space", r"\boxed{10080}", r"10,\!080", None, 1.0),
    ("thin space", r"\boxed{10\,080}", "10080", None, 1.0),
    ("a list is not a number", r"\boxed{1, 234}", "1234", None, 0.0),
    # issue 37: units are the question's (a unit of the same quantity it does not use states another value)
    ("cents for dollars", "The answer is 18 cents.", "18", DOLLARS, 0.0),
    ("dollars for $", "The answer is 18 dollars.", "18", DOLLARS, 1.0),
    ("km for metres", "The answer is 18 km.", "18", METRES, 0.0),
    ("metres for metres", "The answer is 18 metres.", "18", METRES, 1.0),
    ("minutes for hours", "The answer is 18 minutes.", "18", HOURS, 0.0),
    ("hours for hours", r"\boxed{18 \text{ hours}}", "18", HOURS, 1.0),
    ("boxed mm for metres", r"\boxed{18\text{ mm}}", "18", METRES, 0.0),
    ("per cent to a question without percent", "The answer is 18 per cent.", "18", QUESTION, 0.0),
    ("percent sign to a question without percent", "The answer is 18%.", "18", QUESTION, 0.0),
    ("per cent to a percent question", "The answer is 18 per cent.", "18", "What percent of 50 is 9?", 1.0),
    ("any unicode relation", r"\boxed{18 ≃ 17}", "18", None, 0.0),
    ("a latex relation of any name", r"\boxed{18 \lesssim 19}", "18", None, 0.0),
    ("struck-out answer, another after it", "The answer is ~~18~~ 17.", "18", None, 0.0),
    ("struck-out answer withdrawn", "The answer is ~~17~~ 18.", "18", None, 1.0),
    ("struck in html", "The answer is <del>18</del> 17.", "18", None, 0.0),
    ("cancelled in latex", r"\boxed{\cancel{18} 17}", "18", None, 0.0),
    ("an ellipsis is not a value", r"\boxed{18\ldots}", "18", None, 0.0),
    ("three dots", r"\boxed{18...}", "18", None, 0.0),
    # issue 37: what a reader does not see is not graded, whatever hides it
    ("white font", '<font color="white">\\boxed{18}</font> The answer is 17.', "18", None, 0.0),
    ("template", "<template>\\boxed{18}</template> The answer is 17.", "18", None, 0.0),
    ("cdata", "<![CDATA[\\boxed{18}]]> The answer is 17.", "18", None, 0.0),
    ("markdown comment", "[//]: # (\\boxed{18})\nThe answer is 17.", "18", None, 0.0),
    ("markdown comment: the visible answer", "[//]: # (\\boxed{18})\nThe answer is 17.", "17", None, 1.0),
    ("image alt", "![\\boxed{18}](a.png) The answer is 17.", "18", None, 0.0),
    ("link title", '[see](http://a.b "\\boxed{18}") The answer is 17.', "18", None, 0.0),
    ("link target", "[the answer](http://a.b/\\boxed{18}) is 17.", "18", None, 0.0),
    ("noscript", "<noscript>\\boxed{18}</noscript> The answer is 17.", "18", None, 0.0),
    ("textarea", "<textarea>\\boxed{18}</textarea> The answer is 17.", "18", None, 0.0),
    ("div hidden by attribute", '<div aria-hidden="true">\\boxed{18}</div>', "18", None, 0.0),
    ("mathjax style", r"\style{display:none}{\boxed{18}} The answer is 17.", "18", None, 0.0),
    ("katex htmlStyle", r"\htmlStyle{color:white}{\boxed{18}} The answer is 17.", "18", None, 0.0),
    ("overlapped", r"\rlap{\boxed{18}}\boxed{17}", "18", None, 0.0),
    ("label", r"\label{\boxed{18}} The answer is 17.", "18", None, 0.0),
    ("plain html markup is read through", "<b>Answer:</b> 18", "18", None, 1.0),
    # issue 37: right answers that scored 0
    ("a true computation", "The answer is 9 * 2 = 18.", "18", QUESTION, 1.0),
    ("a false computation", "The answer is 9 * 3 = 18.", "18", QUESTION, 0.0),
    ("a clause after the answer", "The answer is 18, which is the number of apples.", "18", QUESTION, 1.0),
    ("the unit in parentheses", "The answer is 18 (dollars).", "18", DOLLARS, 1.0),
    ("words then digits", "The answer is eighteen (18).", "18", QUESTION, 1.0),
    ("words and digits that disagree", "The answer is seventeen (18).", "18", QUESTION, 0.0),
    ("repeating decimal", r"\boxed{18.\overline{3}}", r"\frac{55}{3}", None, 1.0),
    ("repeating decimal, another value", r"\boxed{18.\overline{6}}", r"\frac{55}{3}", None, 0.0),
    ("a trailing check mark", "The answer is 18 ✓", "18", None, 1.0),
    ("a bold latex label", r"\textbf{Answer:} 18", "18", None, 1.0),
]


@pytest.mark.parametrize("name,completion,gold,prompt,expected", CASES, ids=[c[0] for c in CASES])
def test_answer_rules(name, completion, gold, prompt, expected):
    assert fast_math([prompt], [completion], answer=[gold]) == [expected]


def test_one_math_verify_budget_per_completion_not_per_boxed_expression():
    """Eight power towers in one completion cost one budget (before: 4 s each, 8 in a row), and
    never another completion's score."""
    towers = " ".join(rf"\boxed{{3^{{3^{{{k}}}}}}}" for k in range(9, 17))
    slow = make_math_accuracy(timeout_s=1.0)
    slow([None], [r"\boxed{\frac{1}{2}}"], answer=["2^{-1}"])  # math-verify's workers started
    start = time.monotonic()
    got = slow(
        [None] * 3,
        [towers, r"\boxed{\frac{\sqrt{2}}{2}}", r"\boxed{18}"],
        answer=["18", r"\frac{1}{\sqrt{2}}", "18"],
    )
    assert got == [0.0, 1.0, 1.0]
    assert (
        time.monotonic() - start < 4.0 + 12.0
    )  # one budget (2 * 1 + 2 s) plus a worker restart and slack; not 8 x 4 s
