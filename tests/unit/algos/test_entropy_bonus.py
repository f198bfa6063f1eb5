"""The entropy bonus (grpokit.algos.entropy_bonus, policy_loss's entropy / entropy_coef) and its adaptive coefficient
(Skywork-OR1): values and gradients worked by hand, a gradient check of the differentiable entropy, the controller's
sequence by hand, and the micro-batch split."""

from __future__ import annotations

import math

import pytest
import torch

from grpokit.algos import policy_loss
from grpokit.algos.entropy import entropy_from_logits, entropy_with_grad
from grpokit.algos.entropy_bonus import EntropyControl


def bonus_only(H, mask, coef, **kw):
    """policy_loss with advantages 0 (no policy gradient, ratio 1): only the bonus is left."""
    logp = torch.full(H.shape, -1.0, dtype=torch.float64, requires_grad=True)
    adv = torch.zeros(H.shape[0], dtype=torch.float64)
    return policy_loss(logp, logp.detach(), adv, mask, entropy=H, entropy_coef=coef, **kw)[0]


def test_the_bonus_is_minus_coef_times_the_token_mean_entropy():
    # H = [1.0, 0.5 | 2.0, (pad)]: 3 tokens, mean 3.5 / 3; coef 0.1: loss = -0.1 * 3.5 / 3 = -0.116667, and
    # d loss / d H = -0.1 / 3 on every token, 0 on the padding, whatever the aggregation of the policy term
    for agg in ("seq-mean-token-mean", "token-mean", "seq-sum-norm"):
        H = torch.tensor([[1.0, 0.5], [2.0, 9.0]], dtype=torch.float64, requires_grad=True)
        mask = torch.tensor([[1, 1], [1, 0]])
        loss = bonus_only(H, mask, 0.1, agg=agg, norm_len=4.0)
        loss.backward()
        assert float(loss.detach()) == pytest.approx(-0.1 * 3.5 / 3, abs=1e-15)
        assert H.grad.flatten().tolist() == pytest.approx([-0.1 / 3, -0.1 / 3, -0.1 / 3, 0.0], abs=1e-15)


def test_the_bonus_acts_on_the_tokens_top_entropy_keeps_and_over_the_mini_batch_count():
    H = torch.tensor([[1.0, 0.5], [2.0, 9.0]], dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1, 1], [1, 0]])
    keep = torch.tensor([[True, False], [True, False]])
    # the kept tokens 1.0 and 2.0 over a mini-batch of 6 such tokens: -0.1 * 3 / 6 = -0.05, gradient -0.1 / 6
    loss = bonus_only(H, mask, 0.1, entropy_mask=keep, entropy_tokens=6)
    loss.backward()
    assert float(loss.detach()) == pytest.approx(-0.05, abs=1e-15)
    assert H.grad.flatten().tolist() == pytest.approx([-0.1 / 6, 0.0, -0.1 / 6, 0.0], abs=1e-15)


def test_no_bonus_without_a_coefficient_and_a_coefficient_needs_the_entropy():
    H = torch.tensor([[1.0, 0.5]], dtype=torch.float64, requires_grad=True)
    assert float(bonus_only(H, torch.ones(1, 2), 0.0)) == 0.0
    lp = torch.zeros(1, 2, requires_grad=True)
    with pytest.raises(ValueError, match="entropy_coef=0.1 needs entropy"):
        policy_loss(lp, lp.detach(), torch.zeros(1), torch.ones(1, 2), entropy_coef=0.1)


def test_the_micro_batch_split_does_not_change_the_bonus():
    """Micro-batches with the mini-batch's num_tokens / entropy_tokens sum to the whole batch's loss and gradient."""
    g = torch.Generator().manual_seed(0)
    B, T = 6, 5
    logp0 = -torch.rand(B, T, generator=g, dtype=torch.float64) * 2
    old = logp0 + (torch.rand(B, T, generator=g, dtype=torch.float64) - 0.5) * 0.3
    H0 = torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    mask = torch.ones(B, T)
    mask[1, 3:] = 0
    mask[4, 1:] = 0
    keep = torch.rand(B, T, generator=g) < 0.6
    n_tok, n_bonus = mask.sum(), (mask.bool() & keep).sum()
    results = []
    for split in (1, 2, 6):
        logp, H = logp0.clone().requires_grad_(), H0.clone().requires_grad_()
        total = 0.0
        for rows in torch.arange(B).chunk(split):
            loss, _ = policy_loss(
                logp[rows], old[rows], adv[rows], mask[rows], agg="token-mean", num_sequences=B,
                num_tokens=n_tok, entropy=H[rows], entropy_coef=0.05, entropy_mask=keep[rows], entropy_tokens=n_bonus,
            )  # fmt: skip
            loss.backward()
            total += float(loss)
        results.append((total, logp.grad.clone(), H.grad.clone()))
    for total, g_logp, g_H in results[1:]:
        assert total == pytest.approx(results[0][0], rel=1e-12)
        assert torch.allclose(g_logp, results[0][1], rtol=1e-12, atol=1e-15)
        assert torch.allclose(g_H, results[0][2], rtol=1e-12, atol=1e-15)
    assert float(results[0][2].abs().sum()) > 0


def test_entropy_with_grad_by_hand_and_against_autograd_check():
    # logits [0, ln 3]: p = [1/4, 3/4], H = -(1/4 ln 1/4 + 3/4 ln 3/4) = 0.562335;
    # dH/dx_v = -p_v (ln p_v + H): [-0.25 (-1.386294 + 0.562335), -0.75 (-0.287682 + 0.562335)] = [0.205990, -0.205990]
    x = torch.tensor([[0.0, math.log(3.0)]], dtype=torch.float64, requires_grad=True)
    H = entropy_with_grad(x)
    H.sum().backward()
    assert float(H) == pytest.approx(0.562335, abs=1e-6)
    assert x.grad[0].tolist() == pytest.approx([0.205990, -0.205990], abs=1e-6)
    logits = torch.randn(4, 7, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(entropy_with_grad, (logits,))
    # the same values as the no-grad entropy the metrics use
    assert torch.allclose(entropy_with_grad(logits).detach(), entropy_from_logits(logits.detach()), atol=1e-12)


def test_the_adaptive_coefficient_by_hand():
    # target 0.2, delta 0.005, c_0 = 0, max 0.012: measured entropies 0.15, 0.15, 0.15, 0.3, 0.3, 0.3 give
    # c = 0.005, 0.010, 0.012 (capped), 0.007, 0.002, 0 (floored); the alpha applied before each step is c of the
    # step before while its entropy was <= 0.2, else 0: 0 (nothing measured), 0.005, 0.010, 0.012, 0, 0
    ctl = EntropyControl(0.0)
    applied, coefs = [], []
    for e in (0.15, 0.15, 0.15, 0.3, 0.3, 0.3):
        applied.append(ctl.applied(True, 0.2))
        ctl.observe(e, target=0.2, delta=0.005, coef_min=0.0, coef_max=0.012)
        coefs.append(ctl.coef)
    assert coefs == pytest.approx([0.005, 0.010, 0.012, 0.007, 0.002, 0.0], abs=1e-15)
    assert applied == pytest.approx([0.0, 0.005, 0.010, 0.012, 0.0, 0.0], abs=1e-15)
    assert EntropyControl.from_state(ctl.state()) == ctl
    # the constant bonus: always c; an empty step (NaN) changes nothing
    const = EntropyControl(0.01)
    const.observe(float("nan"), target=0.2, delta=0.005, coef_min=0.0, coef_max=1.0)
    assert const.applied(False, 0.2) == 0.01 and const.last_entropy == math.inf


def test_the_adaptive_knobs_without_adaptive_control_are_named():
    from grpokit.algos import AlgoSettings

    lines = AlgoSettings.of(entropy_target=0.5).ineffective({"entropy_target"})
    assert lines == ["algo.entropy_target=0.5: only adaptive entropy control reads it; set algo.adaptive_entropy=true"]
    assert AlgoSettings.of(adaptive_entropy=True, entropy_target=0.5).ineffective({"entropy_target"}) == []
    bad = AlgoSettings.of(adaptive_entropy=True, entropy_coef_min=0.5, entropy_coef_max=0.1).ineffective(set())
    assert bad == ["algo.entropy_coef_min=0.5 > algo.entropy_coef_max=0.1"]
