"""The second generation of surrogates (grpokit.algos.objectives) and the masks on them (grpokit.algos.masks), through
policy_loss: values and gradients against numbers worked by hand, against a naive per-token loop, and invariant
under the micro-batch split like the clipped loss."""

from __future__ import annotations

import math

import pytest
import torch

from grpokit.algos import AlgoSettings, policy_loss
from grpokit.algos.masks import high_entropy_mask, off_policy_mask
from grpokit.algos.objectives import SURROGATES
from grpokit.algos.token_terms import token_terms


def one_row(logps, olds, adv, **kw):
    """policy_loss on one row: (loss, grad of logp, metrics)."""
    logp = torch.tensor([logps], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([olds], dtype=torch.float64)
    mask = torch.ones_like(old, dtype=torch.bool)
    loss, metrics = policy_loss(logp, old, torch.tensor([adv], dtype=torch.float64), mask, **kw)
    loss.backward()
    return float(loss.detach()), logp.grad[0].tolist(), metrics


# ------------------------------------------------------------------ numbers worked by hand


def test_cispo_is_the_clipped_weight_times_a_logp():
    # p = 0.5, rho = e^0.3 = 1.3499 > 1.2: weight sg(1.2); l = -1.2 * 1 * log 0.5 = 0.83178, d l / d logp = -1.2
    lp = math.log(0.5)
    loss, grad, m = one_row(
        [lp], [lp - 0.3], 1.0, surrogate="cispo", eps_low=1.0, eps_high=0.2, agg="token-mean"
    )
    assert loss == pytest.approx(0.831777, abs=1e-6) and grad == pytest.approx([-1.2])
    assert float(m["clip_frac_high"]) == 1.0
    # inside the range the weight is rho itself: rho = e^0.1 = 1.10517, gradient -1.10517 (REINFORCE x rho)
    _, grad, m = one_row(
        [lp], [lp - 0.1], 1.0, surrogate="cispo", eps_low=1.0, eps_high=0.2, agg="token-mean"
    )
    assert grad == pytest.approx([-1.105171]) and float(m["clip_frac"]) == 0.0
    # A < 0 far below the range: clipped PPO would give no gradient; CISPO keeps it (weight 1 - 0.2 = 0.8)
    _, grad, _ = one_row(
        [lp], [lp + 1.0], -1.0, surrogate="cispo", eps_low=0.2, eps_high=0.2, agg="token-mean"
    )
    assert grad == pytest.approx([0.8])
    _, grad_clip, _ = one_row([lp], [lp + 1.0], -1.0, agg="token-mean")
    assert grad_clip == [0.0]


def test_sapo_gate_value_and_gradient():
    # rho = e^0.3 = 1.349859, A = 1, tau_pos = 1: l = -4 sigmoid(0.349859) = -4 * 0.586583 = -2.346333;
    # d l / d logp = -4 s (1 - s) rho = -4 * 0.586583 * 0.413417 * 1.349859 = -1.309381
    loss, grad, _ = one_row([-1.0], [-1.3], 1.0, surrogate="sapo", sapo_tau_pos=1.0, sapo_tau_neg=1.05)
    assert loss == pytest.approx(-2.346333, abs=1e-6) and grad == pytest.approx([-1.309381], abs=1e-6)
    # on-policy (rho = 1) the gate's gradient is exactly A's, whatever tau: -(4/tau) tau / 4 = -1 for A = 1
    for tau in (0.5, 1.0, 3.0):
        _, grad, _ = one_row([-1.0], [-1.0], 1.0, surrogate="sapo", sapo_tau_pos=tau)
        assert grad == pytest.approx([-1.0])
    # A < 0 takes tau_neg: value -(4/1.05) * 0.5 * (-1) = 1.904762 at rho = 1
    loss, _, _ = one_row([-1.0], [-1.0], -1.0, surrogate="sapo", sapo_tau_neg=1.05)
    assert loss == pytest.approx(1.904762, abs=1e-6)


def test_gmpo_geometric_mean_of_log_clipped_ratios():
    # log ratios [0.5, -0.1], eps 0.4 in log space. A = +1: min(lr, clip(lr)) = [0.4, -0.1], mean 0.15,
    # s = e^0.15 = 1.161834, loss -1.161834; token 1 is clipped (no gradient), token 2: -s / 2 = -0.580917
    loss, grad, m = one_row([0.0, 0.0], [-0.5, 0.1], 1.0, surrogate="gmpo", eps_low=0.4, eps_high=0.4)
    assert loss == pytest.approx(-1.161834, abs=1e-6) and grad == pytest.approx([0.0, -0.580917], abs=1e-6)
    assert float(m["clip_frac_high"]) == 0.5
    # A = -1: max(lr, clip(lr)) = [0.5, -0.1], mean 0.2, s = e^0.2 = 1.221403, loss +1.221403, both tokens s / 2
    loss, grad, m = one_row([0.0, 0.0], [-0.5, 0.1], -1.0, surrogate="gmpo", eps_low=0.4, eps_high=0.4)
    assert loss == pytest.approx(1.221403, abs=1e-6) and grad == pytest.approx([0.610701, 0.610701], abs=1e-6)
    assert float(m["clip_frac_low"]) == 0.5  # token 1 left the range, on the side the pessimistic max keeps


def test_dppo_masks_tokens_that_leave_the_trust_region():
    half, seven, six = math.log(0.5), math.log(0.7), math.log(0.6)
    kw = {"surrogate": "dppo_tv", "eps_low": 0.15, "eps_high": 0.15, "agg": "seq-sum-norm", "norm_len": 1}
    # p_old 0.5 -> p 0.7 (+0.2 > 0.15) with A > 0: masked; -> 0.6 (+0.1): kept, rho = 1.2,
    # l = -1.2 * log 0.6 = 0.612990, gradient -1.2 (the truncated IS weight, no gradient through it)
    loss, grad, m = one_row([seven, six], [half, half], 1.0, **kw)
    assert loss == pytest.approx(0.612990, abs=1e-6) and grad == pytest.approx([0.0, -1.2])
    assert float(m["masked_frac/trust_region"]) == 0.5
    # the same move with A < 0 is away from the bound being tested (p rose, A pushes it down): kept
    _, grad, m = one_row([seven, six], [half, half], -1.0, **kw)
    assert grad == pytest.approx([1.4, 1.2]) and float(m["masked_frac/trust_region"]) == 0.0
    # binary KL of 0.5 -> 0.7: 0.5 log(0.5/0.7) + 0.5 log(0.5/0.3) = 0.087177 > 0.05: masked for A > 0;
    # 0.5 -> 0.6: 0.020411 <= 0.05 kept
    _, grad, m = one_row(
        [seven, six], [half, half], 1.0, **(kw | {"surrogate": "dppo_kl", "eps_low": 0.05, "eps_high": 0.05})
    )
    assert grad == pytest.approx([0.0, -1.2]) and float(m["masked_frac/trust_region"]) == 0.5
    # the IS weight is capped at C: rho = e^3 = 20.09 -> 2 with is_cap 2 (p_old tiny, p - p_old within 0.15)
    _, grad, m = one_row([math.log(0.01)], [math.log(0.01) - 3.0], 1.0, **(kw | {"is_cap": 2.0}))
    assert grad == pytest.approx([-2.0])


def test_off_policy_mask_drops_negative_sequences_far_from_the_sampler():
    # sampler [-1, -1], policy [-2, -3]: mean KL (1 + 2) / 2 = 1.5; A = -1 with delta 0.5: dropped, delta 2: kept;
    # A = +1: kept whatever the KL
    logp, sample = torch.tensor([[-2.0, -3.0]]), torch.tensor([[-1.0, -1.0]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    neg, pos = torch.full((1, 2), -1.0), torch.full((1, 2), 1.0)
    assert not off_policy_mask(neg, logp, sample, mask, 0.5).any()
    assert off_policy_mask(neg, logp, sample, mask, 2.0).all()
    assert off_policy_mask(pos, logp, sample, mask, 0.5).all()
    # padding does not count in the mean: a third, masked position with a huge gap changes nothing
    wide = off_policy_mask(
        torch.full((1, 3), -1.0),
        torch.tensor([[-2.0, -3.0, -50.0]]),
        torch.tensor([[-1.0, -1.0, 0.0]]),
        torch.tensor([[True, True, False]]),
        2.0,
    )
    assert wide[0, :2].all()
    # through the loss: the dropped row has zero gradient but still counts in the normaliser (as TRL's)
    lp = torch.tensor([[-2.0, -3.0], [-1.0, -1.0]], requires_grad=True)
    loss, m = policy_loss(
        lp,
        lp.detach(),
        torch.tensor([-1.0, -1.0]),
        torch.ones(2, 2, dtype=torch.bool),
        agg="token-mean",
        off_policy_mask=0.5,
        sample_logprobs=torch.tensor([[-1.0, -1.0], [-1.0, -1.0]]),
    )
    loss.backward()
    assert lp.grad[0].tolist() == [0.0, 0.0] and lp.grad[1].tolist() == pytest.approx([0.25, 0.25])
    assert float(m["masked_frac/off_policy"]) == 0.5
    with pytest.raises(ValueError, match="needs sample_logprobs"):
        policy_loss(lp, lp.detach(), torch.tensor([-1.0, -1.0]), torch.ones(2, 2), off_policy_mask=0.5)


def test_high_entropy_mask_keeps_the_top_quantile_of_the_masked_tokens():
    # entropies [0.1, 2.0, 0.5, 1.5] (+ a padded 9.0): the 0.5 quantile of the four is (0.5 + 1.5) / 2 = 1.0,
    # so rho = 0.5 keeps 2.0 and 1.5; the padding neither counts nor is kept
    entropy = torch.tensor([[0.1, 2.0, 0.5], [1.5, 9.0, 0.0]])
    mask = torch.tensor([[True, True, True], [True, False, False]])
    assert high_entropy_mask(entropy, mask, 0.5).tolist() == [[False, True, False], [True, False, False]]
    assert high_entropy_mask(entropy, mask, 1.0).tolist() == mask.tolist()  # rho 1: every token
    assert high_entropy_mask(entropy, mask, 0.0).tolist() == [[False, True, False], [False, False, False]]
    assert not high_entropy_mask(entropy, torch.zeros_like(mask), 0.5).any()
    # through the loss: the dropped tokens get no gradient but count in the normaliser
    lp = torch.zeros(2, 3, requires_grad=True)
    keep = high_entropy_mask(entropy, mask, 0.5)
    loss, m = policy_loss(
        lp, lp.detach(), torch.tensor([1.0, 1.0]), mask, agg="token-mean", entropy_mask=keep
    )
    loss.backward()
    assert (
        lp.grad.tolist() == [[0.0, -0.25, 0.0], [-0.25, 0.0, 0.0]] and float(m["masked_frac/entropy"]) == 0.5
    )


def test_kl_is_correction_gives_the_k1_gradient_on_policy():
    # logp -1, ref -1.5, d = ref - logp = -0.5. k3 = e^-0.5 + 0.5 - 1 = 0.106531, its gradient 1 - e^-0.5 = 0.393469.
    # rho * k3 at rho = 1 (on-policy) has the same value and gradient k3 + (1 - e^d) = -d = 0.5
    def kl_grad(correct: bool) -> tuple[float, float]:
        lp = torch.tensor([[-1.0]], dtype=torch.float64, requires_grad=True)
        loss, m = policy_loss(
            lp,
            lp.detach(),
            torch.zeros(1, dtype=torch.float64),
            torch.ones(1, 1),
            ref_logprobs=torch.tensor([[-1.5]], dtype=torch.float64),
            beta=1.0,
            kl_is_correction=correct,
        )
        loss.backward()
        return float(m["kl_mean"]), float(lp.grad)

    assert kl_grad(False) == pytest.approx((0.106531, 0.393469), abs=1e-6)
    assert kl_grad(True) == pytest.approx((0.106531, 0.5), abs=1e-6)


# ------------------------------------------------------------------ a naive per-token loop


def naive_token_loss(name, lp, old, a, eps_low, eps_high, tau_pos=1.0, tau_neg=1.05, cap=20.0):
    """One token's surrogate written from the papers' formulas with 0-d tensors (gradient through lp)."""
    rho = torch.exp(lp - old)
    if name == "clip":
        return -torch.minimum(rho * a, rho.clamp(1 - eps_low, 1 + eps_high) * a)
    if name == "cispo":
        return -rho.clamp(1 - eps_low, 1 + eps_high).detach() * a * lp
    if name == "sapo":
        tau = tau_pos if a > 0 else tau_neg
        return -(4 / tau) * torch.sigmoid(tau * (rho - 1)) * a
    p, q = torch.exp(lp).detach(), math.exp(float(old))
    if name == "dppo_tv":
        valid = (p - q <= eps_high) if a > 0 else (p - q >= -eps_low)
    else:
        d = q * (float(old) - lp.detach()) + (1 - q) * torch.log((1 - q + 1e-8) / (1 - p + 1e-8))
        valid = (d <= eps_high) | (p <= q) if a > 0 else (d <= eps_low) | (p >= q)
    return -a * rho.detach().clamp(max=cap) * lp * float(valid)


def naive_vespo_row(lps, olds, a, k=(2.0, 3.0), lam=(3.0, 2.0)):
    """-phi(w) A logp on each token, w the product of the token ratios, phi(w) = e^lambda w^k e^(-lambda w)."""
    w = math.exp(sum(float(lp - old) for lp, old in zip(lps, olds)))
    kk, ll = (k[0], lam[0]) if a >= 0 else (k[1], lam[1])
    phi = math.exp(ll) * w**kk * math.exp(-ll * w)
    return [-phi * a * lp for lp in lps]


def naive_gmpo_row(lps, olds, a, eps_low, eps_high):
    """-A exp(mean of the log-ratios clipped on the pessimistic side), one sequence."""
    kept = []
    for lp, old in zip(lps, olds):
        lr = lp - old
        c = lr.clamp(-eps_low, eps_high)
        kept.append(torch.minimum(lr, c) if a > 0 else torch.maximum(lr, c))
    return -a * torch.exp(sum(kept) / len(kept))


@pytest.mark.parametrize("name", [s for s in SURROGATES])
@pytest.mark.parametrize("agg", ["seq-mean-token-mean", "token-mean", "seq-sum-norm"])
def test_every_surrogate_matches_a_naive_per_token_loop(name, agg):
    g = torch.Generator().manual_seed(3)
    B, T = 4, 6
    lengths = [6, 3, 1, 4]
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 2 - 0.05  # log-probs in (-2.05, -0.05)
    logp0 = old + (torch.rand(B, T, generator=g, dtype=torch.float64) - 0.5) * 0.8  # ratios in e^(+-0.4)
    logp0 = logp0.clamp(max=-1e-3)
    adv = torch.tensor([1.2, -0.7, 0.4, -1.5], dtype=torch.float64)
    mask = torch.zeros(B, T, dtype=torch.bool)
    for i, n in enumerate(lengths):
        mask[i, :n] = True
    eps_low, eps_high = (0.15, 0.15) if name.startswith("dppo") else (0.2, 0.28)
    kw = {"eps_low": eps_low, "eps_high": eps_high, "agg": agg, "norm_len": 7, "surrogate": name}

    logp = logp0.clone().requires_grad_(True)
    loss, _ = policy_loss(logp, old, adv, mask, **kw)
    loss.backward()

    naive_lp = logp0.clone().requires_grad_(True)
    total, n_tok = 0.0, sum(lengths)
    for i, n in enumerate(lengths):
        lps = [naive_lp[i, t] for t in range(n)]
        if name == "gmpo":
            row = [naive_gmpo_row(lps, old[i, :n], float(adv[i]), eps_low, eps_high)] * n
        elif name == "vespo":
            row = naive_vespo_row(lps, old[i, :n], float(adv[i]))
        else:
            row = [
                naive_token_loss(name, lps[t], old[i, t], float(adv[i]), eps_low, eps_high) for t in range(n)
            ]
        if agg == "seq-mean-token-mean":
            total = total + sum(row) / n / B
        elif agg == "token-mean":
            total = total + sum(row) / n_tok
        else:
            total = total + sum(row) / (B * 7)
    total.backward()
    torch.testing.assert_close(loss, total.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(logp.grad, naive_lp.grad, rtol=1e-10, atol=1e-12)
    # token_terms shows the same per-token surrogate (the view and the saved rollouts)
    terms = token_terms(logp0, old, adv, mask, **kw)
    if name not in ("gmpo", "vespo"):
        want = [
            [
                float(naive_token_loss(name, logp0[i, t], old[i, t], float(adv[i]), eps_low, eps_high))
                for t in range(n)
            ]
            for i, n in enumerate(lengths)
        ]
        for i, n in enumerate(lengths):
            assert terms["pg"][i, :n].tolist() == pytest.approx(want[i], abs=1e-5)


@pytest.mark.parametrize("name", SURROGATES)
def test_every_surrogate_is_invariant_to_the_micro_batch_split(name):
    g = torch.Generator().manual_seed(7)
    B, T = 8, 5
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 2 - 0.05
    logp0 = (old + (torch.rand(B, T, generator=g, dtype=torch.float64) - 0.5) * 0.6).clamp(max=-1e-3)
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    mask = torch.rand(B, T, generator=g) < 0.8
    mask[:, 0] = True
    sample = old + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)
    for agg in ("seq-mean-token-mean", "token-mean", "seq-sum-norm"):
        kw = {"surrogate": name, "agg": agg, "norm_len": 5, "num_sequences": B, "num_tokens": int(mask.sum())}
        kw |= {"off_policy_mask": 0.1, "eps_low": 0.2 if name != "cispo" else 1.0}
        grads = []
        for parts in (1, 2, 8):
            logp = logp0.clone().requires_grad_(True)
            for rows in torch.arange(B).chunk(parts):
                loss, _ = policy_loss(
                    logp[rows], old[rows], adv[rows], mask[rows], sample_logprobs=sample[rows], **kw
                )
                loss.backward()
            grads.append(logp.grad)
        torch.testing.assert_close(grads[0], grads[1], rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(grads[0], grads[2], rtol=1e-12, atol=1e-14)


def test_settings_refuse_what_a_surrogate_cannot_read():
    bad = AlgoSettings.of(surrogate="gmpo", ratio_level="sequence").ineffective()
    assert any("set algo.ratio_level=token" in line for line in bad)
    line = AlgoSettings.of(surrogate="cispo").ineffective({"sapo_tau_pos"})
    assert line == ["algo.sapo_tau_pos=1: only algo.surrogate=sapo reads it, not cispo"]
    assert AlgoSettings.of(surrogate="sapo").ineffective({"sapo_tau_pos"}) == []
    assert AlgoSettings.of(kl_is_correction=True).ineffective({"kl_is_correction"}) == [
        "algo.kl_is_correction=true weights the KL of the loss, which is off (algo.beta=0)"
    ]
    with pytest.raises(ValueError, match="surrogate='nope'"):
        AlgoSettings.of(surrogate="nope")
    with pytest.raises(ValueError, match="ratio_level='token'"):
        policy_loss(
            torch.zeros(1, 2),
            torch.zeros(1, 2),
            torch.ones(1),
            torch.ones(1, 2),
            surrogate="dppo_tv",
            ratio_level="sequence",
        )


# ------------------------------------------------------------------ KL-Cov and Clip-Cov (arXiv 2505.22617)


def test_token_covariance_and_the_tokens_kl_cov_and_clip_cov_choose():
    from grpokit.algos.masks import covariance_selection, token_covariance

    # log-probs [-1, -3, -2 | -2] and advantages [2, -2, 0 | 0] over 4 tokens: means -2 and 0, so
    # Cov = (2)(1), (-2)(-1), (0)(0), (0)(0) = [2, 2, 0, 0]; the padded position is 0
    logp = torch.tensor([[-1.0, -3.0, -2.0], [-2.0, -9.0, -9.0]])
    adv = torch.tensor([[2.0, -2.0, 0.0], [0.0, 5.0, 5.0]])
    mask = torch.tensor([[True, True, True], [True, False, False]])
    cov = token_covariance(logp, adv, mask)
    assert cov.tolist() == [[2.0, 2.0, 0.0], [0.0, 0.0, 0.0]]
    # KL-Cov: k = max(1, int(0.5 * 4)) = 2 largest -> the first two
    assert covariance_selection("kl_cov", cov, mask, 0.5).tolist() == [
        [True, True, False],
        [False, False, False],
    ]
    # Clip-Cov: k = 1 drawn among 1 < Cov < 5 (the first two), never outside the bounds
    picks = [
        covariance_selection("clip_cov", cov, mask, 0.25, generator=torch.Generator().manual_seed(s))
        for s in range(8)
    ]
    assert all(int(p.sum()) == 1 and not p[0, 2] and not p[1].any() for p in picks)
    assert {tuple(p[0].tolist()) for p in picks} == {(True, False, False), (False, True, False)}  # both drawn
    assert not covariance_selection("clip_cov", cov, mask, 0.25, bounds=(2.5, 5.0)).any()


def test_clip_cov_and_kl_cov_in_the_loss():
    # two tokens, A = 1, logp = old + [0.1, 0.1]; the first one chosen. Clip-Cov: no gradient on it; token-mean
    # gives the other -rho / 2 = -e^0.1 / 2 = -0.552585. KL-Cov with coef 2: + 2 |0.1| on the first, gradient
    # -e^0.1 / 2 + 2 * 1 / 2 = 0.447415 there
    chosen = torch.tensor([[True, False]])
    kw = {"agg": "token-mean", "cov_mask": chosen}
    _, grad, m = one_row([0.0, 0.0], [-0.1, -0.1], 1.0, cov_penalty="clip_cov", **kw)
    assert grad == pytest.approx([0.0, -0.552585], abs=1e-6) and float(m["masked_frac/clip_cov"]) == 0.5
    loss, grad, m = one_row([0.0, 0.0], [-0.1, -0.1], 1.0, cov_penalty="kl_cov", kl_cov_coef=2.0, **kw)
    assert grad == pytest.approx([0.447415, -0.552585], abs=1e-6) and float(m["cov_penalised_frac"]) == 0.5
    assert loss == pytest.approx(-math.exp(0.1) + 0.1, abs=1e-6)  # (-2 e^0.1 + 2 * 0.1) / 2
    with pytest.raises(ValueError, match="needs cov_mask"):
        one_row([0.0], [0.0], 1.0, cov_penalty="kl_cov")


def verl_kl_cov(logp, old, adv, mask, ratio, coef):
    """The formula of verl's compute_policy_loss_kl_cov (core_algos.py, read not imported), token-mean: the
    unclipped -A rho on every token, -A rho + coef |log rho| on the top max(1, int(ratio * N)) tokens by
    (A - mean A)(logp - mean logp) over the valid tokens."""
    valid = mask.bool()
    a, lp = adv[valid].detach(), logp[valid].detach()
    cov = (a - a.mean()) * (lp - lp.mean())
    top = torch.topk(cov, max(1, int(len(cov) * ratio))).indices
    picked = torch.zeros(int(valid.sum()), dtype=torch.bool)
    picked[top] = True
    chosen = torch.zeros_like(valid)
    chosen[valid] = picked
    lr = logp - old
    per_token = -adv * torch.exp(lr) + coef * lr.abs() * chosen
    return (per_token * mask).sum() / mask.sum()


def test_kl_cov_matches_the_formula_of_verls_code():
    from grpokit.algos.masks import covariance_selection, token_covariance

    g = torch.Generator().manual_seed(11)
    B, T = 4, 6
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    logp0 = old + 0.2 * torch.randn(B, T, generator=g, dtype=torch.float64)
    adv = torch.randn(B, 1, generator=g, dtype=torch.float64).expand(B, T)
    mask = torch.rand(B, T, generator=g) < 0.8
    chosen = covariance_selection("kl_cov", token_covariance(logp0, adv, mask), mask, 0.1)
    assert int(chosen.sum()) == max(1, int(0.1 * int(mask.sum())))
    logp = logp0.clone().requires_grad_(True)
    # verl's kl_cov has no clip: eps_low 1 and a huge eps_high leave the surrogate -A rho
    loss, _ = policy_loss(
        logp,
        old,
        adv,
        mask,
        agg="token-mean",
        eps_low=1.0,
        eps_high=1e9,
        cov_penalty="kl_cov",
        cov_mask=chosen,
        kl_cov_coef=1.0,
    )
    loss.backward()
    theirs_lp = logp0.clone().requires_grad_(True)
    theirs = verl_kl_cov(theirs_lp, old, adv, mask.double(), 0.1, 1.0)
    theirs.backward()
    torch.testing.assert_close(loss.detach(), theirs.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(logp.grad, theirs_lp.grad, rtol=1e-10, atol=1e-12)
