"""format_strict / format_lenient: bodies that draw nothing (whitespace, zero-width and other
invisible characters) are empty bodies and score 0."""

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
