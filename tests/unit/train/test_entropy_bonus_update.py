"""The entropy bonus in the policy update (grpokit.train.update with algo.entropy_coef / adaptive_entropy): the
gradient of a fixed batch against a naive one-row-at-a-time oracle whatever the micro-batch split, padded or packed,
and the adaptive coefficient stepping after each optimizer step."""

import pytest
import torch
from tiny_model import make_tiny_model
from update_parts import assert_same_gradient, fixed_rollout, grads_of_one_step, make_learner

from grpokit.config.schema import resolve_algo
from grpokit.train.update import PolicyUpdate


def row_entropies(model, prompt: list[int], completion: list[int], temperature: float) -> torch.Tensor:
    """(len(completion),) the entropy of the policy at each completion position, one unpadded row: the oracle."""
    ids = torch.tensor([prompt + completion])  # (1, L)
    logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float() / temperature  # (Lc, V)
    logp = torch.log_softmax(logits, -1)  # (Lc, V)
    return -(logp.exp() * logp).sum(-1)  # (Lc,)


@pytest.mark.slow
def test_the_bonus_gradient_matches_a_naive_oracle_whatever_the_split():
    """Advantages 0 (no policy gradient): loss = -0.1 * (sum of the 10 completion tokens' entropies) / 10, its
    gradient the oracle's for 1 row or 4 rows per micro-batch, and packed; entropy_coef and entropy/bonus logged."""
    r, advantages = fixed_rollout(), torch.zeros(4)
    grads, metrics = {}, {}
    for name, extra in {"1": ["optim.micro_batch_size=1"], "4": ["optim.micro_batch_size=4"],
                        "packed": ["optim.packing=true"]}.items():  # fmt: skip
        learner, cfg = make_learner("algo.preset=grpo", "algo.beta=0", "algo.entropy_coef=0.1", *extra)
        updater = PolicyUpdate(learner, resolve_algo(cfg), cfg.optim, temperature=cfg.rollout.temperature, seed=0)
        out = {}
        run = lambda out=out, updater=updater: out.update(metrics=updater.update(r, advantages)[0])  # noqa: E731
        grads[name], metrics[name] = grads_of_one_step(learner, run), out["metrics"]
    model, _ = make_tiny_model("qwen2", seed=0)
    total = 0.0
    for i in range(4):
        prompt = r.prompt_ids[i][r.prompt_mask[i].bool()].tolist()
        completion = r.completion_ids[i][r.completion_mask[i].bool()].tolist()
        total = total + row_entropies(model, prompt, completion, cfg.rollout.temperature).sum()
    loss = -0.1 * total / 10
    loss.backward()
    for name in grads:
        assert_same_gradient(grads[name], model)
        assert metrics[name]["loss"] == pytest.approx(float(loss.detach()), rel=1e-5)
        assert metrics[name]["entropy_coef"] == 0.1
        assert metrics[name]["entropy/bonus"] == pytest.approx(float(total) / 10, rel=1e-5)


@pytest.mark.slow
def test_the_adaptive_coefficient_steps_after_each_optimizer_step():
    """Two mini-batches, target above any entropy, delta 0.01, from 0: the first step has no measurement (alpha 0),
    the second alpha 0.01 (logged as their mean, 0.005); after it c = 0.02 and the last entropy is the second's."""
    r, advantages = fixed_rollout(), torch.tensor([1.0, -0.5, 0.25, 2.0])
    learner, cfg = make_learner(
        "algo.preset=grpo", "algo.beta=0", "algo.adaptive_entropy=true", "algo.entropy_target=100",
        "algo.entropy_coef_delta=0.01", "optim.mini_batches=2",
    )  # fmt: skip
    updater = PolicyUpdate(learner, resolve_algo(cfg), cfg.optim, temperature=cfg.rollout.temperature, seed=0)
    metrics, _ = updater.update(r, advantages)
    assert metrics["entropy_coef"] == pytest.approx(0.005, abs=1e-15)
    state = updater.entropy_state()
    assert state["coef"] == pytest.approx(0.02, abs=1e-15) and 0 < state["last_entropy"] < 100
    # above the target the coefficient walks back down, and the bonus is off at once
    updater.entropy_control.last_entropy = 0.5
    updater.algo = resolve_algo(cfg).override(entropy_target=0.1)
    metrics, _ = updater.update(r, advantages)
    assert metrics["entropy_coef"] == 0.0 and updater.entropy_state()["coef"] == pytest.approx(0.0, abs=1e-15)
