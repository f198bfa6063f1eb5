"""AlgoSettings: one frozen, typed object per algorithm; presets are instances; the config reads it."""

import dataclasses

import pytest
from paths import REPO

from grpokit.algos import KNOBS, PRESETS, AlgoSettings
from grpokit.algos.presets import preset_table
from grpokit.config.schema import AlgoConfig, ConfigError, load_config, resolve_algo

README = REPO / "README.md"


def test_readme_preset_table_is_the_generated_one():
    assert preset_table() in README.read_text(), "README's preset table is stale: paste preset_table()"


def test_settings_are_frozen_and_override_makes_a_copy():
    grpo = PRESETS["grpo"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        grpo.kl.beta = 0.0  # type: ignore[misc]
    changed = grpo.override(eps_high=0.28, kl_kind="k1", beta=None)  # None leaves a setting as it is
    assert (changed.ratio.eps_high, changed.kl.kind, changed.kl.beta) == (0.28, "k1", 0.04)
    assert (grpo.ratio.eps_high, grpo.kl.kind) == (0.2, "k3")
    assert changed.get("eps_high") == 0.28 and changed.flat()["kl_kind"] == "k1"
    assert AlgoSettings.of(**changed.flat()) == changed


def test_bad_settings_are_refused_with_the_flat_name():
    with pytest.raises(ValueError, match=r"unknown algorithm setting\(s\) \['eps_hi'\]"):
        PRESETS["grpo"].override(eps_hi=0.3)
    with pytest.raises(ValueError, match=r"agg='token_mean' is not one of"):
        AlgoSettings.of(agg="token_mean")
    with pytest.raises(ValueError, match=r"kl_reward_coef=-1 is out of range"):
        AlgoSettings.of(kl_reward_coef=-1)
    assert AlgoSettings.of(advantage="my_pkg.adv:estimate").advantage.estimator == "my_pkg.adv:estimate"


def test_config_algo_section_is_the_settings_knobs():
    assert sorted(f.name for f in dataclasses.fields(AlgoConfig)) == sorted(["preset", *KNOBS])


def test_config_choices_and_ranges_come_from_the_settings():
    with pytest.raises(ConfigError, match=r"algo.advantage='token_whitening'.*Did you mean 'token_whiten'"):
        load_config(None, ["algo.advantage=token_whitening"])
    with pytest.raises(ConfigError, match=r"algo.kl_reward_coef=-0.5 is out of range.*>= 0"):
        load_config(None, ["algo.kl_reward_coef=-0.5"])
    cfg = load_config(
        None, ["algo.preset=grpo", "algo.advantage=group_centre_token_whiten", "algo.kl_reward_coef=0.1"]
    )
    algo = resolve_algo(cfg)
    assert isinstance(algo, AlgoSettings)
    assert (algo.advantage.estimator, algo.kl.reward_coef, algo.kl.beta) == (
        "group_centre_token_whiten",
        0.1,
        0.04,
    )
    assert algo.uses_reference and algo.loss_kwargs()["kl_kind"] == "k3"
