"""KL estimators, chunked log-softmax / entropy, PPO pieces, presets, and the torch-only import."""

import inspect
import math
import re
import subprocess
import sys

import pytest
import torch

import grpokit.algos as algos
from grpokit.algos import (
    PRESETS,
    SETTING_KEYS,
    compute_advantages,
    entropy_from_logits,
    gae,
    kl_estimate,
    policy_loss,
    selective_log_softmax,
    token_level_rewards,
    value_loss,
)
from grpokit.algos import presets as presets_module

F64 = torch.float64

# ---------------------------------------------------------------- KL


def test_kl_hand_values():
    # logp = log 0.5, ref = log 0.25, d = ref - logp = -log 2 = -0.693147
    # k1 = -d = 0.693147; k2 = 0.5 d^2 = 0.240227; k3 = exp(d) - d - 1 = 0.5 + 0.693147 - 1 = 0.193147
    logp = torch.tensor([math.log(0.5)], dtype=F64)
    ref = torch.tensor([math.log(0.25)], dtype=F64)
    ln2 = math.log(2)
    assert kl_estimate(logp, ref, "k1").item() == pytest.approx(ln2, abs=1e-12)
    assert kl_estimate(logp, ref, "k2").item() == pytest.approx(0.5 * ln2**2, abs=1e-12)
    assert kl_estimate(logp, ref, "k3").item() == pytest.approx(0.5 + ln2 - 1, abs=1e-12)


def test_k3_nonnegative_zero_at_equality_and_clamped():
    gen = torch.Generator().manual_seed(0)
    logp = torch.randn(50, generator=gen, dtype=F64)
    ref = torch.randn(50, generator=gen, dtype=F64) * 3
    assert (kl_estimate(logp, ref, "k3") >= 0).all()
    assert torch.equal(kl_estimate(logp, logp, "k3"), torch.zeros(50, dtype=F64))
    big = kl_estimate(torch.tensor([-100.0]), torch.tensor([0.0]), "k3")  # d = 100 clamped to 20
    assert torch.isfinite(big).all() and big.item() == pytest.approx(math.exp(20) - 21, rel=1e-6)
    with pytest.raises(ValueError, match="'k3'"):
        kl_estimate(logp, ref, "k4")


def test_k3_is_unbiased_estimate_of_kl():
    # E_{x ~ pi}[k3] = KL(pi || ref) for categorical pi, ref (exact expectation over the support)
    p = torch.tensor([0.5, 0.3, 0.2], dtype=F64)
    q = torch.tensor([0.2, 0.2, 0.6], dtype=F64)
    k3 = kl_estimate(p.log(), q.log(), "k3")
    k1 = kl_estimate(p.log(), q.log(), "k1")
    exact = (p * (p / q).log()).sum()
    assert (p * k3).sum().item() == pytest.approx(exact.item(), abs=1e-12)
    assert (p * k1).sum().item() == pytest.approx(exact.item(), abs=1e-12)


# ---------------------------------------------------------------- chunked log-softmax and entropy


@pytest.mark.parametrize("chunk_size", [1, 3, 64])
def test_selective_log_softmax_matches_reference_and_gradient(chunk_size):
    gen = torch.Generator().manual_seed(chunk_size)
    logits = torch.randn(2, 5, 11, generator=gen, dtype=F64) * 3
    index = torch.randint(0, 11, (2, 5), generator=gen)
    x1 = logits.clone().requires_grad_()
    got = selective_log_softmax(x1, index, chunk_size=chunk_size)
    x2 = logits.clone().requires_grad_()
    want = torch.log_softmax(x2, -1).gather(-1, index.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    w = torch.randn(2, 5, generator=gen, dtype=F64)
    (got * w).sum().backward()
    (want * w).sum().backward()
    torch.testing.assert_close(x1.grad, x2.grad, rtol=0, atol=1e-12)


def test_selective_log_softmax_gradcheck_and_bf16():
    gen = torch.Generator().manual_seed(9)
    logits = torch.randn(4, 6, generator=gen, dtype=F64, requires_grad=True)
    index = torch.randint(0, 6, (4,), generator=gen)
    assert torch.autograd.gradcheck(lambda x: selective_log_softmax(x, index, chunk_size=3), (logits,))
    lb = (torch.randn(3, 7, 50, generator=gen) * 4).bfloat16()
    idx = torch.randint(0, 50, (3, 7), generator=gen)
    out = selective_log_softmax(lb, idx, chunk_size=4)
    assert out.dtype == torch.float32  # upcast per chunk, returned in float32
    want = torch.log_softmax(lb.float(), -1).gather(-1, idx.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(out, want, rtol=0, atol=1e-5)
    x = lb.clone().requires_grad_()
    selective_log_softmax(x, idx, chunk_size=4).sum().backward()
    assert x.grad.dtype == torch.bfloat16


@pytest.mark.parametrize("chunk_size", [1, 4, 100])
def test_entropy_matches_reference(chunk_size):
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(3, 7, 13, generator=gen, dtype=F64) * 2
    logits[0, 0] = 0.0  # uniform: H = log 13
    p = torch.softmax(logits, -1)
    want = -(p * p.log()).sum(-1)
    got = entropy_from_logits(logits, chunk_size=chunk_size)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    assert got[0, 0].item() == pytest.approx(math.log(13), abs=1e-12)
    got_bf16 = entropy_from_logits(logits.bfloat16(), chunk_size=chunk_size)
    assert got_bf16.dtype == torch.float32
    want_bf16 = -(
        torch.softmax(logits.bfloat16().float(), -1) * torch.log_softmax(logits.bfloat16().float(), -1)
    ).sum(-1)
    torch.testing.assert_close(got_bf16, want_bf16, rtol=0, atol=1e-5)


# ---------------------------------------------------------------- PPO pieces


def naive_gae(rewards, values, mask, gamma, lam):
    B, T = len(rewards), len(rewards[0])
    adv = [[0.0] * T for _ in range(B)]
    ret = [[0.0] * T for _ in range(B)]
    for i in range(B):
        toks = [t for t in range(T) if mask[i][t]]
        for k, t in enumerate(toks):
            a = 0.0
            for j, s in enumerate(toks[k:]):
                nxt = values[i][toks[k + j + 1]] if k + j + 1 < len(toks) else 0.0
                delta = rewards[i][s] + gamma * nxt - values[i][s]
                a += (gamma * lam) ** j * delta
            adv[i][t] = a
            ret[i][t] = a + values[i][t]
    return torch.tensor(adv, dtype=F64), torch.tensor(ret, dtype=F64)


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0)])
def test_gae_matches_naive_loop(gamma, lam):
    gen = torch.Generator().manual_seed(4)
    B, T = 4, 6
    rewards = torch.randn(B, T, generator=gen, dtype=F64)
    values = torch.randn(B, T, generator=gen, dtype=F64)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0], [0, 0, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0]])
    adv, ret = gae(rewards, values, mask, gamma, lam)
    want_adv, want_ret = naive_gae(rewards.tolist(), values.tolist(), mask.tolist(), gamma, lam)
    torch.testing.assert_close(adv, want_adv, rtol=0, atol=1e-12)
    torch.testing.assert_close(ret, want_ret, rtol=0, atol=1e-12)


def test_token_level_rewards_put_the_score_on_the_eos():
    # scores [1, 2], beta 0.1, kl all 0.5 -> -0.05 per token, + score at the last masked-in token
    mask = torch.tensor([[1, 1, 0], [0, 1, 1]])
    r = token_level_rewards(
        torch.tensor([1.0, 2.0], dtype=F64), torch.full((2, 3), 0.5, dtype=F64), mask, beta=0.1
    )
    want = torch.tensor([[-0.05, 0.95, 0.0], [0.0, -0.05, 1.95]], dtype=F64)
    torch.testing.assert_close(r, want, rtol=0, atol=1e-12)


def test_value_loss_hand_values():
    # c = 0.2, R = 1. t0: V = 0.5, V_old = 0.4 -> v_clip = 0.5; max(0.25, 0.25) = 0.25
    # t1: V = 2.0, V_old = 1.0 -> v_clip = 1.2; max((2-1)^2, (1.2-1)^2) = 1.0 (unclipped is larger)
    # t2: V = 1.0, V_old = 0.0 -> v_clip = 0.2; max(0, 0.64) = 0.64 (clipped is larger, grad 0)
    # loss = 0.5 * (0.25 + 1 + 0.64) / 3 = 0.315
    values = torch.tensor([[0.5, 2.0, 1.0, 7.0]], dtype=F64, requires_grad=True)
    old = torch.tensor([[0.4, 1.0, 0.0, 0.0]], dtype=F64)
    ret = torch.ones(1, 4, dtype=F64)
    mask = torch.tensor([[1, 1, 1, 0]])
    loss, metrics = value_loss(values, old, ret, mask, 0.2)
    loss.backward()
    assert loss.item() == pytest.approx(0.315, abs=1e-12)
    # d/dV of 0.5 (V - R)^2 / 3 = (V - R)/3 where the unclipped term wins
    torch.testing.assert_close(
        values.grad, torch.tensor([[-0.5 / 3, 1 / 3, 0.0, 0.0]], dtype=F64), rtol=0, atol=1e-12
    )
    assert metrics["vf_clip_frac"].item() == pytest.approx(1 / 3)
    loss_nc, _ = value_loss(values, old, ret, mask, None)
    assert loss_nc.item() == pytest.approx(0.5 * (0.25 + 1 + 0) / 3, abs=1e-12)


# ---------------------------------------------------------------- presets

ARXIV = {
    "grpo": "2402.03300",
    "grpo_process": "2402.03300",
    "dr_grpo": "2503.20783",
    "dapo": "2503.14476",
    "gspo": "2507.18071",
    "rloo": "2402.14740",
    "reinforce_pp": "2501.03262",
    "reinforce_pp_baseline": "2501.03262",
    "ppo": "2203.02155",
    "cispo": "2506.13585",
    "sapo": "2511.20347",
    "gmpo": "2507.20673",
    "dppo_tv": "2602.04879",
    "dppo_kl": "2602.04879",
    "luspo": "2602.05261",
    "vespo": "2602.10693",
}


def test_every_preset_is_complete_and_cites_its_paper():
    assert set(PRESETS) == set(ARXIV)
    expected_keys = {
        "advantage",
        "std_ddof",
        "std_eps",  # the epsilon added to the group std (TRL: 1e-4; issue 30)
        "eps_low",
        "eps_high",
        "ratio_level",
        "agg",
        "beta",
        "kl_kind",
        "kl_reward_coef",
        "ref_sync_every",  # the reference that moves (TRL sync_ref_model)
        "ref_sync_alpha",
        "loss",
        "norm_len",
        "dual_clip",
        "dynamic_sampling",
        "max_sampling_rounds",
        "overlong_shaping",
        "overlong_buffer",
        "mask_truncated",
        "gamma",
        "lam",
        "surrogate",  # issue 35: the second generation of objectives and their masks
        "sapo_tau_pos",
        "sapo_tau_neg",
        "is_cap",
        "vespo_k_pos",
        "vespo_lambda_pos",
        "vespo_k_neg",
        "vespo_lambda_neg",
        "off_policy_mask",
        "top_entropy_quantile",
        "cov_penalty",
        "reward_aggregation",
        "teacher_kl_coef",  # issue 53: on-policy distillation's weight
        "cov_ratio",
        "kl_cov_coef",
        "clip_cov_lb",
        "clip_cov_ub",
        "kl_is_correction",
        "entropy_coef",  # issue 35: the entropy bonus and its adaptive coefficient (Skywork-OR1)
        "adaptive_entropy",
        "entropy_target",
        "entropy_coef_delta",
        "entropy_coef_min",
        "entropy_coef_max",
    }
    assert set(SETTING_KEYS) == expected_keys
    source = inspect.getsource(presets_module)
    doc = presets_module.__doc__
    for name, preset in PRESETS.items():
        assert isinstance(preset, algos.AlgoSettings), name
        settings = preset.flat()
        assert set(settings) == expected_keys, name
        assert settings["advantage"] in algos.ADVANTAGE_KINDS
        assert settings["norm_len"] in (None, "max_completion_length", 1)  # 1: luspo's sum over tokens
        assert isinstance(settings["dynamic_sampling"], bool) and isinstance(settings["mask_truncated"], bool)
        # the comment right above the entry cites the paper, and so does the module docstring
        m = re.search(rf'((?:\n\s*#[^\n]*)+)\n\s*"{name}": ', source)  # the comment block above
        assert m and f"arXiv {ARXIV[name]}" in m.group(1), name
        assert re.search(rf"\n  {name}\s.*arXiv {ARXIV[name]}", doc), name


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_runs_policy_loss_and_advantages(name):
    s = PRESETS[name].flat()
    gen = torch.Generator().manual_seed(0)
    B, T, G = 8, 6, 4
    rewards = torch.randint(0, 2, (B,), generator=gen).to(F64)
    logp = (-torch.rand(B, T, generator=gen, dtype=F64)).requires_grad_()
    old = logp.detach() + 0.01 * torch.randn(B, T, generator=gen, dtype=F64)
    ref = logp.detach() + 0.1 * torch.randn(B, T, generator=gen, dtype=F64)
    mask = torch.ones(B, T)
    kl = kl_estimate(old, ref, "k1")  # (B, T) the KL-in-reward's k1 at the sampling policy
    steps = [[(1, float(r)), (T - 1, float(r))] for r in rewards]  # process rewards: two steps each
    adv = compute_advantages(
        rewards,
        G,
        name,
        completion_mask=mask,
        kl=kl,
        kl_coef=s["kl_reward_coef"],
        step_rewards=steps,
        values=0.1 * torch.randn(B, T, generator=gen, dtype=F64),  # a critic's (ppo)
    )
    assert adv.shape in ((B,), (B, T))
    norm_len = T if s["norm_len"] == "max_completion_length" else s["norm_len"]
    loss, metrics = policy_loss(
        logp,
        old,
        adv,
        mask,
        eps_low=s["eps_low"],
        eps_high=s["eps_high"],
        ratio_level=s["ratio_level"],
        agg=s["agg"],
        ref_logprobs=ref,
        beta=s["beta"],
        kl_kind=s["kl_kind"],
        norm_len=norm_len,
        dual_clip=s["dual_clip"],
    )
    loss.backward()
    assert torch.isfinite(loss) and logp.grad.abs().sum() > 0
    assert "kl_mean" in metrics


def test_preset_values_from_the_papers():
    assert PRESETS["grpo"].kl.beta == 0.04 and PRESETS["grpo"].kl.kind == "k3"
    assert (PRESETS["dapo"].ratio.eps_low, PRESETS["dapo"].ratio.eps_high) == (0.2, 0.28)
    assert (PRESETS["gspo"].ratio.eps_low, PRESETS["gspo"].ratio.eps_high) == (3e-4, 4e-4)
    assert PRESETS["gspo"].ratio.level == "sequence"
    assert (
        PRESETS["dr_grpo"].advantage.estimator == "group_centre"
        and PRESETS["dr_grpo"].loss.agg == "seq-sum-norm"
    )
    # REINFORCE++: KL in the reward (k1), per-token whitening, no KL in the loss
    rpp = PRESETS["reinforce_pp"]
    assert (rpp.advantage.estimator, rpp.kl.reward_coef, rpp.kl.beta) == ("token_whiten", 0.01, 0.0)
    assert PRESETS["reinforce_pp_baseline"].advantage.estimator == "group_centre_token_whiten"
    for name in ("dapo", "dr_grpo", "gspo"):
        assert PRESETS[name].kl.beta == 0.0


# ---------------------------------------------------------------- import hygiene


def test_import_does_not_pull_in_transformers():
    code = "import grpokit.algos, sys; assert 'transformers' not in sys.modules, 'transformers imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
