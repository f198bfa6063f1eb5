"""Advantage estimators: hand-computed values, exact zeros, naive-loop oracles, errors."""

import math

import pytest
import torch

from grpokit.algos import (
    PRESETS,
    AdvantageInputs,
    batch_whitened_advantages,
    compute_advantages,
    group_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
    whiten_tokens,
)

# ---------------------------------------------------------------- naive oracles (plain Python loops)


def _mean(xs):
    return sum(xs) / len(xs)


def _std(xs, ddof):
    mu = _mean(xs)
    return math.sqrt(sum((x - mu) ** 2 for x in xs) / (len(xs) - ddof))


def naive_group(rewards, G, scale, ddof, eps):
    r = rewards.tolist()
    groups = [r[g : g + G] for g in range(0, len(r), G)]
    centred = [[x - _mean(grp) for x in grp] if len(set(grp)) > 1 else [0.0] * G for grp in groups]
    flat = [c for grp in centred for c in grp]
    out = []
    for grp_r, grp_c in zip(groups, centred):
        for c in grp_c:
            if scale == "none":
                out.append(c)
            elif scale == "group":
                out.append(c / (_std(grp_r, ddof) + eps))
            else:
                out.append(c / (_std(flat, ddof) + eps))
    return torch.tensor(out, dtype=torch.float64)


def naive_rloo(rewards, G):
    r = rewards.tolist()
    out = []
    for g in range(0, len(r), G):
        grp = r[g : g + G]
        for i, x in enumerate(grp):
            others = [y for j, y in enumerate(grp) if j != i]
            out.append(x - sum(others) / (G - 1))
    return torch.tensor(out, dtype=torch.float64)


def naive_reinforce_pp(rewards, ddof, eps):
    r = rewards.tolist()
    mu, sd = _mean(r), _std(r, ddof)
    return torch.tensor([(x - mu) / (sd + eps) for x in r], dtype=torch.float64)


# ---------------------------------------------------------------- hand-computed values


def test_grpo_seed_example_ddof1_and_ddof0():
    # rewards [1, 0, 1, 0]: mean 0.5, centred +-0.5.
    # ddof 1: std = sqrt(4 * 0.25 / 3) = 0.57735 -> A = 0.5 / 0.57735 = +-0.866025
    # ddof 0: std = sqrt(4 * 0.25 / 4) = 0.5     -> A = +-1.0
    r = torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=torch.float64)
    a1 = group_advantages(r, 4, eps=0.0)
    a0 = group_advantages(r, 4, std_ddof=0, eps=0.0)
    s = math.sqrt(3) / 2
    torch.testing.assert_close(a1, torch.tensor([s, -s, s, -s], dtype=torch.float64), rtol=0, atol=1e-12)
    torch.testing.assert_close(
        a0, torch.tensor([1.0, -1.0, 1.0, -1.0], dtype=torch.float64), rtol=0, atol=1e-12
    )
    # with the default eps=1e-6 the value moves by < 1e-5
    torch.testing.assert_close(group_advantages(r, 4), a1, rtol=0, atol=1e-5)


def test_dr_grpo_and_batch_scale_hand_values():
    # two groups of 2: [3, 1] -> centred [1, -1]; [0, 2] -> centred [-1, 1]
    r = torch.tensor([3.0, 1.0, 0.0, 2.0], dtype=torch.float64)
    torch.testing.assert_close(
        group_advantages(r, 2, scale="none"), torch.tensor([1.0, -1, -1, 1], dtype=torch.float64)
    )
    # batch std of [1, -1, -1, 1] with ddof 1 = sqrt(4/3) = 1.1547 -> A = +-0.866025
    s = math.sqrt(3) / 2
    got = group_advantages(r, 2, scale="batch", eps=0.0)
    torch.testing.assert_close(got, torch.tensor([s, -s, -s, s], dtype=torch.float64), rtol=0, atol=1e-12)


def test_rloo_three_completions():
    # [1, 0, 0]: A_0 = 1 - (0 + 0)/2 = 1; A_1 = 0 - (1 + 0)/2 = -0.5; A_2 = -0.5
    # [1, 1, 0]: A_0 = 1 - (1 + 0)/2 = 0.5; A_1 = 0.5; A_2 = 0 - (1 + 1)/2 = -1
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0], dtype=torch.float64)
    want = torch.tensor([1.0, -0.5, -0.5, 0.5, 0.5, -1.0], dtype=torch.float64)
    torch.testing.assert_close(rloo_advantages(r, 3), want, rtol=0, atol=1e-12)


def test_batch_whitened_hand_values():
    # [2, 0, 1, 1]: mean 1, centred [1, -1, 0, 0], ddof-1 std sqrt(2/3) = 0.8165 -> [1.2247, -1.2247, 0, 0]
    r = torch.tensor([2.0, 0.0, 1.0, 1.0], dtype=torch.float64)
    k = math.sqrt(1.5)
    torch.testing.assert_close(
        batch_whitened_advantages(r, eps=0.0),
        torch.tensor([k, -k, 0, 0], dtype=torch.float64),
        rtol=0,
        atol=1e-12,
    )
    # group mean then batch std, G=2: centred [1, -1, 0, 0] (second group all equal -> exact 0), same std
    torch.testing.assert_close(
        group_advantages(r, 2, scale="batch", eps=0.0),
        torch.tensor([k, -k, 0, 0], dtype=torch.float64),
        rtol=0,
        atol=1e-12,
    )


# ---------------------------------------------------------------- exact zeros


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_equal_groups_give_exact_zero(dtype):
    gen = torch.Generator().manual_seed(0)
    G = 7
    values = torch.cat([torch.tensor([0.1, 1 / 3, 0.7, -2.3]), torch.rand(12, generator=gen)])  # (16,)
    r = values.repeat_interleave(G).to(dtype)  # (16 * G,) every group constant
    for scale in ("group", "batch", "none"):
        for ddof in (0, 1):
            a = group_advantages(r, G, scale=scale, std_ddof=ddof)
            assert torch.equal(a, torch.zeros_like(a)), (scale, ddof)
    assert torch.equal(rloo_advantages(r, G), torch.zeros_like(r))
    mask = torch.ones(r.shape[0], 3)
    assert torch.equal(
        reinforce_pp_advantages(r, mask, group_size=G), torch.zeros(r.shape[0], 3, dtype=dtype)
    )
    flat = torch.full((5,), 0.1, dtype=dtype)
    assert torch.equal(batch_whitened_advantages(flat), torch.zeros_like(flat))
    ragged = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0], [1, 0, 0]])
    assert torch.equal(reinforce_pp_advantages(flat, ragged), torch.zeros(5, 3, dtype=dtype))


def test_mixed_batch_equal_groups_zero_others_not():
    r = torch.tensor([0.1, 0.1, 0.1, 1.0, 0.0, 1.0], dtype=torch.float32)
    for scale in ("group", "batch", "none"):
        a = group_advantages(r, 3, scale=scale)
        assert torch.equal(a[:3], torch.zeros(3))
        assert (a[3:].abs() > 0.1).all()


# ---------------------------------------------------------------- vectorised == naive


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("ddof", [0, 1])
@pytest.mark.parametrize("G", [2, 3, 8])
def test_group_advantages_match_naive(scale, ddof, G):
    gen = torch.Generator().manual_seed(G * 10 + ddof)
    r = torch.randint(0, 3, (6 * G,), generator=gen).double() + 0.3 * torch.rand(
        6 * G, generator=gen, dtype=torch.float64
    )
    r[:G] = 0.25  # one constant group
    got = group_advantages(r, G, scale=scale, std_ddof=ddof, eps=1e-6)
    torch.testing.assert_close(got, naive_group(r, G, scale, ddof, 1e-6), rtol=0, atol=1e-6)


@pytest.mark.parametrize("G", [2, 3, 5])
def test_rloo_matches_naive(G):
    r = torch.rand(4 * G, generator=torch.Generator().manual_seed(G), dtype=torch.float64)
    torch.testing.assert_close(rloo_advantages(r, G), naive_rloo(r, G), rtol=0, atol=1e-12)


@pytest.mark.parametrize("ddof", [0, 1])
def test_batch_whitened_matches_naive(ddof):
    r = torch.randn(13, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    got = batch_whitened_advantages(r, eps=1e-6, std_ddof=ddof)
    torch.testing.assert_close(got, naive_reinforce_pp(r, ddof, 1e-6), rtol=0, atol=1e-12)
    got_b = group_advantages(r[:12], 4, scale="batch", eps=1e-6, std_ddof=ddof)
    torch.testing.assert_close(got_b, naive_group(r[:12], 4, "batch", ddof, 1e-6), rtol=0, atol=1e-12)


def test_reinforce_pp_token_advantages_match_naive():
    gen = torch.Generator().manual_seed(5)
    B, T, beta, gamma = 3, 5, 0.1, 0.9
    scores = torch.randn(B, generator=gen, dtype=torch.float64)
    kl = torch.rand(B, T, generator=gen, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0, 0], [0, 1, 1, 1, 1], [1, 1, 1, 1, 1]])
    got = reinforce_pp_advantages(scores, mask, kl=kl, kl_coef=beta, gamma=gamma, eps=0.0)
    returns = {}
    for i in range(B):
        toks = [t for t in range(T) if mask[i, t]]
        for k, t in enumerate(toks):
            g = 0.0
            for j, s in enumerate(toks[k:]):
                r = -beta * kl[i, s].item() + (scores[i].item() if s == toks[-1] else 0.0)
                g += gamma**j * r
            returns[i, t] = g
    vals = list(returns.values())
    mu, sd = _mean(vals), _std(vals, 0)
    want = torch.zeros(B, T, dtype=torch.float64)
    for (i, t), g in returns.items():
        want[i, t] = (g - mu) / sd
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


# ---------------------------------------------------------------- REINFORCE++ as the paper (eq. 10)


def test_whiten_tokens_hand_values_ragged():
    # x = [[1, 1, 1], [0, 0, pad]]: 5 tokens, mean 3/5 = 0.6, population var (3 * 0.4^2 + 2 * 0.6^2) / 5
    # = 0.24, std 0.4899 -> [[0.8165] * 3, [-1.2247] * 2]; the token mean of the result is 0
    x = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 99.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    got = whiten_tokens(x, mask, eps=0.0)
    hi, lo = 0.4 / math.sqrt(0.24), -0.6 / math.sqrt(0.24)
    want = torch.tensor([[hi, hi, hi], [lo, lo, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    assert abs(float(got[mask.bool()].sum())) < 1e-12


def test_reinforce_pp_hand_values_ragged_masks():
    # REINFORCE++, no KL, rewards [1, 0] on completions of 3 and 2 tokens (right padding):
    # returns-to-go are the score on every token: [[1, 1, 1], [0, 0]] -> as above, 0.8165 / -1.2247.
    # Per-sequence whitening with ddof 1 (grpokit before issue 12) would give +-0.7071 instead.
    r = torch.tensor([1.0, 0.0], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    hi, lo = 0.4 / math.sqrt(0.24), -0.6 / math.sqrt(0.24)
    want = torch.tensor([[hi, hi, hi], [lo, lo, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(reinforce_pp_advantages(r, mask, eps=0.0), want, rtol=0, atol=1e-12)
    # the same with left padding on the second row: padding side does not matter
    left = torch.tensor([[1, 1, 1], [0, 1, 1]])
    want_left = torch.tensor([[hi, hi, hi], [0.0, lo, lo]], dtype=torch.float64)
    torch.testing.assert_close(reinforce_pp_advantages(r, left, eps=0.0), want_left, rtol=0, atol=1e-12)


def test_reinforce_pp_with_kl_in_reward_hand_values():
    # rewards [1, 0], mask [[1, 1], [1, 0]], k1 = [[0.5, 1.0], [2.0, pad]], kl_coef 0.1, gamma 1:
    # token rewards [[-0.05, 1 - 0.1], [-0.2]] -> returns-to-go [[0.85, 0.9], [-0.2]]
    # mean 1.55 / 3 = 0.51667; deviations [0.33333, 0.38333, -0.71667]
    # population var (0.111111 + 0.146944 + 0.513611) / 3 = 0.257222, std 0.507170
    r = torch.tensor([1.0, 0.0], dtype=torch.float64)
    mask = torch.tensor([[1, 1], [1, 0]])
    kl = torch.tensor([[0.5, 1.0], [2.0, 7.0]], dtype=torch.float64)
    got = reinforce_pp_advantages(r, mask, kl=kl, kl_coef=0.1, eps=0.0)
    g = [0.85, 0.9, -0.2]
    mu = sum(g) / 3
    sd = math.sqrt(sum((x - mu) ** 2 for x in g) / 3)
    assert sd == pytest.approx(0.507170, abs=1e-6)
    want = torch.tensor([[(0.85 - mu) / sd, (0.9 - mu) / sd], [(-0.2 - mu) / sd, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_reinforce_pp_baseline_hand_values_ragged_masks():
    # REINFORCE++-baseline, G=2, rewards [1, 0 | 1, 1]: group-centred scores [0.5, -0.5 | 0, 0] (the second
    # group is flat: exact 0). Lengths [1, 3 | 2, 2] -> 8 token returns: 0.5 once, -0.5 three times, 0 four
    # times; mean -1/8 = -0.125; deviations 0.625, -0.375 (x3), 0.125 (x4);
    # population var (0.390625 + 3 * 0.140625 + 4 * 0.015625) / 8 = 0.109375, std 0.330719
    r = torch.tensor([1.0, 0.0, 1.0, 1.0], dtype=torch.float64)
    mask = torch.tensor([[1, 0, 0], [1, 1, 1], [1, 1, 0], [0, 1, 1]])
    got = reinforce_pp_advantages(r, mask, group_size=2, eps=0.0)
    sd = math.sqrt(0.109375)
    a, b, c = 0.625 / sd, -0.375 / sd, 0.125 / sd
    want = torch.tensor([[a, 0, 0], [b, b, b], [c, c, 0], [0, c, c]], dtype=torch.float64)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_advantage_inputs_token_rewards_hand_values():
    # score 1 and 0 on the last generated token, -0.1 * k1 on every generated one, 0 on padding
    inputs = AdvantageInputs(
        rewards=torch.tensor([1.0, 0.0], dtype=torch.float64),
        group_size=2,
        completion_mask=torch.tensor([[1, 1], [1, 0]]),
        kl=torch.tensor([[0.5, 1.0], [2.0, 7.0]], dtype=torch.float64),
        kl_coef=0.1,
    )
    want = torch.tensor([[-0.05, 0.9], [-0.2, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(inputs.token_rewards(), want, rtol=0, atol=1e-12)
    # per-completion estimators see the same KL summed: [1 - 0.15, 0 - 0.2]
    torch.testing.assert_close(
        inputs.sequence_rewards(), torch.tensor([0.85, -0.2], dtype=torch.float64), rtol=0, atol=1e-12
    )


# ---------------------------------------------------------------- dispatch and errors


def test_compute_advantages_dispatch():
    r = torch.rand(12, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    torch.testing.assert_close(compute_advantages(r, 4, "grpo"), group_advantages(r, 4))
    torch.testing.assert_close(compute_advantages(r, 4, "dr_grpo"), group_advantages(r, 4, scale="none"))
    torch.testing.assert_close(compute_advantages(r, 4, "batch"), group_advantages(r, 4, scale="batch"))
    torch.testing.assert_close(compute_advantages(r, 4, "rloo"), rloo_advantages(r, 4))
    mask = (torch.arange(5) < torch.arange(12).remainder(5)[:, None] + 1).long()  # (12, 5) ragged
    torch.testing.assert_close(
        compute_advantages(r, 4, "reinforce_pp", completion_mask=mask), reinforce_pp_advantages(r, mask)
    )
    torch.testing.assert_close(compute_advantages(r, 4, "dapo"), group_advantages(r, 4))
    torch.testing.assert_close(
        compute_advantages(r, 4, PRESETS["reinforce_pp_baseline"], completion_mask=mask),
        reinforce_pp_advantages(r, mask, group_size=4),
    )
    torch.testing.assert_close(compute_advantages(r, 4, "batch_whiten"), batch_whitened_advantages(r))
    with pytest.raises(ValueError, match="needs completion_mask"):
        compute_advantages(r, 4, "token_whiten")
    torch.testing.assert_close(
        compute_advantages(r, 4, "gspo", std_ddof=0, eps=0.0), group_advantages(r, 4, std_ddof=0, eps=0.0)
    )
    with pytest.raises(ValueError, match="'grpo'"):
        compute_advantages(r, 4, "no_such_estimator")  # ("ppo" is a preset since issue 15)
    with pytest.raises(TypeError, match="scale"):
        compute_advantages(r, 4, "grpo", scale="none")


def test_errors_name_the_values():
    r = torch.zeros(6)
    with pytest.raises(ValueError, match="group_size=1"):
        group_advantages(r, 1)
    with pytest.raises(ValueError, match="6 rewards.*group_size=4"):
        group_advantages(r, 4)
    with pytest.raises(ValueError, match="'group', 'batch', 'batch_reward', 'none'"):
        group_advantages(r, 3, scale="std")
    with pytest.raises(ValueError, match="group_size=1"):
        rloo_advantages(r, 1)
