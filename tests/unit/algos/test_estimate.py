"""The trainer with token-level advantages and a KL in the reward (REINFORCE++), on a tiny real model."""

import pytest
import torch
from grpo_runs import make_trainer, spies

from grpokit.algos import reinforce_pp_advantages


def test_reinforce_pp_puts_k1_in_the_reward_and_logs_kl(tmp_path):
    seen = {}  # what the sampler returned and the update was given (grpo_runs.spies)
    trainer = make_trainer(
        tmp_path, "algo.preset=reinforce_pp", "optim.mini_batches=1", "train.samples_every=0", **spies(seen)
    )
    assert trainer.algo.uses_reference and trainer.algo.kl.beta == 0.0  # the KL is in the reward only
    with torch.no_grad():  # move the policy away from its frozen reference so that k1 != 0
        for p in trainer.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    metrics = trainer.train_step()
    batch, adv, old, ref = seen["batch"], seen["advantages"], seen["old"], seen["ref"]
    mask = batch.rollout.completion_mask
    assert adv.shape == mask.shape  # (N, Lc) token-level
    k1 = old - ref  # (N, Lc)
    assert k1[mask.bool()].abs().max() > 1e-3
    want = reinforce_pp_advantages(batch.rewards, mask, kl=k1, kl_coef=0.01)
    torch.testing.assert_close(adv.cpu(), want, rtol=0, atol=1e-5)
    without_kl = reinforce_pp_advantages(batch.rewards, mask)
    assert (adv.cpu() - without_kl)[mask.bool()].abs().max() > 1e-4  # the KL term really changed them
    assert adv[mask.bool()].sum().abs() < 1e-3  # whitened per token over the batch
    assert "kl" in metrics and metrics["kl"] != 0.0


def test_kl_is_logged_whenever_there_is_a_reference(tmp_path):
    no_ref = make_trainer(
        tmp_path / "dapo", "algo.preset=dapo", "algo.dynamic_sampling=false", "train.samples_every=0"
    )
    assert not no_ref.algo.uses_reference and "kl" not in no_ref.train_step()
    kl_reward_only = make_trainer(
        tmp_path / "dr",
        "algo.preset=dr_grpo",
        "algo.kl_reward_coef=0.1",
        "optim.mini_batches=1",
        "train.samples_every=0",
    )
    assert kl_reward_only.algo.uses_reference and "kl" in kl_reward_only.train_step()


@pytest.mark.parametrize("preset", ["reinforce_pp", "reinforce_pp_baseline"])
def test_micro_batch_split_leaves_the_gradient_unchanged_with_token_advantages(tmp_path, preset):
    results = {}
    for micro in (16, 3):
        trainer = make_trainer(
            tmp_path / f"micro{micro}",
            f"algo.preset={preset}",
            f"optim.micro_batch_size={micro}",
            "optim.mini_batches=1",
            "rollout.max_new_tokens=10",
            "train.samples_every=0",
            eos_ids=[1, *range(30, 40)],  # frequent EOS ids: completions of many lengths
        )
        grads = []
        trainer.learner.optimizer.register_step_pre_hook(
            lambda *_, g=grads, m=trainer.model: g.extend(p.grad.detach().clone() for p in m.parameters())
        )
        results[micro] = (grads, trainer.train_step())
    (g_one, m_one), (g_split, m_split) = results[16], results[3]
    assert len(g_one) == len(g_split) > 0
    assert m_one["completion_len/min"] < m_one["completion_len/max"]  # ragged masks
    for a, b in zip(g_one, g_split):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert m_one["loss"] == pytest.approx(m_split["loss"], rel=1e-5, abs=1e-7)
