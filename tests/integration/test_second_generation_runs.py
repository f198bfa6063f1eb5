"""The second-generation objectives (issue 35) train a tiny real model end to end: each preset and mask, two
steps with two optimizer steps each (so the ratio, the clips and the masks see a policy that moved), finite
losses, weights that change, and the metrics of each mask written."""

from __future__ import annotations

import json

import pytest
import torch
from tiny_model import ADDITION_ROWS, SMALL_RUN, make_tiny_model

from grpokit import GRPOTrainer, load_config

CASES = {
    "cispo": ["algo.preset=cispo"],
    "sapo": ["algo.preset=sapo"],
    "gmpo": ["algo.preset=gmpo"],
    "dppo_tv": ["algo.preset=dppo_tv"],
    "dppo_kl": ["algo.preset=dppo_kl"],
    "luspo": ["algo.preset=luspo"],
    "vespo": ["algo.preset=vespo"],
    "kl_cov": ["algo.preset=grpo", "algo.cov_penalty=kl_cov", "algo.cov_ratio=0.1"],
    "clip_cov": ["algo.preset=grpo", "algo.cov_penalty=clip_cov", "algo.cov_ratio=0.1", "algo.clip_cov_lb=0"],
    "masks": [
        "algo.preset=grpo",
        "algo.off_policy_mask=0.0",
        "algo.top_entropy_quantile=0.2",
        "algo.kl_is_correction=true",
    ],
}


def distinct_characters(completions, **kw):
    """A reward that nearly always differs between two random completions, so every group carries a signal."""
    return [float(len(set(c))) for c in completions]


def length_reward(completions, **kw):
    """A second reward on another scale (characters), for GDPO's per-reward normalisation."""
    return [float(len(c)) for c in completions]


def trainer(out, *overrides: str, rewards=None) -> GRPOTrainer:
    model, tok = make_tiny_model("qwen2", seed=0)
    cfg = load_config(
        None,
        [
            f"train.output_dir={out}",
            "train.steps=1",
            *SMALL_RUN,
            "optim.mini_batches=2",
            "optim.lr=1e-3",
            *overrides,
        ],
    )
    rewards = rewards or [("distinct_characters", distinct_characters, 1.0)]
    return GRPOTrainer(cfg, model=model, tokenizer=tok, train_rows=ADDITION_ROWS, reward_functions=rewards)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_each_objective_trains_a_tiny_model(tmp_path, name):
    run = trainer(tmp_path, *CASES[name])
    before = [p.detach().clone() for p in run.model.parameters()]
    run.train()
    moved = sum(float((p.detach() - b).abs().sum()) for p, b in zip(run.model.parameters(), before))
    assert moved > 0, f"{name}: no parameter changed"
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines[0]["zero_variance_frac"] < 1  # a signal to train on
    assert len(lines) == 1 and all(torch.isfinite(torch.tensor(line["loss"])) for line in lines)
    assert all(line["entropy/trained"] > 0 for line in lines)
    assert all(isinstance(line["cov/logp_adv"], float) for line in lines)
    if name == "kl_cov":
        assert 0 < lines[0]["cov_penalised_frac"] < 0.3  # max(1, int(0.1 n)) of each mini-batch's n tokens
    if name == "clip_cov":
        assert 0 < lines[0]["masked_frac/clip_cov"] < 0.3
    if name.startswith("dppo"):
        assert all("masked_frac/trust_region" in line for line in lines)
    if name == "masks":
        # top 20% by entropy: about 80% of the loss tokens dropped; off_policy_mask=0 drops every A < 0 row
        # whose sampler is even slightly off
        assert all(0.5 < line["masked_frac/entropy"] < 1.0 for line in lines)
        assert all(line["entropy/trained"] > line["entropy"] for line in lines)  # the forking tokens
        assert all("masked_frac/off_policy" in line for line in lines)


@pytest.mark.slow
def test_the_masks_chosen_over_the_mini_batch_leave_the_gradient_unchanged_by_the_split(tmp_path):
    """CISPO with the top-entropy, Clip-Cov and off-policy masks on: one micro-batch or micro-batches of one row
    (same seed, same rollout) give the same gradients, since the masks choose their tokens over the mini-batch."""
    knobs = [
        "algo.preset=cispo",
        "algo.top_entropy_quantile=0.3",
        "algo.cov_penalty=clip_cov",
        "algo.cov_ratio=0.2",
        "algo.clip_cov_lb=-10",
        "algo.off_policy_mask=0.0",
        "rollout.max_new_tokens=8",
        "rollout.prompts_per_step=3",
    ]
    grads = {}
    for micro in (16, 1):
        run = trainer(tmp_path / f"micro{micro}", *knobs, f"optim.micro_batch_size={micro}")
        seen = grads[micro] = []
        run.learner.optimizer.register_step_pre_hook(
            lambda *_, g=seen, m=run.model: g.extend(p.grad.detach().clone() for p in m.parameters())
        )
        metrics = run.train_step()
        assert 0 < metrics["masked_frac/entropy"] < 1 and metrics["masked_frac/clip_cov"] > 0
    assert len(grads[16]) == len(grads[1]) > 0
    for a, b in zip(grads[16], grads[1]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_gdpo_trains_on_two_rewards_of_different_scales(tmp_path):
    """algo.reward_aggregation=normalize_then_sum with the batch-whitened advantage (TRL's GDPO): the advantages
    are those of the per-reward group z-scores summed, not of the summed rewards."""
    from grpokit.algos.advantages import batch_whitened_advantages
    from grpokit.algos.multi_reward import normalize_then_sum
    from grpokit.train import advantages as step_advantages

    rewards = [("distinct_characters", distinct_characters, 1.0), ("length_reward", length_reward, 0.5)]
    knobs = [
        "algo.reward_aggregation=normalize_then_sum",
        "algo.advantage=batch_whiten",
        "rollout.group_size=4",
    ]
    run = trainer(tmp_path, *knobs, "rollout.max_new_tokens=8", rewards=rewards)
    seen = []
    original = step_advantages.gdpo_rewards
    step_advantages.gdpo_rewards = lambda batch, w, G: seen.append((batch, w)) or original(batch, w, G)
    try:
        before = [p.detach().clone() for p in run.model.parameters()]
        run.train()
    finally:
        step_advantages.gdpo_rewards = original
    assert seen and seen[0][1] == {"distinct_characters": 1.0, "length_reward": 0.5}
    batch = seen[0][0]
    table = torch.tensor([batch.per_function["distinct_characters"], batch.per_function["length_reward"]]).T
    want = normalize_then_sum(table.double(), torch.tensor([1.0, 0.5], dtype=torch.float64), 4)
    assert not torch.allclose(
        batch_whitened_advantages(want), batch_whitened_advantages(batch.rewards.double())
    )
    moved = sum(float((p.detach() - b).abs().sum()) for p, b in zip(run.model.parameters(), before))
    assert moved > 0
