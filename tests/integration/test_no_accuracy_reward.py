"""A reward list with no accuracy reward trains, as TRL's does (issue 38): TRL's quickstart rewards
completions by length alone (`reward_len`); grpokit refused it with "which reward is accuracy?" (exit 2).
Now the run trains on the total reward, logs no accuracy metric, evaluates nothing (there is no verifier
to score held-out rows) and says so in one line when it starts."""

import json

import pytest
from grpo_runs import ROWS, make_cfg
from tiny_model import make_tiny_model

from grpokit.rewards.which_accuracy import pick_accuracy_reward
from grpokit.trainers.grpo import GRPOTrainer


def reward_len(completions, **kwargs):
    """TRL's quickstart reward: completions near 20 characters score best."""
    return [-abs(20 - len(c)) for c in completions]


def test_only_shaping_rewards_choose_no_accuracy_reward_and_say_why():
    name, why = pick_accuracy_reward(["reward_len"], None)
    assert name is None and "no accuracy metric" in why and "train.accuracy_reward" in why
    assert pick_accuracy_reward(["format_strict", "overlong_penalty"], None)[0] is None
    assert pick_accuracy_reward(["reward_len", "math_accuracy"], None)[0] == "math_accuracy"  # unchanged


@pytest.mark.slow
def test_run_with_reward_len_alone_trains_without_accuracy(tmp_path, capsys):
    model, tok = make_tiny_model("qwen2", seed=0)
    trainer = GRPOTrainer(
        make_cfg(tmp_path, "train.steps=2"), model=model, tokenizer=tok, train_rows=ROWS, eval_rows=ROWS[:8],
        reward_functions=[("reward_len", reward_len, 1.0)],
    )  # fmt: skip
    before = [p.detach().clone() for p in trainer.model.parameters()]
    summary = trainer.train()
    assert summary["steps"] == 2
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 2 and all("reward/reward_len/mean" in m for m in lines)
    assert not any("accuracy" in m or "completion_len/correct" in m for m in lines)
    assert "eval_accuracy_after" not in summary
    assert any(not (p == q).all() for p, q in zip(before, trainer.model.parameters()))  # it learnt something
    err = capsys.readouterr().err
    notices = [line for line in err.splitlines() if line.startswith("accuracy:")]
    assert len(notices) == 1 and "all format/length ones" in notices[0]
