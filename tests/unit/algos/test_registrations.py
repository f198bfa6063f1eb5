"""Surrogates and advantage estimators are registered with their own parameter types and flags (issue 54): a new
one is a function and a register_* call, its settings become algo.* knobs by their flat names, and every list of
who reads what (the settings' refusals, the critic, the unscored rows, torchrun's split) is read from the entries.
A setting that nothing reads is refused by name on the Python path too (issue 48), as the config's check does."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
import torch

from grpokit.algos import (
    ADVANTAGES,
    KNOBS,
    PRESETS,
    SURROGATES,
    AlgoSettings,
    IneffectiveSettingError,
    LossOptions,
    compute_advantages,
    estimator,
    policy_loss,
    register_advantage,
    register_surrogate,
)
from grpokit.algos.knobs import knob
from grpokit.algos.objectives import SapoParams, VespoParams
from grpokit.algos.token_terms import token_terms


@dataclass(frozen=True)
class ScaledParams:
    scale: float = knob(1.0, "A test surrogate's scale s.", key="scaled_s", interval="(0, inf)", example=2.0)


def scaled(x, p: ScaledParams):
    """l = -s rho A: the unclipped surrogate scaled, a surrogate small enough to check by hand."""
    return -p.scale * x.ratio * x.adv, {}


@pytest.fixture
def scaled_surrogate():
    register_surrogate("scaled", scaled, params=ScaledParams, summary="scaled by {scale:g}")
    try:
        yield
    finally:
        SURROGATES.pop("scaled")
        KNOBS.pop("scaled_s")


def test_a_registered_surrogate_is_one_function_and_its_settings_are_knobs(scaled_surrogate):
    # one token, logp - old = log 2: rho = 2, A = 1.5, s = 3 -> l = -3 * 2 * 1.5 = -9; d l / d logp = -s rho A = -9
    logp = torch.tensor([[0.0]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[-torch.log(torch.tensor(2.0)).item()]], dtype=torch.float64)
    algo = AlgoSettings.of(surrogate="scaled", scaled_s=3.0, agg="token-mean")
    assert algo.get("scaled_s") == 3.0 and algo.params_of(ScaledParams) == ScaledParams(3.0)
    loss, _ = policy_loss(
        logp, old, torch.tensor([1.5], dtype=torch.float64), torch.ones(1, 1), algo.loss_options()
    )
    loss.backward()
    assert loss.item() == pytest.approx(-9.0) and logp.grad.item() == pytest.approx(-9.0)
    # the same by the flat name as a keyword, and back from saved rollouts' JSON
    by_keyword, _ = policy_loss(
        logp, old, torch.tensor([1.5]), torch.ones(1, 1), surrogate="scaled", scaled_s=3.0
    )
    assert by_keyword.item() == pytest.approx(-9.0)
    saved = json.loads(json.dumps(algo.loss_kwargs()))
    assert saved["surrogate_params"] == {"scale": 3.0} and LossOptions(**saved) == algo.loss_options()
    # its range is checked, and the refusals know who reads it without a list of their own
    with pytest.raises(ValueError, match=r"scaled_s=0 is out of range"):
        AlgoSettings.of(surrogate="scaled", scaled_s=0)
    assert AlgoSettings.of(surrogate="clip").ineffective({"scaled_s"}) == [
        "algo.scaled_s=1: only algo.surrogate=scaled reads it, not clip"
    ]
    with pytest.raises(
        IneffectiveSettingError, match=r"algo.scaled_s=2: only algo.surrogate=scaled reads it"
    ):
        PRESETS["grpo"].override(scaled_s=2.0)


def test_the_tables_of_who_reads_what_are_the_registrations():
    # the settings a surrogate reads: its own type, and which of the shared clip range
    assert SURROGATES["sapo"].params is SapoParams and SURROGATES["vespo"].params is VespoParams
    assert SURROGATES["dppo_tv"].params is SURROGATES["dppo_kl"].params  # one is_cap for both
    assert [n for n, s in SURROGATES.items() if "dual_clip" in s.reads] == ["clip"]
    assert {n for n, s in SURROGATES.items() if s.token_ratio} == {"gmpo", "dppo_tv", "dppo_kl", "vespo"}
    # an estimator's flags: a critic, group-local (torchrun), unscored rows, step rewards
    assert [n for n, e in ADVANTAGES.items() if e.needs_critic] == ["gae"]
    assert {n for n, e in ADVANTAGES.items() if e.group_local} == {
        "group_std", "group_centre", "leave_one_out", "process_group", "none"
    }  # fmt: skip
    assert [n for n, e in ADVANTAGES.items() if e.step_rewards] == ["process_group"]
    assert estimator("rloo") is ADVANTAGES["leave_one_out"] and PRESETS["ppo"].uses_critic
    assert KNOBS["gamma"].owner is ADVANTAGES["gae"].params and KNOBS["sapo_tau_pos"].owner is SapoParams


def test_a_registered_estimator_with_its_own_parameter():
    @dataclass(frozen=True)
    class Shift:
        shift: float = knob(
            0.0, "A test estimator's shift.", key="test_shift", interval="(-inf, inf)", example=1.0
        )

    def shifted(inputs):
        """r - mean_g + shift"""
        r = inputs.rewards.reshape(-1, inputs.group_size)
        return (r - r.mean(1, keepdim=True)).reshape(-1) + inputs.params.shift

    register_advantage("shifted", shifted, params=Shift, group_local=True)
    try:
        algo = AlgoSettings.of(advantage="shifted", test_shift=0.5)
        got = compute_advantages(torch.tensor([1.0, 0.0]), 2, algo)  # mean 0.5: [0.5, -0.5] + 0.5
        assert got.tolist() == [1.0, 0.0]
        with pytest.raises(
            IneffectiveSettingError, match=r"algo.test_shift=0.5: only algo.advantage=shifted reads"
        ):
            PRESETS["grpo"].override(test_shift=0.5)
    finally:
        ADVANTAGES.pop("shifted")
        KNOBS.pop("test_shift")


def test_a_setting_nothing_reads_is_refused_on_the_python_path():
    """issue 48 item 4: AlgoSettings.override and compute_advantages took algo.gamma for an estimator that ignores
    it (the config refused it); the old code returned settings whose gamma nothing read."""
    with pytest.raises(
        IneffectiveSettingError, match=r"algo.gamma=0.9: only a critic-based estimator \(gae\)"
    ):
        PRESETS["grpo"].override(gamma=0.9)
    with pytest.raises(ValueError, match=r"algo.lam=0.5: .* advantage group_centre ignores it"):
        compute_advantages(torch.tensor([1.0, 0.0]), 2, {"advantage": "group_centre", "lam": 0.5})
    with pytest.raises(
        IneffectiveSettingError, match=r"algo.sapo_tau_neg=2: only algo.surrogate=sapo reads it"
    ):
        AlgoSettings.of(surrogate="cispo", sapo_tau_neg=2.0)
    with pytest.raises(
        TypeError, match=r"unknown loss option 'is_cap'.*is dppo_tv and dppo_kl's, not sapo's"
    ):
        LossOptions(surrogate="sapo").replace(is_cap=3.0)
    # what is read passes: the estimator's own, a change that also chooses its reader, a value left as it was
    assert PRESETS["ppo"].override(gamma=0.9).gae.gamma == 0.9
    assert AlgoSettings.of(advantage="gae", lam=0.5).gae.lam == 0.5
    assert PRESETS["grpo"].override(gamma=1.0) == PRESETS["grpo"]  # the value it has: nothing changes
    ppo = PRESETS["ppo"].override(gamma=0.5)
    assert AlgoSettings.of(**ppo.flat()) == ppo and hash(ppo) == hash(AlgoSettings.of(**ppo.flat()))
    assert compute_advantages(torch.tensor([1.0, 0.0]), 2, {"advantage": "group_centre", "std_ddof": 0}).tolist() == [
        0.5, -0.5
    ]  # fmt: skip


def test_saved_rollouts_from_before_the_parameter_types_show_the_same_terms():
    """A rollouts file written before issue 54 holds every surrogate's parameters among its loss keywords (VESPO's as
    pairs); the view passes them to token_terms, which takes the chosen surrogate's."""
    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(3, 4, generator=g, dtype=torch.float64)
    old = logp + 0.2 * torch.randn(3, 4, generator=g, dtype=torch.float64)
    adv = torch.tensor([1.0, -0.5, 0.3], dtype=torch.float64)
    mask = torch.ones(3, 4)
    before = {"sapo_tau_pos": 1.0, "sapo_tau_neg": 1.05, "is_cap": 20.0, "vespo_k": [2.0, 3.0]}
    before |= {"vespo_lambda": [0.5, 2.0], "eps_low": 0.2, "eps_high": 0.2, "dual_clip": None}
    for name, now in (("vespo", {"vespo_lambda_pos": 0.5}), ("sapo", {}), ("dppo_tv", {})):
        old_file = token_terms(logp, old, adv, mask, surrogate=name, **before)
        new_file = token_terms(logp, old, adv, mask, **AlgoSettings.of(surrogate=name, **now).loss_kwargs())
        assert torch.equal(old_file["pg"], new_file["pg"]) and torch.equal(old_file["loss"], new_file["loss"])
    # the lambda read back is the saved one: the default lambda 3 gives other terms
    default = token_terms(logp, old, adv, mask, surrogate="vespo")
    assert not torch.equal(
        default["pg"], token_terms(logp, old, adv, mask, surrogate="vespo", **before)["pg"]
    )


def test_the_docs_tables_are_the_generated_ones():
    from paths import REPO

    from grpokit.algos.presets import registry_tables

    page = (REPO / "docs" / "algorithms" / "index.md").read_text()
    assert registry_tables() in page, "docs/algorithms/index.md's tables are stale: paste registry_tables()"
