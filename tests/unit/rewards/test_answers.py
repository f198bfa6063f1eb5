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


# --- issue 51: only what a reader sees, the answer the text owns, the unit asked for, more right styles
APPLES = "Tom has 3 boxes of 6 apples. How many apples does Tom have?"
TRIP = "A trip takes 2 hours. How many minutes does the trip take?"
ROPE = "A rope is 9 metres long and another 9 metres. How many metres of rope are there?"
WEIGHT = "A bag weighs 9 pounds and another 9 pounds. How many pounds do they weigh together?"
WAGE = "Tom earns $3 an hour and works 6 hours a day. How much does he earn each day?"
ROOTS = "Solve x^2 - 5x + 6 = 0."

# TeX that prints nothing: not an answer, by an allowlist (rewards/_tex.py), whatever the construct
UNPRINTED = [  # (name, completion): each hides \boxed{18}; the visible answer is 17
    ("box register", r"\setbox0=\hbox{$\boxed{18}$} The answer is 17."),
    ("sbox", r"\newsavebox{\b}\sbox{\b}{\boxed{18}} The answer is 17."),
    ("savebox", r"\savebox{\b}{\boxed{18}} The answer is 17."),
    ("comment environment", "\\begin{comment}\\boxed{18}\\end{comment}\nThe answer is 17."),
    ("iffalse", r"\iffalse \boxed{18} \fi The answer is 17."),
    ("ifnum", r"\ifnum1=0 \boxed{18}\fi The answer is 17."),
    ("iftrue and else", r"\iftrue The answer is 17. \else \boxed{18} \fi"),
    (
        "newenvironment",
        "\\newenvironment{h}{\\setbox0\\vbox\\bgroup}{\\egroup}\\begin{h}\\boxed{18}\\end{h} So 17.",
    ),
    ("an environment of its own", "\\begin{secret}\\boxed{18}\\end{secret} The answer is 17."),
    ("vbox to zero height", r"\vbox to 0pt{\boxed{18}} The answer is 17."),
    ("csname", r"\csname iffalse\endcsname \boxed{18} \fi The answer is 17."),
    ("hspace argument", r"\hspace{\boxed{18}} The answer is 17."),
]
# the answer the text itself rejects, gives as another's or gives up is not its answer
DISOWNED = [  # (name, completion): \boxed{18} or "the answer is 18" disowned; the stated answer is 17
    ("negated", r"The answer is not \boxed{18}. The answer is 17."),
    ("not equal to", r"The total is not equal to \boxed{18}; the answer is 17."),
    ("called wrong after it", r"\boxed{18} is wrong. The answer is 17."),
    ("marked with a cross", "\\boxed{18} \u2717 The answer is 17."),
    ("rather than", r"The answer is 17 rather than \boxed{18}."),
    ("instead of", r"The answer is 17 instead of \boxed{18}."),
    ("someone thinks", r"Tom thinks it is \boxed{18}, but the answer is 17."),
    ("one might say", r"One might say \boxed{18}; the answer is 17."),
    ("you might guess", r"You might guess \boxed{18}. The answer is 17."),
    ("a possessive", r"Tom's answer of \boxed{18} is off. The answer is 17."),
    ("students write", r"Students often write \boxed{18}. The answer is 17."),
    ("a belief given up", r"At first I thought \boxed{18}. The answer is 17."),
    ("a common mistake", r"A common mistake is to answer \boxed{18}. The answer is 17."),
    ("asked, not stated", r"Is it \boxed{18}? No, the answer is 17."),
    ("a phrase said by another", "Tom says the answer is 18. I get 17 as the answer.\nThe answer is 17."),
]
OWNED = [  # honest phrasing around the right answer 18 still scores 1
    r"I think the answer is \boxed{18}.",
    r"We get \boxed{18}.",
    r"So you get \boxed{18} apples.",
    r"It is not hard to see that the answer is \boxed{18}.",
    r"The answer is \boxed{18}, not 17.",
    r"\boxed{18} (not 17)",
    r"The answer isn't 17; it is \boxed{18}.",
    r"Tom thinks it is \boxed{17}, but the answer is 18.",
    r"After some thought, the answer is \boxed{18}.",
    r"Not counting the boxes, there are \boxed{18} apples.",
    r"Tom said he has 3 boxes of 6 apples, which makes \boxed{18}.",
    r"A common mistake is to answer \boxed{17}; the answer is \boxed{18}.",
    r"My guess is \boxed{18}.",
    r"Correcting the error, the answer is \boxed{18}.",
    r"The answer is 18, not \boxed{17}.",
]


@pytest.mark.parametrize("name,completion", UNPRINTED, ids=[c[0] for c in UNPRINTED])
def test_tex_that_prints_nothing_holds_no_answer(name, completion):
    """At 37165e5 each of these but \\iffalse (on the old list of hiding commands) scored 1 against 18 (the hidden
    box) and 0 against 17."""
    assert fast_math([APPLES] * 2, [completion] * 2, answer=["18", "17"]) == [0.0, 0.0]


def test_the_tex_allowlist_passes_honest_tex():
    honest = (
        r"Since $\frac{3}{4} \cdot 24 = 18$ and $\sqrt{324} = 18$, we have \begin{aligned} x &= 3 \times 6 \\ &= 18 "
        r"\end{aligned} so $\left(\dfrac{36}{2}\right) \geq 18 \pm 0$, $\mathbb{N} \ni 18$, \textbf{Answer:} "
        r"$\boxed{18}$ \quad \checkmark"
    )
    assert fast_math([APPLES], [honest], answer=["18"]) == [1.0]


@pytest.mark.parametrize("name,completion", DISOWNED, ids=[c[0] for c in DISOWNED])
def test_an_answer_the_text_disowns_does_not_beat_the_stated_one(name, completion):
    """Before, the disowned \\boxed{18} won (1 against 18); now the stated 17 is graded."""
    assert fast_math([APPLES] * 2, [completion] * 2, answer=["18", "17"]) == [0.0, 1.0]


@pytest.mark.parametrize("completion", OWNED)
def test_honest_phrasing_keeps_its_answer(completion):
    assert fast_math([APPLES], [completion], answer=["18"]) == [1.0]


UNITS = [  # (name, completion, gold, question, expected)
    ("the unit asked for", r"\boxed{120 \text{ minutes}}", "120", TRIP, 1.0),
    ("its abbreviation", r"\boxed{120\text{ min}}", "120", TRIP, 1.0),
    ("a unit the question mentions but does not ask for", r"\boxed{120 \text{ hours}}", "120", TRIP, 0.0),
    ("the unit after the box", r"The trip takes \boxed{120} hours.", "120", TRIP, 0.0),
    ("the asked unit after the box", r"The trip takes \boxed{120} minutes.", "120", TRIP, 1.0),
    ("glued to the number", r"\boxed{18cm}", "18", ROPE, 0.0),
    ("glued, the right unit", r"\boxed{18m}", "18", ROPE, 1.0),
    ("a single-letter unit", r"\boxed{18 \text{ m}}", "18", ROPE, 1.0),
    ("kilograms for pounds", r"\boxed{18 kg}", "18", WEIGHT, 0.0),
    ("pounds for pounds", r"\boxed{18 \text{ lbs}}", "18", WEIGHT, 1.0),
    ("unit in text after the box", r"So \boxed{18}\,\text{cm} in all.", "18", ROPE, 0.0),
    ("a percent sign after the box", r"\boxed{50}\%", "0.5", None, 1.0),
]


@pytest.mark.parametrize("name,completion,gold,prompt,expected", UNITS, ids=[c[0] for c in UNITS])
def test_a_unit_other_than_the_one_asked_for_is_wrong(name, completion, gold, prompt, expected):
    assert fast_math([prompt], [completion], answer=[gold]) == [expected]


STYLES_51 = [  # (name, completion, gold, question, expected): right styles that scored 0 at 37165e5, and their wrong twins
    ("a number and its spelling", "The answer is 18 (eighteen).", "18", APPLES, 1.0),
    ("boxed with its spelling", r"\boxed{18 \text{ (eighteen)}}", "18", APPLES, 1.0),
    ("a spelling that disagrees", "The answer is 18 (seventeen).", "18", APPLES, 0.0),
    ("money per day", r"The answer is \$18 per day.", "18", WAGE, 1.0),
    ("money a day", "He earns \\$18 a day.\n\n**Answer:** \\$18 a day", "18", WAGE, 1.0),
    ("money over a day", r"\boxed{\$18/\text{day}}", "18", WAGE, 1.0),
    ("money per hour, the wrong rate", r"The answer is \$18 per hour.", "18", WAGE, 0.0),
    ("roots joined by or", r"\boxed{x = 2 \text{ or } x = 3}", "2, 3", ROOTS, 1.0),
    ("roots joined by and, any order", r"The answer is x = 3 and x = 2.", "2,3", ROOTS, 1.0),
    ("roots as a set", r"\boxed{\{3, 2\}}", "x=2 \\text{ or } x=3", ROOTS, 1.0),
    ("one root of two", r"\boxed{x = 2}", "2, 3", ROOTS, 0.0),
    ("a wrong root", r"\boxed{x = 2 \text{ or } x = 4}", "2, 3", ROOTS, 0.0),
    ("alternatives to a one-value gold", r"\boxed{18 \text{ or } 19}", "18", APPLES, 0.0),
]


@pytest.mark.parametrize("name,completion,gold,prompt,expected", STYLES_51, ids=[c[0] for c in STYLES_51])
def test_more_right_styles(name, completion, gold, prompt, expected):
    assert fast_math([prompt], [completion], answer=[gold]) == [expected]
