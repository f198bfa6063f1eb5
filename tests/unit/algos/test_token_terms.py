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
