"""grpokit.algos.token_terms: the clipped loss taken apart per token gives back policy_loss exactly."""

import math

import pytest
import torch

from grpokit.algos import policy_loss
from grpokit.algos.token_terms import aggregate, token_terms


def _batch(seed=0, B=5, T=7):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(B, T, generator=g) * 3
    old = logp + (torch.rand(B, T, generator=g) - 0.5) * 0.8  # ratios well outside [0.8, 1.2] for some
    ref = logp + (torch.rand(B, T, generator=g) - 0.5)
    adv = torch.randn(B, generator=g)
    mask = torch.ones(B, T)
    mask[1, 4:] = 0
    mask[3, 2:] = 0
    return logp, old, ref, adv, mask


@pytest.mark.parametrize("agg", ["seq-mean-token-mean", "token-mean", "seq-sum-norm"])
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("dual_clip", [None, 3.0])
def test_terms_aggregate_to_policy_loss(agg, level, dual_clip):
    logp, old, ref, adv, mask = _batch()
    kw = dict(eps_low=0.2, eps_high=0.28, ratio_level=level, beta=0.04, kl_kind="k3", dual_clip=dual_clip)
    loss, stats = policy_loss(logp, old, adv, mask, ref_logprobs=ref, agg=agg, norm_len=7.0, **kw)
    terms = token_terms(logp, old, adv, mask, ref_logprobs=ref, **kw)
    assert float(aggregate(terms["loss"], mask, agg=agg, norm_len=7.0)) == pytest.approx(float(loss), rel=1e-6)
    n = mask.sum()
    assert float((terms["clip"] == -1).sum() / n) == pytest.approx(float(stats["clip_frac_low"]), abs=1e-7)
    assert float((terms["clip"] == 1).sum() / n) == pytest.approx(float(stats["clip_frac_high"]), abs=1e-7)
    assert float(terms["kl"][mask.bool()].sum() / n) == pytest.approx(float(stats["kl_mean"]), rel=1e-6)
    if level == "token":
        assert float(terms["clip"].abs().sum()) > 0  # the batch does exercise clipping


def test_one_token_by_hand():
    # A = 1, logp - old = 0.3: rho = e^0.3 = 1.34986 > 1.2, clipped above, pg = -min(1.34986, 1.2) = -1.2
    t = token_terms(torch.tensor([[0.3]]), torch.tensor([[0.0]]), torch.tensor([1.0]), torch.ones(1, 1))
    assert float(t["ratio"]) == pytest.approx(math.exp(0.3))
    assert float(t["clip"]) == 1.0 and float(t["pg"]) == pytest.approx(-1.2)
    assert math.isnan(float(t["kl"]))  # no reference


def _masked_batch(seed=1, B=6, T=5):
    g = torch.Generator().manual_seed(seed)
    logp = (-torch.rand(B, T, generator=g, dtype=torch.float64) * 2 - 0.1).requires_grad_()
    sample = logp.detach() + torch.rand(B, T, generator=g, dtype=torch.float64)  # KL to the sampler in (0, 1)
    adv = torch.tensor([1.0, -1.0, -0.5, 2.0, -2.0, 0.5], dtype=torch.float64)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[2, 3:] = False
    return logp, sample, adv, mask


# one setting per mask kind: (kwargs of the loss, its bit in token_terms' "masks", whether it zeroes the gradient)
MASK_CASES = {
    "trust_region": (dict(surrogate="dppo_tv", eps_low=0.05, eps_high=0.05), 1, True),
    "off_policy": (dict(off_policy_mask=0.5), 2, True),
    "entropy": (dict(entropy_mask="half"), 4, True),
    "clip_cov": (dict(cov_penalty="clip_cov", cov_mask="some"), 8, True),
    "kl_cov": (dict(cov_penalty="kl_cov", cov_mask="some", kl_cov_coef=3.0), 16, False),
}


@pytest.mark.parametrize("reason", list(MASK_CASES))
def test_the_per_token_masks_are_the_ones_the_loss_trained_on(reason):
    """token_terms' "masks" names exactly the tokens each mask acted on in policy_loss: those whose gradient the loss
    zeroes (or, KL-Cov, changes), and its pg aggregates to the loss. Before, token_terms repeated the surrogate's
    call and left every mask out (no "masks", and a pg the loss never trained on)."""
    logp, sample, adv, mask = _masked_batch()
    kw, bit, zeroes = MASK_CASES[reason]
    kw = dict(kw)
    g = torch.Generator().manual_seed(7)
    if kw.get("entropy_mask") == "half":
        kw["entropy_mask"] = torch.rand(logp.shape, generator=g) < 0.5
    if kw.get("cov_mask") == "some":
        kw["cov_mask"] = torch.rand(logp.shape, generator=g) < 0.3
    # old log-probs away from logp where the mask reads them (DPPO's region, KL-Cov's |logp - old|); elsewhere the
    # ratio is 1, so that no clipping zeroes a gradient
    shift = torch.linspace(-0.4, 0.4, logp.numel(), dtype=torch.float64).reshape(logp.shape)
    old = logp.detach() + (shift if reason in ("trust_region", "kl_cov") else 0.0)
    loss, stats = policy_loss(logp, old, adv, mask, sample_logprobs=sample, agg="token-mean", **kw)
    (grad,) = torch.autograd.grad(loss, logp)
    terms = token_terms(logp, old, adv, mask, sample_logprobs=sample, agg="token-mean", **kw)
    acted = (terms["masks"] & bit) != 0  # (B, T)
    assert 0 < int(acted.sum()) < int(mask.sum())  # the batch exercises the mask, on some tokens only
    assert int((terms["masks"] & ~bit).sum()) == 0  # no other reason shows
    # token_terms works in float32 (what the rollouts save)
    assert float(aggregate(terms["loss"], mask, agg="token-mean")) == pytest.approx(float(loss.detach()), rel=1e-6)
    if zeroes:  # the loss gives those tokens no gradient, and a nonzero one to every other
        assert torch.equal(grad == 0, acted | ~mask)
        assert float(stats[f"masked_frac/{reason}"]) == pytest.approx(float(acted.sum() / mask.sum()))
    else:  # KL-Cov: the penalty coef * |logp - old| changes the gradient exactly there, by coef * sign / N
        (plain,) = torch.autograd.grad(policy_loss(logp, old, adv, mask, agg="token-mean")[0], logp)
        extra = grad - plain  # (B, T)
        assert torch.allclose(extra[acted], 3.0 * torch.sign(logp - old)[acted] / mask.sum(), rtol=1e-12)
        assert torch.equal(extra[~acted], torch.zeros_like(extra[~acted]))
        assert float(stats["cov_penalised_frac"]) == pytest.approx(float(acted.sum() / mask.sum()))
