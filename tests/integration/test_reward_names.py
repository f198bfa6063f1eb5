"""Rewards named by a file or module are logged and plotted by function name; the length panel starts at 0."""

import json

import pytest
from tiny_model import make_tiny_model

from grpokit.config.schema import load_config
from grpokit.run.log import reward_metric_name, reward_metric_names
from grpokit.run.plots import plot_training_curves, training_curves_figure
from grpokit.trainers.grpo import GRPOTrainer


def test_reward_metric_names():
    assert reward_metric_names(["math_accuracy", "rewards/my_rewards.py:brevity", "pkg.mod:fmt"]) == [
        "math_accuracy",
        "brevity",
        "fmt",
    ]
    # the same function name from two places keeps its file or module
    assert reward_metric_names(["lib/a.py:score", "b.py:score", "pkg.c:score"]) == [
        "a.score",
        "b.score",
        "c.score",
    ]
    assert reward_metric_name("/abs/path/my_rewards.py:brevity") == "brevity"


def test_training_logs_a_file_reward_by_its_function_name(tmp_path):
    rewards = tmp_path / "lib" / "my_rewards.py"
    rewards.parent.mkdir()
    rewards.write_text(
        "def brevity(prompts, completions, **kw):\n    return [-len(c) / 10 for c in completions]\n"
    )
    model, tok = make_tiny_model("qwen2", seed=0)
    cfg = load_config(
        None,
        [
            f"train.output_dir={tmp_path / 'run'}",
            "train.steps=1",
            "train.report_to=none",
            f"rewards=[{{name: '{rewards}:brevity'}}]",
            f"train.accuracy_reward={rewards}:brevity",
            "rollout.group_size=2",
            "rollout.prompts_per_step=2",
            "rollout.max_new_tokens=4",
            "data.template=plain",
            "model.device=cpu",
            "eval.enabled=false",
            "train.stop_after_flat_steps=0",
        ],
    )
    rows = [{"prompt": f"{a}+1="} for a in range(4)]
    trainer = GRPOTrainer(cfg, model=model, tokenizer=tok, train_rows=rows)
    assert trainer.reward_names == ["brevity"] and trainer.accuracy_name == "brevity"
    trainer.train()
    (line,) = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert "reward/brevity/mean" in line
    assert not any(":" in key or "my_rewards" in key for key in line)


def _write_run(path, reward_name):
    records = [
        {
            "step": step,
            "reward/total/mean": 0.5,
            f"reward/{reward_name}/mean": 0.5,
            # a length that only wobbles by +-2 tokens around 190
            "completion_len/mean": 190 + (2 if step % 2 else -2),
        }
        for step in range(1, 11)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.mark.parametrize(
    "name", ["brevity", "lib/my_rewards.py:brevity"], ids=["new-run", "older-run-with-path"]
)
def test_curves_label_the_reward_by_function_name(tmp_path, name):
    fig = training_curves_figure(_write_run(tmp_path / "metrics.jsonl", name))
    reward_axes, length_axes = fig.axes[0], fig.axes[3]
    assert [t.get_text() for t in reward_axes.get_legend().get_texts()] == ["total", "brevity"]
    bottom, top = length_axes.get_ylim()
    assert bottom == 0 and top >= 192  # a 2% wobble is drawn as the near-flat line it is


def test_curves_png_for_a_look(tmp_path):
    out = plot_training_curves(
        _write_run(tmp_path / "metrics.jsonl", "lib/my_rewards.py:brevity"), tmp_path / "c.png"
    )
    assert out.read_bytes()[:4] == b"\x89PNG"
