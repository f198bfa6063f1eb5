"""End-to-end training on tiny real transformers: the loop, metrics, checkpoints, resume."""

import json

import pytest
import torch
from tiny_model import make_tiny_model
from transformers import AutoModelForCausalLM

from grpokit.config import load_config
from grpokit.trainer import GRPOTrainer

ROWS = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(6) for b in range(6)]

STEP_FIELDS = [
    "reward/total/mean",
    "reward/has_seven/mean",
    "accuracy",
    "zero_variance_frac",
    "completion_len/mean",
    "completion_len/correct",
    "completion_len/incorrect",
    "truncated_frac",
    "kl",
    "clip_frac_low",
    "clip_frac_high",
    "entropy",
    "grad_norm",
    "lr",
    "time/generation",
    "time/scoring",
    "time/reference",
    "time/update",
    "tokens_per_s",
    "peak_memory_mb",
    "sampler_logprob_diff/mean",
    "sampler_logprob_diff/max",
]


def has_seven(prompts, completions, **kw):
    """1 when the completion contains the character 7: a task a random tiny model can learn."""
    return [float("7" in c) for c in completions]


def make_cfg(tmp_path, *extra):
    return load_config(
        None,
        [
            f"train.output_dir={tmp_path / 'run'}",
            "train.steps=3",
            "train.samples_every=1",
            "rollout.group_size=4",
            "rollout.prompts_per_step=4",
            "rollout.max_new_tokens=6",
            "optim.lr=3e-3",
            "optim.micro_batch_size=6",
            "optim.mini_batches=2",
            "data.template=plain",
            "model.device=cpu",
            "algo.preset=grpo",
            "eval.num_samples=2",
            *extra,
        ],
    )


def make_trainer(tmp_path, *extra, seed=0, resume=False):
    model, tok = make_tiny_model("qwen2", seed=seed)
    return GRPOTrainer(
        make_cfg(tmp_path, *extra),
        model=model,
        tokenizer=tok,
        train_rows=ROWS,
        eval_rows=ROWS[:8],
        reward_functions=[("has_seven", has_seven, 1.0)],
        resume=resume,
    )


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_end_to_end_metrics_checkpoint_and_reload(tmp_path):
    trainer = make_trainer(tmp_path)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    summary = trainer.train()
    changed = [not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters())]
    assert all(changed), "every parameter should receive an update"

    run = tmp_path / "run"
    lines = read_jsonl(run / "metrics.jsonl")
    assert [line["step"] for line in lines] == [1, 2, 3]
    for field in STEP_FIELDS:
        assert field in lines[-1], f"metrics.jsonl lacks {field}"
    assert lines[-1]["kl"] > 0  # the policy moved away from the beta=0.04 reference
    assert (run / "config.yaml").is_file() and (run / "curves.png").stat().st_size > 10_000
    assert (run / "tensorboard").is_dir() and list((run / "samples").glob("step_*.jsonl"))
    assert {"eval_accuracy_before", "eval_accuracy_after"} <= set(json.loads((run / "summary.json").read_text()))

    reloaded = AutoModelForCausalLM.from_pretrained(summary["checkpoint"])
    for (name, p), q in zip(trainer.model.named_parameters(), reloaded.parameters()):
        assert torch.equal(p, q), name


def test_resume_reproduces_uninterrupted_run(tmp_path):
    keys = ["reward/total/mean", "loss", "kl", "grad_norm", "entropy", "clip_frac", "completion_len/mean"]
    straight = make_trainer(tmp_path / "a", "train.steps=4")
    straight.train()
    want = read_jsonl(tmp_path / "a" / "run" / "metrics.jsonl")[3]

    first = make_trainer(tmp_path / "b", "train.steps=3", "train.save_every=1")
    first.train()  # stops after step 3, checkpoint at step 3
    second = make_trainer(tmp_path / "b", "train.steps=4", resume=True)
    assert second.step == 3
    second.train()
    got = read_jsonl(tmp_path / "b" / "run" / "metrics.jsonl")
    assert [line["step"] for line in got] == [1, 2, 3, 4]
    for k in keys:
        assert got[3][k] == pytest.approx(want[k], rel=1e-5, abs=1e-7), k


def test_reward_rises_on_a_tiny_task(tmp_path):
    trainer = make_trainer(
        tmp_path,
        "train.steps=25",
        "train.samples_every=0",
        "rollout.prompts_per_step=8",
        "rollout.group_size=8",
        "optim.mini_batches=1",
        "optim.micro_batch_size=64",
        "algo.beta=0.0",
        "eval.enabled=false",
        "train.tensorboard=false",
    )
    trainer.train()
    lines = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    early = sum(line["reward/total/mean"] for line in lines[:5]) / 5
    late = sum(line["reward/total/mean"] for line in lines[-5:]) / 5
    assert late > early + 0.25, (early, late)


@pytest.mark.parametrize("preset", ["dr_grpo", "dapo", "gspo", "rloo", "reinforce_pp"])
def test_every_preset_trains(tmp_path, preset):
    trainer = make_trainer(tmp_path, f"algo.preset={preset}", "train.steps=1", "eval.enabled=false",
                           "algo.max_sampling_rounds=20")
    trainer.train()
    line = read_jsonl(tmp_path / "run" / "metrics.jsonl")[-1]
    if preset == "dapo":
        # the random model never ends within 6 tokens: overlong shaping scores every completion and
        # overlong filtering masks every one of them out of the loss, so no gradient flows
        assert line["truncated_frac"] == 1.0 and line["reward/overlong_penalty/mean"] < 0
        assert line["grad_norm"] == 0.0
    else:
        assert line["grad_norm"] > 0


def test_dynamic_sampling_gives_up_with_clear_error(tmp_path):
    from grpokit.trainer import TrainingError

    model, tok = make_tiny_model("qwen2", seed=0)
    cfg = make_cfg(
        tmp_path, "algo.preset=dapo", "algo.overlong_shaping=false", "algo.max_sampling_rounds=1", "eval.enabled=false"
    )
    constant = [("always_one", lambda prompts, completions, **kw: [1.0] * len(completions), 1.0)]
    trainer = GRPOTrainer(cfg, model=model, tokenizer=tok, train_rows=ROWS, reward_functions=constant)
    with pytest.raises(TrainingError, match=r"dynamic sampling: after 2 sampling rounds only 0 of 4 groups"):
        trainer.train()
