"""TRL 1.16 parity of the second-generation objectives (issue 35): TRL's own loss code (GRPOTrainer._compute_loss,
and the experimental GMPOTrainer's) run on the same tensors as grpokit's policy_loss, loss and gradient compared.

TRL's loss is a trainer method; it is called here unbound on a stand-in for the trainer that holds exactly the
attributes the method reads, and whose "model forward" returns our log-probs (a leaf with a gradient). One process,
no gradient accumulation, one optimizer step per generation: the setting in which TRL's normalisers are the
whole batch's, as grpokit's always are. Tolerance: rtol 1e-5 / atol 1e-7 in float32 (the two sum in different orders)."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from grpokit.algos import PRESETS, policy_loss

trl = pytest.importorskip("trl")
pytestmark = pytest.mark.slow  # importing trl takes ~18 s on the 2-core CPU; each comparison then < 0.1 s

B, T = 6, 5


class OneProcess:
    """The accelerator calls TRL's loss makes, for one process."""

    num_processes = 1
    sync_gradients = True

    def gather(self, x):
        return x

    def gather_for_metrics(self, x):
        return x

    def reduce(self, x, reduction="sum"):
        return x

    def pad_across_processes(self, x, dim=0, pad_index=0):
        return x


def batch(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(B, T)
    mask[1, 3:] = 0
    mask[4, 1:] = 0
    old = -torch.rand(B, T, generator=g) * 2 - 0.05  # (B, T) log-probs in (-2.05, -0.05)
    logp = (old + (torch.rand(B, T, generator=g) - 0.5) * 0.8).clamp(max=-1e-3)  # ratios in e^(+-0.4)
    return {
        "logp": logp,
        "old": old,
        "ref": old + 0.2 * torch.randn(B, T, generator=g),
        "sample": old + 0.5 * torch.randn(B, T, generator=g),
        "adv": torch.tensor([1.3, -0.4, 0.0, -1.1, 0.8, -0.6]),
        "mask": mask,
    }


def grpo_trainer_class():
    """trl.GRPOTrainer (imported here, not at the top: TRL is an optional extra)."""
    from trl import GRPOTrainer

    return GRPOTrainer


def trl_loss(t: dict, trainer_cls=None, **settings) -> tuple[float, torch.Tensor]:
    """(loss, d loss / d logp) from TRL's _compute_loss on the batch ``t``; settings: GRPOConfig's names."""
    GRPOTrainer = grpo_trainer_class()

    trainer_cls = trainer_cls or GRPOTrainer
    logp = t["logp"].clone().requires_grad_(True)
    args = SimpleNamespace(
        delta=settings.get("delta"),
        sapo_temperature_pos=settings.get("sapo_temperature_pos", 1.0),
        sapo_temperature_neg=settings.get("sapo_temperature_neg", 1.05),
        use_bias_correction_kl=settings.get("use_bias_correction_kl", True),
        steps_per_generation=1,
        vespo_k_pos=settings.get("vespo_k_pos", 2.0),
        vespo_lambda_pos=settings.get("vespo_lambda_pos", 3.0),
        vespo_k_neg=settings.get("vespo_k_neg", 3.0),
        vespo_lambda_neg=settings.get("vespo_lambda_neg", 2.0),
    )
    eps = settings.get("epsilon", 0.2)
    entropy = t.get("entropy", torch.ones(B, T))
    me = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *a, **k: (logp, entropy, None),
        top_entropy_quantile=settings.get("top_entropy_quantile", 1.0),
        off_policy_mask_threshold=settings.get("off_policy_mask_threshold"),
        importance_sampling_level=settings.get("importance_sampling_level", "token"),
        beta=settings.get("beta", 0.0),
        loss_type=settings.get("loss_type", "grpo"),
        epsilon_low=eps,
        epsilon_high=settings.get("epsilon_high", eps),
        args=args,
        use_vllm=False,
        model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1,
        accelerator=OneProcess(),
        _metrics={"train": defaultdict(list)},
        _entropy_bonus_enabled=False,
        aux_loss_enabled=False,
        max_completion_length=T,
        get_off_policy_mask=GRPOTrainer.get_off_policy_mask,
        get_gamma_weights=GRPOTrainer.get_gamma_weights,
    )
    me.get_high_entropy_mask = lambda *a: GRPOTrainer.get_high_entropy_mask(me, *a)
    inputs = {
        "prompt_ids": torch.zeros(B, 1, dtype=torch.long),
        "prompt_mask": torch.ones(B, 1, dtype=torch.long),
        "completion_ids": torch.zeros(B, T, dtype=torch.long),
        "completion_mask": t["mask"],
        "advantages": t["adv"],
        "old_per_token_logps": t["old"],
        "ref_per_token_logps": t["ref"],
        "sampling_per_token_logps": t["sample"],
        "num_items_in_batch": t["mask"].sum(),
    }
    loss = trainer_cls._compute_loss(me, None, inputs)
    loss.backward()
    return loss.detach(), logp.grad


def our_loss(t: dict, **kw) -> tuple[torch.Tensor, torch.Tensor]:
    logp = t["logp"].clone().requires_grad_(True)
    loss, _ = policy_loss(
        logp, t["old"], t["adv"], t["mask"].bool(), ref_logprobs=t["ref"], sample_logprobs=t["sample"], **kw
    )
    loss.backward()
    return loss.detach(), logp.grad


def assert_same(ours, theirs):
    torch.testing.assert_close(ours[0], theirs[0], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(ours[1], theirs[1], rtol=1e-5, atol=1e-7)
    assert ours[1].abs().sum() > 0  # a gradient to compare, not two zeros


def preset_kwargs(name: str, **over) -> dict:
    kw = PRESETS[name].override(**over).loss_kwargs()
    return kw | {"norm_len": T if kw["norm_len"] == "max_completion_length" else kw["norm_len"]}


def test_cispo_is_trls_cispo():
    # TRL's epsilon_high is the cap of the weight itself (5.0 recommended): grpokit's 1 + eps_high, eps_low 1
    t = batch(1)
    assert_same(our_loss(t, **preset_kwargs("cispo")), trl_loss(t, loss_type="cispo", epsilon_high=5.0))
    # a cap that bites: 1.1 (eps_high 0.1)
    assert_same(
        our_loss(t, **preset_kwargs("cispo", eps_high=0.1)), trl_loss(t, loss_type="cispo", epsilon_high=1.1)
    )


@pytest.mark.parametrize("taus", [(1.0, 1.05), (0.5, 2.0)])
def test_sapo_is_trls_sapo(taus):
    t = batch(2)
    ours = our_loss(t, **preset_kwargs("sapo", sapo_tau_pos=taus[0], sapo_tau_neg=taus[1]))
    assert_same(
        ours, trl_loss(t, loss_type="sapo", sapo_temperature_pos=taus[0], sapo_temperature_neg=taus[1])
    )


def test_luspo_is_trls_luspo():
    t = batch(3)
    ours = our_loss(t, **preset_kwargs("luspo"))
    assert_same(ours, trl_loss(t, loss_type="luspo", importance_sampling_level="sequence"))


def test_gmpo_is_trls_experimental_gmpo():
    from trl.experimental.gmpo import GMPOTrainer

    t = batch(4)
    t["logp"] = t["old"] + (t["logp"] - t["old"]) * 2  # log-ratios up to +-0.8: the 0.4 clip bites
    assert_same(our_loss(t, **preset_kwargs("gmpo")), trl_loss(t, GMPOTrainer, epsilon=0.4))


@pytest.mark.parametrize("delta", [0.1, 0.3])
def test_off_policy_mask_is_trls(delta):
    t = batch(5)
    # mean KL to the sampler per row 0.05, 0.2, 0.5, 0.6, 0.05, 0.4: with A = [1.3, -0.4, 0, -1.1, 0.8, -0.6]
    # delta 0.1 drops rows 1, 3, 5; delta 0.3 rows 3 and 5
    t["sample"] = t["logp"] + torch.tensor([0.05, 0.2, 0.5, 0.6, 0.05, 0.4]).unsqueeze(1)
    ours = our_loss(t, **preset_kwargs("grpo", beta=0.0, off_policy_mask=delta))
    assert_same(ours, trl_loss(t, loss_type="grpo", off_policy_mask_threshold=delta))
    # and it drops something here, so the comparison is not the unmasked loss twice
    plain = our_loss(t, **preset_kwargs("grpo", beta=0.0))
    assert not torch.allclose(plain[1], ours[1])


def test_vespo_is_trls_vespo():
    t = batch(9)
    assert_same(our_loss(t, **preset_kwargs("vespo")), trl_loss(t, loss_type="vespo"))
    ours = our_loss(t, **preset_kwargs("vespo", vespo_k_pos=1.0, vespo_lambda_neg=0.5))
    assert_same(ours, trl_loss(t, loss_type="vespo", vespo_k_pos=1.0, vespo_lambda_neg=0.5))


def test_gdpo_is_trls_normalize_then_sum():
    """TRL 1.16's normalize_then_sum (grpo_trainer.py, _generate_and_score_completions), written from its code:
    each reward's group z-score (nanmean / nanstd, 1e-4), weighted nansum, then the batch's z-score; rows no reward
    scored are NaN there and get advantage 0."""
    from trl.trainer.utils import nanstd

    from grpokit.algos.advantages import batch_whitened_advantages
    from grpokit.algos.multi_reward import normalize_then_sum

    G, K = 4, 3
    g = torch.Generator().manual_seed(10)
    per_function = torch.randn(3 * G, K, generator=g) * torch.tensor([1.0, 10.0, 0.1])  # three scales
    per_function[1, 2] = float("nan")  # one reward did not apply
    per_function[6] = float("nan")  # no reward scored this row
    weights = torch.tensor([1.0, 0.5, 2.0])
    grouped = per_function.view(-1, G, K)
    z = (grouped - torch.nanmean(grouped, dim=1, keepdim=True)) / (
        nanstd(grouped, dim=1, keepdim=True) + 1e-4
    )
    rewards = (z.view(-1, K) * weights).nansum(dim=1)
    unscorable = torch.isnan(per_function).all(dim=1)
    rewards[unscorable] = float("nan")
    theirs = torch.nan_to_num((rewards - torch.nanmean(rewards)) / (nanstd(rewards) + 1e-4), nan=0.0)

    ours = batch_whitened_advantages(
        normalize_then_sum(per_function, weights, G), eps=1e-4, std_ddof=1, scored=~unscorable
    )
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    assert ours[6] == 0 and ours.abs().sum() > 0


@pytest.mark.parametrize("quantile", [0.2, 0.5])
def test_top_entropy_quantile_is_trls(quantile):
    from grpokit.algos.masks import high_entropy_mask

    t = batch(7)
    t["entropy"] = torch.rand(B, T, generator=torch.Generator().manual_seed(8)) * 3
    keep = high_entropy_mask(t["entropy"], t["mask"].bool(), quantile)
    assert 0 < keep.sum() < t["mask"].sum()
    ours = our_loss(t, **preset_kwargs("dapo"), entropy_mask=keep)
    assert_same(ours, trl_loss(t, loss_type="dapo", epsilon_high=0.28, top_entropy_quantile=quantile))


def test_bias_corrected_kl_is_trls_use_bias_correction_kl():
    t = batch(6)
    ours = our_loss(t, **preset_kwargs("grpo", beta=0.04, kl_is_correction=True))
    assert_same(ours, trl_loss(t, loss_type="grpo", beta=0.04, use_bias_correction_kl=True))
    plain = our_loss(t, **preset_kwargs("grpo", beta=0.04))
    assert_same(plain, trl_loss(t, loss_type="grpo", beta=0.04, use_bias_correction_kl=False))
    assert not torch.allclose(plain[1], ours[1])


# ------------------------------------------------------------------ the importer (grpokit.config.trl)


@pytest.mark.parametrize(
    "fields,algo",
    [
        (
            {"loss_type": "cispo", "epsilon_high": 5.0},
            {"surrogate": "cispo", "eps_low": 1.0, "eps_high": 4.0, "agg": "token-mean"},
        ),
        (
            {"loss_type": "sapo", "sapo_temperature_pos": 0.5, "sapo_temperature_neg": 2.0},
            {"surrogate": "sapo", "sapo_tau_pos": 0.5, "sapo_tau_neg": 2.0, "agg": "seq-mean-token-mean"},
        ),
        (
            {"loss_type": "luspo", "importance_sampling_level": "sequence"},
            {"surrogate": "clip", "ratio_level": "sequence", "agg": "seq-sum-norm", "norm_len": 1},
        ),
        ({"off_policy_mask_threshold": 0.5}, {"off_policy_mask": 0.5, "kl_is_correction": False}),
        (
            {"beta": 0.04},
            {"beta": 0.04, "kl_is_correction": True},
        ),  # TRL's default use_bias_correction_kl=True
        ({"beta": 0.04, "use_bias_correction_kl": False}, {"kl_is_correction": False}),
        ({"top_entropy_quantile": 0.2}, {"top_entropy_quantile": 0.2}),
        (
            {"multi_objective_aggregation": "normalize_then_sum"},
            {"reward_aggregation": "normalize_then_sum", "advantage": "batch_whiten", "std_eps": 1e-4},
        ),
        (
            {"loss_type": "vespo", "vespo_k_neg": 4.0},
            {"surrogate": "vespo", "vespo_k_neg": 4.0, "agg": "token-mean"},
        ),
    ],
)
def test_the_importer_maps_the_second_generation(fields, algo):
    from grpokit.algos import AlgoSettings
    from grpokit.config.trl import from_trl

    got = from_trl(fields)[0]["algo"]
    assert {k: got.get(k) for k in algo} == algo
    AlgoSettings.of(**{k: v for k, v in got.items() if k != "preset"})  # a valid algorithm


# ------------------------------------------------------------------ the entropy bonus (Skywork-OR1; TRL entropy_coef)


def trl_entropy_steps(t: dict, entropies: list[torch.Tensor], **settings) -> list[tuple]:
    """TRL's _compute_loss with its entropy bonus on, one call per optimizer step (one micro-batch each) over the
    batch ``t`` with the step's entropies: [(loss, d loss / d logp, d loss / d entropy, TRL's entropy_coef after)]."""
    GRPOTrainer = grpo_trainer_class()
    adaptive = settings.get("use_adaptive_entropy", False)
    args = SimpleNamespace(
        delta=None, use_bias_correction_kl=True, steps_per_generation=1,
        entropy_target=settings.get("entropy_target", 0.2), entropy_coef_delta=settings.get("entropy_coef_delta", 0.005),
        entropy_coef_min=settings.get("entropy_coef_min", 0.0), entropy_coef_max=settings.get("entropy_coef_max", 1.0),
    )  # fmt: skip
    me = SimpleNamespace(
        top_entropy_quantile=1.0, off_policy_mask_threshold=None, importance_sampling_level="token", beta=0.0,
        loss_type="dapo", epsilon_low=0.2, epsilon_high=0.28, args=args, use_vllm=False,
        model=SimpleNamespace(training=True), current_gradient_accumulation_steps=1, accelerator=OneProcess(),
        _metrics={"train": defaultdict(list)}, aux_loss_enabled=False, max_completion_length=T,
        entropy_coef=settings.get("entropy_coef", 0.0), use_adaptive_entropy=adaptive,
        _entropy_bonus_enabled=True, _last_world_entropy=float("inf"), _entropy_window_stats=None,
    )  # fmt: skip
    inputs = {
        "prompt_ids": torch.zeros(B, 1, dtype=torch.long), "prompt_mask": torch.ones(B, 1, dtype=torch.long),
        "completion_ids": torch.zeros(B, T, dtype=torch.long), "completion_mask": t["mask"],
        "advantages": t["adv"], "old_per_token_logps": t["old"], "num_items_in_batch": t["mask"].sum(),
    }  # fmt: skip
    out = []
    for entropy in entropies:
        logp, ent = t["logp"].clone().requires_grad_(True), entropy.clone().requires_grad_(True)
        me._get_per_token_logps_and_entropies = lambda *a, _l=logp, _e=ent, **k: (_l, _e, None)
        loss = GRPOTrainer._compute_loss(me, None, inputs)
        loss.backward()
        out.append((loss.detach(), logp.grad, ent.grad, me.entropy_coef))
    return out


@pytest.mark.parametrize("adaptive", [False, True])
def test_the_entropy_bonus_is_trls(adaptive):
    """The same loss and gradients (to logp and to the entropy) as TRL 1.16's entropy bonus, step after step; adaptive:
    TRL's coefficient sequence too (entropies below, below, above the target 1.0; delta 0.02; coef_max 0.03)."""
    from grpokit.algos.entropy_bonus import EntropyControl

    t = batch(9)
    g = torch.Generator().manual_seed(10)
    entropies = [torch.rand(B, T, generator=g) * s for s in (1.5, 1.5, 4.0, 1.0)]  # means ~0.75, 0.75, 2, 0.5
    settings = {"entropy_coef": 0.01, "use_adaptive_entropy": adaptive, "entropy_target": 1.0,
                "entropy_coef_delta": 0.02, "entropy_coef_max": 0.03}  # fmt: skip
    theirs = trl_entropy_steps(t, entropies, **settings)
    ctl = EntropyControl(0.01)
    for entropy, (loss, g_logp, g_ent, coef_after) in zip(entropies, theirs):
        logp, ent = t["logp"].clone().requires_grad_(True), entropy.clone().requires_grad_(True)
        ours, _ = policy_loss(
            logp, t["old"], t["adv"], t["mask"].bool(), **preset_kwargs("dapo"), entropy=ent,
            entropy_coef=ctl.applied(adaptive, 1.0),
        )  # fmt: skip
        ours.backward()
        assert_same((ours.detach(), logp.grad), (loss, g_logp))
        ours_ent = ent.grad if ent.grad is not None else torch.zeros_like(entropy)  # alpha 0: no bonus in the graph
        torch.testing.assert_close(ours_ent, g_ent, rtol=1e-5, atol=1e-8)
        mean = float((entropy * t["mask"]).sum() / t["mask"].sum())
        if adaptive:
            ctl.observe(mean, target=1.0, delta=0.02, coef_min=0.0, coef_max=0.03)
        assert ctl.coef == pytest.approx(coef_after, abs=1e-12)
    if adaptive:  # 0.01 -> 0.03 -> 0.03 (capped) -> 0.01 -> 0.03; bonus off on the first and the fourth step
        assert [c for *_, c in theirs] == pytest.approx([0.03, 0.03, 0.01, 0.03], abs=1e-12)
        assert float(theirs[0][2].abs().sum()) == 0 and float(theirs[3][2].abs().sum()) == 0


def test_the_importer_maps_the_entropy_bonus():
    from grpokit.algos import AlgoSettings
    from grpokit.config.trl import from_trl

    fields = {"entropy_coef": 0.001, "use_adaptive_entropy": True, "entropy_target": 0.3, "entropy_coef_max": 0.005}
    got, notes = from_trl(fields)
    want = {"entropy_coef": 0.001, "adaptive_entropy": True, "entropy_target": 0.3, "entropy_coef_delta": 0.005,
            "entropy_coef_min": 0.0, "entropy_coef_max": 0.005}  # fmt: skip
    assert {k: got["algo"].get(k) for k in want} == want
    assert any(n.startswith("entropy_coef:") for n in notes)
    AlgoSettings.of(**{k: v for k, v in got["algo"].items() if k != "preset"})
    assert from_trl({"entropy_coef": 0.02})[0]["algo"]["entropy_coef"] == 0.02
    assert "entropy_coef" not in from_trl({})[0]["algo"]  # TRL's default 0: no bonus


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo", "bnpo"])
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_trls_two_sided_clip_delta_is_dual_clip(loss_type, level):
    """TRL's delta (INTELLECT-2) above 1 + epsilon: the converted config (algo.dual_clip = delta) gives TRL's own
    loss and gradient. The rows of negative advantage (1, 3, 5) have log-ratios near 0.5, 0.7 and 0.4 (ratios 1.5-2 at
    either level) so that delta 1.3 bites on them; and it does bite (the loss without it differs)."""
    from grpokit.config.trl import from_trl

    t = batch(6)
    shift = torch.tensor([0.1, 0.5, 0.0, 0.7, -0.1, 0.4]).unsqueeze(1)
    t["logp"] = (t["old"] + shift + 0.05 * torch.randn(B, T, generator=torch.Generator().manual_seed(7))).clamp(max=-1e-3)
    values, _ = from_trl({"loss_type": loss_type, "delta": 1.3, "importance_sampling_level": level,
                          "max_completion_length": T})  # fmt: skip
    algo = values["algo"]
    assert algo["dual_clip"] == 1.3
    kw = preset_kwargs("grpo", **{k: algo[k] for k in ("agg", "eps_low", "eps_high", "ratio_level", "dual_clip")},
                       beta=0.0, norm_len=algo.get("norm_len"))  # fmt: skip
    ours = our_loss(t, **kw)
    assert_same(ours, trl_loss(t, loss_type=loss_type, delta=1.3, importance_sampling_level=level))
    assert not torch.allclose(our_loss(t, **(kw | {"dual_clip": None}))[1], ours[1])
