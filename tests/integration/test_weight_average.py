"""The average of the policy's weights (train.ema_decay; grpokit.train.weight_average): the average a run keeps is the
formula over the policies it passed through, checkpointed in ema/ and evaluated beside the policy; off, the run is
unchanged; refusals. (A resume takes it back bit for bit: tests/integration/test_resume_matrix.py, case ema.)"""

from __future__ import annotations

import json

import pytest
import torch
from grpo_runs import ROWS, has_seven
from tiny_model import make_tiny_model

from grpokit.config.schema import load_config
from grpokit.core.errors import ConfigError
from grpokit.model.checkpoint import load_weights_into
from grpokit.train.weight_average import EMA_DIR, WeightAverage
from grpokit.trainers.grpo import GRPOTrainer

RUN = [
    "train.samples_every=0", "train.tensorboard=false", "rollout.group_size=4", "rollout.prompts_per_step=2",
    "rollout.max_new_tokens=5", "optim.lr=3e-2", "data.template=plain", "model.device=cpu",
]  # fmt: skip


def trainer(out, *extra, eval_rows=None):
    model, tok = make_tiny_model("qwen2", seed=0)
    cfg = load_config(None, [*RUN, f"train.output_dir={out}", *extra])
    return GRPOTrainer(cfg, model=model, tokenizer=tok, train_rows=ROWS, eval_rows=eval_rows,
                       reward_functions=[("has_seven", has_seven, 1.0)])  # fmt: skip


def policy_at(folder) -> dict[str, torch.Tensor]:
    model = make_tiny_model("qwen2", seed=0)[0]
    load_weights_into(model, folder)
    return {n: p.detach() for n, p in model.named_parameters()}


def test_the_average_is_the_formula_over_the_policies_and_is_checkpointed(tmp_path):
    """decay 0.5 over 3 steps: ema = 0.5 theta_3 + 0.25 theta_2 + 0.125 theta_1 + 0.125 theta_0, from each step's
    checkpoint; step 3's ema/ folder holds it; the policy moved, so the comparison can fail."""
    run = trainer(tmp_path / "run", "train.steps=3", "train.save_every=1", "train.keep_checkpoints=3",
                  "train.ema_decay=0.5", "eval.enabled=false")  # fmt: skip
    theta0 = {n: p.detach().clone() for n, p in run.model.named_parameters()}
    run.train()
    ckpt = tmp_path / "run" / "checkpoints"
    thetas = [theta0, *(policy_at(ckpt / f"step_{s:06d}") for s in (1, 2, 3))]
    saved = policy_at(ckpt / "step_000003" / EMA_DIR)
    for name, p in run.parts.policy.average.model.named_parameters():
        want = 0.5 * thetas[3][name] + 0.25 * thetas[2][name] + 0.125 * thetas[1][name] + 0.125 * thetas[0][name]
        torch.testing.assert_close(p, want, rtol=0, atol=1e-6, msg=name)
        assert torch.equal(saved[name], p), name
    assert max(float((thetas[3][n] - theta0[n]).abs().max()) for n in theta0) > 1e-2


def test_the_average_is_evaluated_beside_the_policy_and_leaves_the_run_as_it_was(tmp_path):
    """eval.jsonl gains ema/accuracy (and the rest, ema/-named) beside the policy's; the policy's numbers and
    weights are the run's without the average (the average changes no rollout and no update)."""
    rows = ROWS[:4]
    plain = trainer(tmp_path / "plain", "train.steps=2", "eval.num_samples=2", eval_rows=rows)
    plain.train()
    averaged = trainer(tmp_path / "ema", "train.steps=2", "eval.num_samples=2", "train.ema_decay=0.9", eval_rows=rows)
    averaged.train()
    lines = [json.loads(line) for line in (tmp_path / "ema" / "eval.jsonl").read_text().splitlines()]
    plain_lines = [json.loads(line) for line in (tmp_path / "plain" / "eval.jsonl").read_text().splitlines()]
    assert all("ema/accuracy" in line and "ema/greedy_score" in line for line in lines)
    for line, plain_line in zip(lines, plain_lines, strict=True):
        assert {k: v for k, v in line.items() if not k.startswith("ema/")} == plain_line
    assert lines[0]["ema/accuracy"] == lines[0]["accuracy"]  # before training the average is the policy
    for name, p in averaged.model.named_parameters():
        assert torch.equal(p, dict(plain.model.named_parameters())[name]), name


def test_what_cannot_be_done_is_refused_by_name(tmp_path):
    with pytest.raises(ConfigError, match="train.ema_decay"):
        load_config(None, [*RUN, "train.ema_decay=1.0"])
    with pytest.raises(ValueError, match="decay"):
        WeightAverage(torch.nn.Linear(2, 2), 0.0)
