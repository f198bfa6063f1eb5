"""The embedded demo's process-reward variant: its rule-based step checks, its CLI wiring, a short run."""

import random

from grpokit.cli.main import main
from grpokit.demos import steps as demo_steps
from grpokit.demos.default import prepare_demo
from grpokit.demos.steps import StepsSpec, make_problems, step_checks, teacher
from grpokit.demos.variants import demo_variant

SMALL = StepsSpec(max_operand=5, eval_size=16, hidden_size=32, sft_steps=10, sft_batch=16)


def test_each_step_is_checked_by_rule():
    prompts = ["3+14+9="] * 5
    completions = [
        "17 26 <answer>26</answer>",  # all right
        "18 27 <answer>27</answer>",  # the first sum off by one: every step after it is wrong too
        "18 26 <answer>26</answer>",  # a wrong first step, then right: process rewards tell them apart
        "17 26",  # no answer: the last step is scored as the answer
        "",  # no steps at all
    ]
    assert step_checks(prompts, completions) == [
        [(3, 1.0), (6, 1.0), (25, 1.0)],
        [(3, 0.0), (6, 0.0), (25, 0.0)],
        [(3, 0.0), (6, 1.0), (25, 1.0)],
        [(3, 1.0), (5, 0.0)],
        [],
    ]
    assert step_checks.step_rewards is True


def test_the_teacher_is_right_about_a_third_of_the_time_per_step():
    train, held_out = make_problems(StepsSpec())
    assert len(train) + len(held_out) == 30**3 and not {r["prompt"] for r in train} & {
        r["prompt"] for r in held_out
    }
    write, rng = teacher(StepsSpec()), random.Random(0)
    rows = train[:2000]
    scores = step_checks([r["prompt"] for r in rows], [write(r, rng) for r in rows])
    first = sum(s[0][1] for s in scores) / len(rows)
    answer = sum(s[-1][1] for s in scores) / len(rows)
    assert abs(first - 0.35) < 0.04  # step_right
    assert abs(answer - (0.35**2 + 2 * 0.45 * 0.2)) < 0.04  # both right, or +1 then -1 (either order): 0.30


def test_the_cli_picks_the_variant_and_leaves_the_default_demo_alone(capsys):
    assert demo_variant(["data.train=demo_steps", "train.steps=3"]) == ("demo_steps", ["train.steps=3"])
    assert demo_variant(["train.steps=3"]) == (None, ["train.steps=3"])
    assert main(["train", "--print-config", "data.train=demo_steps", "train.steps=3"]) == 0
    text = capsys.readouterr().out
    assert "preset: grpo_process" in text and "grpokit.demos.steps:step_checks" in text and "steps: 3" in text
    assert main(["train", "--print-config"]) == 0
    text = capsys.readouterr().out
    assert "preset: grpo\n" in text.replace("  #", "\n") or "preset: grpo " in text
    assert "math_accuracy" in text and "step_checks" not in text


def test_a_short_process_supervised_run_on_a_small_warm_start(tmp_path):
    from grpokit.config.schema import apply_overrides, config_from_dict
    from grpokit.trainers.grpo import GRPOTrainer

    paths = prepare_demo(
        SMALL, cache=tmp_path, log=lambda m: None, problems=make_problems, teacher=teacher(SMALL), prefix="s"
    )
    values = apply_overrides(
        demo_steps.overrides(paths),
        [
            f"train.output_dir={tmp_path / 'run'}",
            "train.steps=2",
            "eval.enabled=false",
            "rollout.prompts_per_step=2",
            "rollout.group_size=4",
            "rollout.max_new_tokens=8",
        ],
    )
    trainer = GRPOTrainer(config_from_dict(values))
    metrics = trainer.train_step()
    assert metrics["advantage/abs_mean"] >= 0 and "reward/step_checks/mean" in metrics
    assert trainer.sampler.rewards.functions[0][1] is step_checks
