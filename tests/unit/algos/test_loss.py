"""policy_loss: hand values, gradient properties, naive-loop oracle, micro-batch invariance, length bias."""

import itertools
import math

import pytest
import torch

from grpokit.algos import AGG_MODES, RATIO_LEVELS, importance_ratio, kl_estimate, policy_loss

F64 = torch.float64


def make_batch(B=6, T=7, seed=0, per_token_adv=False):
    """Random float64 batch with varied lengths, one empty row, and garbage (inf/nan) in padding."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=gen)
    lengths[1] = 0  # a sequence with |o_i| = 0 must contribute 0, not nan
    lengths[0] = T
    mask = (torch.arange(T) < lengths[:, None]).long()  # (B, T)
    logp = -torch.rand(B, T, generator=gen, dtype=F64) * 3  # (B, T)
    old = logp + 0.3 * torch.randn(B, T, generator=gen, dtype=F64)  # ratios spread over both clip edges
    ref = logp + 0.5 * torch.randn(B, T, generator=gen, dtype=F64)
    adv_shape = (B, T) if per_token_adv else (B,)
    adv = torch.randn(adv_shape, generator=gen, dtype=F64)
    pad = mask == 0
    logp[pad] = -math.inf
    old[pad] = math.nan
    ref[pad] = math.inf
    if per_token_adv:
        adv[pad] = math.nan
    return logp, old, ref, adv, mask


def naive_policy_loss(
    logp,
    old,
    adv,
    mask,
    *,
    eps_low,
    eps_high,
    ratio_level,
    agg,
    ref,
    beta,
    kl_kind,
    norm_len,
    dual_clip,
    num_sequences=None,
    num_tokens=None,
):
    """Plain loops over sequences and tokens; scalar tensor ops so autograd gives the oracle gradient."""
    B, T = logp.shape
    n_seq = B if num_sequences is None else num_sequences
    n_tok = int(mask.sum()) if num_tokens is None else num_tokens
    total = torch.zeros((), dtype=logp.dtype)
    for i in range(B):
        toks = [t for t in range(T) if mask[i, t]]
        if not toks:
            continue
        seq_log_ratio = sum(logp[i, t] - old[i, t] for t in toks) / len(toks)
        seq_total = torch.zeros((), dtype=logp.dtype)
        for t in toks:
            a = adv[i] if adv.dim() == 1 else adv[i, t]
            if ratio_level == "token":
                r = torch.exp(logp[i, t] - old[i, t])
            elif ratio_level == "sequence":
                r = torch.exp(seq_log_ratio)
            else:
                r = torch.exp(seq_log_ratio.detach()) * torch.exp(logp[i, t] - logp[i, t].detach())
            l = -torch.minimum(r * a, torch.clamp(r, 1 - eps_low, 1 + eps_high) * a)  # noqa: E741
            if dual_clip is not None and a < 0:
                l = torch.minimum(l, -dual_clip * a)  # noqa: E741
            if beta > 0:
                d = ref[i, t] - logp[i, t]
                kl = {"k1": -d, "k2": 0.5 * d * d, "k3": torch.exp(d) - d - 1}[kl_kind]
                l = l + beta * kl  # noqa: E741
            seq_total = seq_total + l
        total = total + (seq_total / len(toks) if agg == "seq-mean-token-mean" else seq_total)
    if agg == "seq-mean-token-mean":
        return total / n_seq
    if agg == "token-mean":
        return total / n_tok
    return total / (n_seq * norm_len)


# ---------------------------------------------------------------- hand-computed example


def test_clipped_loss_hand_example_and_zero_grad_at_clipped_tokens():
    # one sequence, 4 tokens, eps_low 0.2, eps_high 0.28, per-token advantages:
    # t0: A=+1, rho=1.5 > 1.28 -> l = -min(1.5, 1.28) = -1.28   clipped high, grad 0
    # t1: A=-1, rho=0.5 < 0.80 -> l = -min(-0.5, -0.8) = 0.8     clipped low,  grad 0
    # t2: A=+1, rho=0.5        -> l = -min(0.5, 0.8) = -0.5      unclipped, dl/dlogp = -rho*A = -0.5
    # t3: A=-1, rho=1.5        -> l = -min(-1.5, -1.28) = 1.5    unclipped, dl/dlogp = -rho*A = +1.5
    # token-mean: (-1.28 + 0.8 - 0.5 + 1.5) / 4 = 0.52 / 4 = 0.13; gradients / 4
    old = torch.full((1, 4), -1.0, dtype=F64)
    logp = (
        old + torch.tensor([[math.log(1.5), math.log(0.5), math.log(0.5), math.log(1.5)]], dtype=F64)
    ).requires_grad_()
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0]], dtype=F64)
    mask = torch.ones(1, 4)
    loss, metrics = policy_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.28, agg="token-mean")
    loss.backward()
    assert loss.item() == pytest.approx(0.13, abs=1e-12)
    torch.testing.assert_close(
        logp.grad, torch.tensor([[0.0, 0.0, -0.125, 0.375]], dtype=F64), rtol=0, atol=1e-12
    )
    assert logp.grad[0, 0] == 0 and logp.grad[0, 1] == 0  # exactly zero at clipped tokens
    assert metrics["clip_frac_low"].item() == 0.25
    assert metrics["clip_frac_high"].item() == 0.25
    assert metrics["clip_frac"].item() == 0.5
    assert metrics["pg_loss"].item() == pytest.approx(0.13, abs=1e-12)
    assert metrics["ratio_max"].item() == pytest.approx(1.5) and metrics["ratio_min"].item() == pytest.approx(
        0.5
    )
    assert metrics["num_tokens"].item() == 4


def test_dual_clip_caps_negative_advantage_loss():
    # A = -2, rho = 5, eps 0.2, c = 3: clipped surrogate -min(-10, -2.4) = 10, capped at c*|A| = 6, grad 0
    # A = -2, rho = 2: -min(-4, -2.4) = 4 < 6 -> unchanged, grad -rho*A = 4
    old = torch.zeros(1, 2, dtype=F64)
    logp = torch.tensor([[math.log(5.0), math.log(2.0)]], dtype=F64, requires_grad=True)
    adv = torch.tensor([-2.0], dtype=F64)
    loss, metrics = policy_loss(logp, old, adv, torch.ones(1, 2), dual_clip=3.0, agg="token-mean")
    loss.backward()
    assert loss.item() == pytest.approx((6 + 4) / 2, abs=1e-12)
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, 2.0]], dtype=F64), rtol=0, atol=1e-12)
    assert metrics["dual_clip_frac"].item() == 0.5


def test_kl_term_hand_value_and_metrics():
    # ratio 1 and A = 0: only beta * k3 remains. logp = log 0.5, ref = log 0.25 -> d = ref - logp = -log 2
    # k3 = exp(d) - d - 1 = 0.5 + 0.693147 - 1 = 0.193147; beta 0.04 -> loss 0.0077259
    logp = torch.full((1, 3), math.log(0.5), dtype=F64)
    ref = torch.full((1, 3), math.log(0.25), dtype=F64)
    loss, metrics = policy_loss(
        logp, logp, torch.zeros(1, dtype=F64), torch.ones(1, 3), ref_logprobs=ref, beta=0.04
    )
    k3 = 0.5 + math.log(2) - 1
    assert loss.item() == pytest.approx(0.04 * k3, abs=1e-12)
    assert metrics["kl_mean"].item() == pytest.approx(k3, abs=1e-12)
    # beta = 0 with ref: KL is logged, not in the loss
    loss0, metrics0 = policy_loss(logp, logp, torch.zeros(1, dtype=F64), torch.ones(1, 3), ref_logprobs=ref)
    assert loss0.item() == 0.0 and metrics0["kl_mean"].item() == pytest.approx(k3, abs=1e-12)


# ---------------------------------------------------------------- gradient properties


@pytest.mark.parametrize("ratio_level", RATIO_LEVELS)
@pytest.mark.parametrize("agg", AGG_MODES)
def test_masked_positions_get_exactly_zero_grad_and_eos_does_not(ratio_level, agg):
    logp, old, ref, adv, mask = make_batch(per_token_adv=True)
    old = torch.where(
        mask.bool(), logp, old
    )  # ratio 1 everywhere: no clipping, every real token has a gradient
    logp = logp.clone().requires_grad_()
    loss, metrics = policy_loss(
        logp,
        old,
        adv,
        mask,
        ratio_level=ratio_level,
        agg=agg,
        ref_logprobs=ref,
        beta=0.1,
        norm_len=7,
        dual_clip=3.0,
    )
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(v) for v in metrics.values())
    pad = mask == 0
    assert torch.equal(logp.grad[pad], torch.zeros_like(logp.grad[pad]))
    lengths = mask.sum(-1)
    for i in range(mask.shape[0]):
        if lengths[i] > 0:
            eos = lengths[i] - 1  # last masked-in position: the terminating EOS
            assert logp.grad[i, eos].abs() > 1e-8


def test_k3_gradient_is_beta_one_minus_ratio():
    gen = torch.Generator().manual_seed(1)
    logp = -torch.rand(4, 5, generator=gen, dtype=F64) * 2
    ref = logp + 0.7 * torch.randn(4, 5, generator=gen, dtype=F64)
    logp.requires_grad_()
    beta = 0.3
    (beta * kl_estimate(logp, ref, "k3")).sum().backward()
    torch.testing.assert_close(logp.grad, beta * (1 - torch.exp(ref - logp.detach())), rtol=0, atol=1e-12)


def test_gspo_ratio_is_constant_per_sequence_and_the_geometric_mean():
    logp, old, _, _, mask = make_batch(seed=3)
    ratio = importance_ratio(logp, old, mask, "sequence")
    tok = importance_ratio(logp, old, mask, "token")
    for i in range(mask.shape[0]):
        toks = mask[i].bool()
        n = int(toks.sum())
        if n == 0:
            continue
        vals = ratio[i, toks]
        assert torch.equal(vals, vals[:1].expand_as(vals))  # identical across tokens
        geo = math.prod(tok[i, toks].tolist()) ** (1.0 / n)
        assert vals[0].item() == pytest.approx(geo, rel=1e-12)
    # GSPO-token has the same values as GSPO
    torch.testing.assert_close(
        importance_ratio(logp, old, mask, "sequence_token")[mask.bool()], ratio[mask.bool()]
    )


def test_gspo_token_equals_gspo_gradient_for_sequence_advantages():
    # GSPO paper: with A per sequence, GSPO-token's gradient equals GSPO's (eps large: no clipping).
    logp, old, _, adv, mask = make_batch(seed=4)
    grads = []
    for level in ("sequence", "sequence_token"):
        lp = logp.clone().requires_grad_()
        policy_loss(lp, old, adv, mask, ratio_level=level, eps_low=10.0, eps_high=10.0)[0].backward()
        grads.append(lp.grad)
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=1e-12)


# ---------------------------------------------------------------- vectorised == naive


CASES = list(
    itertools.product(
        RATIO_LEVELS,
        AGG_MODES,
        [False, True],
        [None, 1.5],
        [(0.0, "k3"), (0.1, "k1"), (0.1, "k2"), (0.1, "k3")],
    )
)


@pytest.mark.parametrize("ratio_level,agg,per_token,dual_clip,kl", CASES)
def test_policy_loss_matches_naive_loops(ratio_level, agg, per_token, dual_clip, kl):
    beta, kl_kind = kl
    logp, old, ref, adv, mask = make_batch(B=8, T=5, seed=7, per_token_adv=per_token)
    kw = dict(
        eps_low=0.2,
        eps_high=0.28,
        ratio_level=ratio_level,
        agg=agg,
        beta=beta,
        kl_kind=kl_kind,
        norm_len=6,
        dual_clip=dual_clip,
    )
    if ratio_level != "token":
        kw.update(eps_low=0.05, eps_high=0.08)  # sequence ratios are narrower; keep both clip edges active
    lp1 = logp.clone().requires_grad_()
    loss, _ = policy_loss(lp1, old, adv, mask, ref_logprobs=ref, **kw)
    loss.backward()
    lp2 = logp.clone().requires_grad_()
    want = naive_policy_loss(lp2, old, adv, mask, ref=ref, **kw)
    want.backward()
    assert abs(loss.item() - want.item()) <= 1e-6
    real = mask.bool()
    torch.testing.assert_close(lp1.grad[real], lp2.grad[real], rtol=0, atol=1e-6)


def test_clipping_is_exercised_by_the_naive_comparison():
    # guard: the random batch above really hits both clip edges and the dual clip (else the oracle proves little)
    for per_token in (False, True):
        logp, old, _, adv, mask = make_batch(B=8, T=5, seed=7, per_token_adv=per_token)
        for level, eps_low, eps_high in (("token", 0.2, 0.28), ("sequence", 0.05, 0.08)):
            _, m = policy_loss(
                logp, old, adv, mask, eps_low=eps_low, eps_high=eps_high, ratio_level=level, dual_clip=1.5
            )
            assert m["clip_frac_low"] > 0 and m["clip_frac_high"] > 0 and m["dual_clip_frac"] > 0, (
                per_token,
                level,
            )


# ---------------------------------------------------------------- micro-batch invariance


def _accumulated_grad(logp, old, ref, adv, mask, n_micro, global_norm, **kw):
    B = logp.shape[0]
    lp = logp.clone().requires_grad_()
    bounds = torch.linspace(0, B, n_micro + 1).round().long().tolist()
    for a, b in zip(bounds[:-1], bounds[1:]):
        extra = dict(num_sequences=B, num_tokens=mask.sum()) if global_norm else {}
        loss, _ = policy_loss(lp[a:b], old[a:b], adv[a:b], mask[a:b], ref_logprobs=ref[a:b], **extra, **kw)
        (loss if global_norm else loss / n_micro).backward()  # naive accumulation averages micro losses
    return lp.grad


@pytest.mark.parametrize("per_token", [False, True], ids=["adv_per_seq", "adv_per_token"])
@pytest.mark.parametrize("ratio_level", RATIO_LEVELS)
@pytest.mark.parametrize("agg", AGG_MODES)
def test_micro_batch_split_gives_the_same_gradient(ratio_level, agg, per_token):
    logp, old, ref, adv, mask = make_batch(B=8, T=6, seed=11, per_token_adv=per_token)
    kw = dict(ratio_level=ratio_level, agg=agg, norm_len=6, beta=0.05, eps_high=0.28)
    full = _accumulated_grad(logp, old, ref, adv, mask, 1, True, **kw)
    assert full[mask.bool()].abs().sum() > 0
    for n_micro in (2, 8):
        got = _accumulated_grad(logp, old, ref, adv, mask, n_micro, True, **kw)
        torch.testing.assert_close(got, full, rtol=0, atol=1e-6)


def test_without_global_normaliser_token_mean_changes_with_the_split():
    logp, old, ref, adv, mask = make_batch(B=8, T=6, seed=11)
    kw = dict(agg="token-mean", beta=0.0)
    full = _accumulated_grad(logp, old, ref, adv, mask, 1, True, **kw)
    local = _accumulated_grad(logp, old, ref, adv, mask, 2, False, **kw)
    assert (local - full).abs().max() > 1e-3  # the bug the global normaliser guards against


def test_normalisers_accept_tensors_and_numbers():
    logp, old, ref, adv, mask = make_batch(seed=2)
    for agg in AGG_MODES:
        a, _ = policy_loss(logp, old, adv, mask, agg=agg, norm_len=5, num_sequences=12, num_tokens=40)
        b, _ = policy_loss(
            logp,
            old,
            adv,
            mask,
            agg=agg,
            norm_len=5,
            num_sequences=torch.tensor(12),
            num_tokens=torch.tensor(40.0),
        )
        assert torch.equal(a, b)


# ---------------------------------------------------------------- Dr. GRPO: padding and length bias


@pytest.mark.parametrize("agg", AGG_MODES)
def test_extra_padding_leaves_loss_and_grad_unchanged(agg):
    logp, old, ref, adv, mask = make_batch(seed=5)
    B, T = logp.shape
    pad = 9

    def padded(x, fill):
        return torch.cat([x, torch.full((B, pad), fill, dtype=x.dtype)], dim=1)

    lp1 = logp.clone().requires_grad_()
    l1, _ = policy_loss(lp1, old, adv, mask, ref_logprobs=ref, beta=0.04, agg=agg, norm_len=16)
    l1.backward()
    lp2 = padded(logp, -3.0).requires_grad_()
    l2, _ = policy_loss(
        lp2,
        padded(old, 0.0),
        adv,
        padded(mask, 0),
        ref_logprobs=padded(ref, 1.0),
        beta=0.04,
        agg=agg,
        norm_len=16,
    )
    l2.backward()
    assert l1.item() == pytest.approx(l2.item(), abs=1e-12)
    torch.testing.assert_close(lp2.grad[:, :T], lp1.grad, rtol=0, atol=1e-12)
    assert torch.equal(lp2.grad[:, T:], torch.zeros(B, pad, dtype=F64))


def test_length_bias_seq_mean_token_mean_vs_seq_sum_norm():
    # two wrong answers (A = -1), ratio 1: short has 2 tokens, long has 8.
    # seq-mean-token-mean: d loss / d logp_t = -A / (B |o_i|) -> short 1/(2*2) = 0.25, long 1/(2*8) = 0.0625
    # seq-sum-norm, L = 8:  d loss / d logp_t = -A / (B L)  -> both 1/16 = 0.0625
    T = 8
    mask = torch.zeros(2, T)
    mask[0, :2] = 1
    mask[1, :] = 1
    logp = torch.full((2, T), -1.0, dtype=F64)
    adv = torch.tensor([-1.0, -1.0], dtype=F64)
    grads = {}
    for agg in ("seq-mean-token-mean", "seq-sum-norm"):
        lp = logp.clone().requires_grad_()
        policy_loss(lp, logp, adv, mask, agg=agg, norm_len=T)[0].backward()
        grads[agg] = lp.grad
    g = grads["seq-mean-token-mean"]
    assert g[0, 0].item() == pytest.approx(0.25) and g[1, 0].item() == pytest.approx(0.0625)
    assert g[1, 0] < g[0, 0]  # the long wrong answer is penalised less per token: the bias
    g = grads["seq-sum-norm"]
    assert g[0, 0].item() == pytest.approx(0.0625) and g[1, 0].item() == pytest.approx(0.0625)


# ---------------------------------------------------------------- errors and metrics


def test_argument_errors():
    logp, old, ref, adv, mask = make_batch()
    with pytest.raises(ValueError, match="ref_logprobs"):
        policy_loss(logp, old, adv, mask, beta=0.1)
    with pytest.raises(ValueError, match="norm_len"):
        policy_loss(logp, old, adv, mask, agg="seq-sum-norm")
    with pytest.raises(ValueError, match="'token-mean'"):
        policy_loss(logp, old, adv, mask, agg="mean")
    with pytest.raises(ValueError, match="'sequence'"):
        policy_loss(logp, old, adv, mask, ratio_level="seq")
    with pytest.raises(ValueError, match="dual_clip"):
        policy_loss(logp, old, adv, mask, dual_clip=0.5)
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(logp, old, adv[:-1], mask)


def test_metrics_are_detached_scalars_and_ratio_one_gives_zero_loss_nonzero_grad():
    # mu = 1, one mini-batch: old = logp.detach(), ratio 1; with zero-mean advantages under token-mean
    # of equal lengths the loss is 0 but the gradient is -A/n per token, not 0.
    logp = torch.full((2, 3), -1.0, dtype=F64, requires_grad=True)
    adv = torch.tensor([1.0, -1.0], dtype=F64)
    loss, metrics = policy_loss(logp, logp.detach(), adv, torch.ones(2, 3), agg="token-mean")
    loss.backward()
    assert loss.item() == 0.0
    torch.testing.assert_close(
        logp.grad, torch.tensor([[-1.0] * 3, [1.0] * 3], dtype=F64) / 6, rtol=0, atol=1e-15
    )
    for name, v in metrics.items():
        assert v.dim() == 0 and not v.requires_grad, name
    assert metrics["ratio_mean"].item() == 1.0 and metrics["clip_frac"].item() == 0.0


def test_per_sequence_clip_shares_give_trls_low_min_and_high_max():
    """Two sequences, eps 0.2: row 0 (4 tokens) has t0 clipped high (A > 0, rho 1.5) and t1 clipped low (A < 0,
    rho 0.5); row 1 (2 tokens of 4) has both tokens clipped low. Low shares per sequence 1/4 and 2/2 -> min 0.25;
    high shares 1/4 and 0/2 -> max 0.25. A row with no loss token takes no part; none at all gives NaN."""
    old = torch.zeros(2, 4, dtype=F64)
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.0, 1.0], [0.5, 0.5, 1.0, 1.0]], dtype=F64))
    adv = torch.tensor([[1.0, -1.0, 1.0, 1.0], [-1.0, -1.0, -1.0, -1.0]], dtype=F64)
    mask = torch.tensor([[1.0, 1, 1, 1], [1, 1, 0, 0]])
    _, metrics = policy_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.2, agg="token-mean")
    assert metrics["clip_frac_low/seq_min"].item() == 0.25 and metrics["clip_frac_high/seq_max"].item() == 0.25
    assert metrics["clip_frac_low"].item() == pytest.approx(3 / 6)  # the token mean beside them
    empty = torch.tensor([[1.0, 1, 1, 1], [0, 0, 0, 0]])
    _, metrics = policy_loss(logp, old, adv, empty, eps_low=0.2, eps_high=0.2, agg="token-mean")
    assert metrics["clip_frac_low/seq_min"].item() == 0.25  # row 1 has no loss token: not a share of 0
    _, metrics = policy_loss(logp, old, adv, torch.zeros(2, 4), eps_low=0.2, eps_high=0.2, agg="token-mean")
    assert math.isnan(metrics["clip_frac_low/seq_min"].item())
