"""The loss's settings are one LossOptions (the last review: policy_loss and loss_terms each repeated a
~20-keyword signature): passing the options or the same settings as keywords gives the same numbers, an
unknown setting is an error naming the known ones, and every algo.* the loss reads maps to one field."""

import dataclasses

import pytest
import torch

from grpokit.algos import LossOptions, policy_loss
from grpokit.algos.loss import loss_terms
from grpokit.config.schema import load_config, resolve_algo

F64 = torch.float64


def batch():
    g = torch.Generator().manual_seed(0)
    logp = (-torch.rand(3, 5, generator=g, dtype=F64)).requires_grad_()
    old = logp.detach() + 0.3 * torch.randn(3, 5, generator=g, dtype=F64)
    ref = logp.detach() + 0.1 * torch.randn(3, 5, generator=g, dtype=F64)
    adv = torch.tensor([1.0, -0.5, 0.25], dtype=F64)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]])
    return logp, old, adv, mask, ref


def test_options_and_keywords_give_the_same_loss_and_gradient():
    logp, old, adv, mask, ref = batch()
    settings = {"eps_low": 0.1, "eps_high": 0.28, "agg": "token-mean", "beta": 0.04, "dual_clip": 3.0}
    by_keywords, m1 = policy_loss(logp, old, adv, mask, ref_logprobs=ref, **settings)
    (g1,) = torch.autograd.grad(by_keywords, logp)
    by_options, m2 = policy_loss(logp, old, adv, mask, LossOptions(**settings), ref_logprobs=ref)
    (g2,) = torch.autograd.grad(by_options, logp)
    assert by_options.item() == by_keywords.item() and torch.equal(g1, g2)
    assert {k: v.item() for k, v in m1.items()} == {k: v.item() for k, v in m2.items()}
    # a keyword replaces the options' value: eps_high 0.01 over options holding 0.28 is the 0.01 loss (it clips)
    mixed, _ = policy_loss(logp, old, adv, mask, LossOptions(**settings), ref_logprobs=ref, eps_high=0.01)
    plain, _ = policy_loss(logp, old, adv, mask, ref_logprobs=ref, **{**settings, "eps_high": 0.01})
    assert mixed.item() == plain.item() != by_options.item()
    terms = loss_terms(logp, old, adv, mask, LossOptions(**settings), ref_logprobs=ref)
    assert torch.equal(terms.loss, loss_terms(logp, old, adv, mask, ref_logprobs=ref, **settings).loss)


def test_an_unknown_setting_names_the_known_ones():
    logp, old, adv, mask, _ = batch()
    with pytest.raises(
        TypeError, match=r"unknown loss option 'eps_hi'; LossOptions has: eps_low, eps_high, "
    ):
        policy_loss(logp, old, adv, mask, eps_hi=0.28)
    with pytest.raises(TypeError, match="unknown loss option 'eps_hi'"):
        loss_terms(logp, old, adv, mask, eps_hi=0.28)


@pytest.mark.parametrize("preset", ["grpo", "dapo", "dr_grpo", "gspo", "cispo", "sapo", "dppo_tv"])
def test_a_config_becomes_the_options_in_one_place(preset):
    """AlgoSettings.loss_options() is what the update passes (train/update.py), and loss_kwargs() (what saved
    rollouts record) is the same options as keywords, the entropy bonus's per-step alpha left out."""
    algo = resolve_algo(load_config(None, [f"algo.preset={preset}", "algo.off_policy_mask=0.5"]))
    options = algo.loss_options()
    kwargs = algo.loss_kwargs()
    assert set(kwargs) == {f.name for f in dataclasses.fields(LossOptions)} - {"entropy_coef"}
    assert LossOptions(**kwargs) == options and options.off_policy_mask == 0.5
    assert options.agg == algo.loss.agg and options.norm_len == algo.loss.norm_len
    assert options.surrogate == algo.ratio.surrogate and options.eps_high == algo.ratio.eps_high
