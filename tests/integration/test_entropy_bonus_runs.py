"""The adaptive entropy bonus in a run (tiny real Qwen2, CPU): its coefficient is saved in every checkpoint, and a run
resumed from one continues bit for bit as the run that was not stopped (the coefficient does not restart)."""

import json

import pytest
import torch
from tiny_model import make_tiny_model

from grpokit.config.schema import load_config
from grpokit.trainers.grpo import GRPOTrainer

ROWS = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(5) for b in range(5)]


def has_seven(prompts, completions, **kw):
    return [float("7" in c) for c in completions]


def make_trainer(out, steps, **kwargs):
    cfg = load_config(
        None,
        [
            f"train.steps={steps}", "train.save_every=1", "train.samples_every=0", "train.tensorboard=false",
            "rollout.group_size=4", "rollout.prompts_per_step=2", "rollout.max_new_tokens=4", "optim.lr=3e-3",
            "optim.mini_batches=2", "data.template=plain", "model.device=cpu", "eval.enabled=false",
            f"train.output_dir={out}", "algo.adaptive_entropy=true", "algo.entropy_target=100",
            "algo.entropy_coef_delta=0.01",
        ],
    )  # fmt: skip
    model, tok = make_tiny_model("qwen2", seed=0)
    return GRPOTrainer(
        cfg, model=model, tokenizer=tok, train_rows=ROWS, reward_functions=[("has_seven", has_seven, 1.0)], **kwargs
    )


def lines(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_a_resumed_run_continues_the_coefficient_bit_for_bit(tmp_path):
    whole = make_trainer(tmp_path / "whole", 3)
    whole.train()
    stopped = tmp_path / "stopped"
    make_trainer(stopped, 2).train()
    state = torch.load(stopped / "checkpoints" / "step_000002" / "trainer_state.pt", weights_only=False)
    # 2 optimizer steps per grpokit step, +0.01 each (the entropy is below the target 100): c = 0.04 after step 2
    assert state["entropy_control"]["coef"] == pytest.approx(0.04, abs=1e-15)
    resumed = make_trainer(stopped, 3, resume=True)
    resumed.train()
    a, b = lines(tmp_path / "whole")[-1], lines(stopped)[-1]
    assert a["step"] == b["step"] == 3
    assert a["entropy_coef"] == b["entropy_coef"] == pytest.approx(0.045, abs=1e-15)  # alphas 0.04 and 0.05
    for key in ("loss", "entropy/bonus", "grad_norm", "entropy"):
        assert a[key] == b[key], key
    assert resumed.updater.entropy_state() == whole.updater.entropy_state()
