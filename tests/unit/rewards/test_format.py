"""format_strict / format_lenient: bodies that draw nothing (whitespace, zero-width and other
invisible characters) are empty bodies and score 0; CRLF line ends are newlines. language_consistency:
a chain of thought in another language has no hiding place (maths, code, outside the think tags,
LaTeX commands)."""

import pytest

from grpokit.rewards.format import format_lenient, format_strict, has_visible_text

INVISIBLE = [
    ("zero-width space", "\u200b"),
    ("zero-width joiner and non-joiner", "\u200d\u200c"),
    ("word joiner and BOM", "\u2060\ufeff"),
    ("no-break and ideographic spaces", "\u00a0\u3000"),
    ("left-to-right and right-to-left marks", "\u200e\u200f"),
    ("soft hyphen", "\u00ad"),
    ("Hangul filler", "\u3164"),
    ("blank Braille pattern", "\u2800"),
    ("a combining mark alone", "\u0301"),
    ("tabs and a zero-width space", "\t\u200b\t"),
    # drawn as nothing by their names, whatever their category (issue 25)
    ("musical null notehead", "\U0001d159"),
    ("Khitan small script filler", "\U00016fe4"),
    ("invisible times and tag letters", "\u2062\U000e0041\U000e0042"),
    ("combining grapheme joiner", "\u034f"),
    ("Khmer inherent vowel", "\u17b4\u17b5"),
]


def strict(think: str, answer: str) -> str:
    return f"<think>\n{think}\n</think>\n<answer>\n{answer}\n</answer>"


@pytest.mark.parametrize("name,body", INVISIBLE, ids=[r[0] for r in INVISIBLE])
def test_invisible_bodies_score_zero(name, body):
    assert not has_visible_text(body)
    for think, answer in ((body, "42"), ("reasoning", body), (body, body)):
        assert format_strict(["q"], [strict(think, answer)]) == [0.0]
        assert format_lenient(["q"], [f"<think>{think}</think> <answer>{answer}</answer>"]) == [0.0]


@pytest.mark.parametrize("body", ["42", "é", "你好", "\u200b42\u200b", "x\u0301", "\u00a0-"])
def test_visible_bodies_still_score_one(body):
    assert has_visible_text(body)
    assert format_strict(["q"], [strict("reasoning", body)]) == [1.0]
    assert format_lenient(["q"], [f"<think>reasoning</think><answer>{body}</answer>"]) == [1.0]


def test_windows_line_ends_are_not_a_format_error():
    crlf = "<think>\r\nreasoning\r\n</think>\r\n<answer>\r\n42\r\n</answer>"
    assert format_strict(["q"], [crlf]) == [1.0] and format_lenient(["q"], [crlf]) == [1.0]
    assert format_strict(["q"], ["<think>\r\n\u2800\r\n</think>\r\n<answer>\r\n42\r\n</answer>"]) == [0.0]


ZH = "我们先计算总数然后再除以人数"  # 14 han characters: 14 words
LANGUAGE_HIDING = [  # (where the English chain of thought hides, completion): target zh, each below 0.6
    ("inline maths", f"<think>{ZH} $Let us add all the numbers and then divide them by the count$</think>"),
    (
        "display maths",
        f"<think>{ZH} $$Let us add all the numbers and then divide them by the count$$</think>",
    ),
    (
        "text in maths",
        f"<think>{ZH} \\[\\text{{Let us add all the numbers and then divide them by the count}}\\]</think>",
    ),
    (
        "code block",
        f"<think>{ZH}\n```\nLet us add all the numbers and then divide them by the count\n```\n</think>",
    ),
    (
        "outside the think tags",
        f"<think>{ZH}</think>Let us add all the numbers and then divide them by the count.<answer>5</answer>",
    ),
    (
        "LaTeX commands",
        f"<think>{ZH} \\Let \\us \\add \\all \\the \\numbers \\and \\then \\divide \\them \\by \\the \\count</think>",
    ),
]


@pytest.mark.parametrize("name,completion", LANGUAGE_HIDING, ids=[r[0] for r in LANGUAGE_HIDING])
def test_a_chain_of_thought_in_another_language_has_no_hiding_place(name, completion):
    from grpokit.rewards.language import make_language_consistency

    assert make_language_consistency("zh")(None, [completion])[0] < 0.6


def test_honest_chains_of_thought_keep_their_language_with_maths():
    from grpokit.rewards.language import make_language_consistency

    zh = f"<think>{ZH}，设 $x^2 + 2x = \\frac{{1}}{{2}}$，所以 $\\sin \\alpha \\cdot ab$ 成立</think><answer>5</answer>"
    assert make_language_consistency("zh")(None, [zh]) == [1.0]
    en = "<think>Let $x = 2$, then \\textbf{twice} x is $\\frac{4}{1}$ and `y = x + 1`.</think><answer>4</answer>"
    assert make_language_consistency("en")(None, [en]) == [1.0]
