"""The embedded default: the warm start is cached, the data is held out, and the README's command learns."""

import json

import pytest

from grpokit.demos.default import DemoSpec, completion_text, make_problems, prepare_demo

SMALL = DemoSpec(max_operand=9, eval_size=20, hidden_size=32, sft_steps=20, sft_batch=16)


def test_problems_are_held_out():
    train, held_out = make_problems(SMALL)
    assert len(train) + len(held_out) == 100
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in held_out}
    assert all(int(r["answer"]) == sum(map(int, r["prompt"].rstrip("=").split("+"))) for r in train)


def test_demo_answers_are_scored_by_math_accuracy():
    from grpokit.rewards import resolve_reward

    score = resolve_reward("math_accuracy")
    got = score(["3+4=", "3+4="], [completion_text(7), completion_text(8)], answer=["7", "7"])
    assert got == [1.0, 0.0]


@pytest.mark.slow
def test_warm_start_is_cached(tmp_path):
    messages = []
    first = prepare_demo(SMALL, cache=tmp_path, log=messages.append)
    assert any("warm start" in m for m in messages)
    messages.clear()
    second = prepare_demo(SMALL, cache=tmp_path, log=messages.append)
    assert first == second and any("cached" in m for m in messages)
    assert not any("warm start 1/" in m for m in messages)
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(second["model"])


@pytest.mark.slow
def test_readme_demo_command_learns(tmp_path, monkeypatch):
    """`grpokit train --output-dir D` (the README's first command): <= 40% before, >= 80% after."""
    from grpokit.cli.main import main

    monkeypatch.setenv("GRPOKIT_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "demo"
    assert main(["train", "--output-dir", str(out), "train.tensorboard=false"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["eval_accuracy_before"] <= 0.4
    assert summary["eval_accuracy_after"] >= 0.8
    assert (out / "metrics.jsonl").is_file() and (out / "curves.png").is_file()
