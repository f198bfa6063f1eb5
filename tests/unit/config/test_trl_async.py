"""TRL's AsyncGRPOConfig in grpokit's terms (grpokit.config.trl, issue 34): its bounded staleness and weight syncs
map to rollout.max_staleness and rollout.sync_every, its fixed loss to the behaviour ratio, token-mean and the
population std; what grpokit has no counterpart for is refused by name."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import yaml

from grpokit.algos.advantages import group_advantages
from grpokit.config.schema import ConfigError, load_config
from grpokit.config.trl import (
    ASYNC_DEFAULTS,
    ASYNC_MARKS,
    GRPO_ONLY,
    TRL_KEYS,
    from_trl,
    looks_like_trl,
)


def test_the_async_defaults_and_field_sets_are_trls():
    trl = pytest.importorskip("trl")
    from trl.experimental.async_grpo.async_grpo_config import AsyncGRPOConfig

    fields = {f.name: f for f in dataclasses.fields(AsyncGRPOConfig)}
    for key, value in ASYNC_DEFAULTS.items():
        assert fields[key].default == value, key
    grpo = {f.name for f in dataclasses.fields(trl.GRPOConfig)}
    # reward_weights: grpokit reads it with reward_funcs (its own key) in any TRL file
    assert GRPO_ONLY == ((grpo - set(fields)) & TRL_KEYS) - {"reward_weights"}
    assert ASYNC_MARKS <= set(fields) - grpo


def test_an_async_file_maps_to_bounded_staleness_and_the_behaviour_ratio(tmp_path):
    values, notes = from_trl(
        {"max_staleness": 2, "weight_sync_steps": 3, "num_generations": 4, "per_device_train_batch_size": 16,
         "token_budget": 0, "max_steps": 10, "epsilon_high": 0.28}
    )  # fmt: skip
    r, a = values["rollout"], values["algo"]
    assert (r["max_staleness"], r["sync_every"], r["async_ratio"], r["mismatch_correction"]) == (2, 3, "behaviour", "none")  # fmt: skip
    assert (r["group_size"], r["prompts_per_step"], r["max_new_tokens"]) == (4, 4, 2048)  # fmt: skip
    assert (a["agg"], a["advantage"], a["std_ddof"], a["std_eps"], a["beta"]) == ("token-mean", "group_std", 0, 1e-8, 0.0)  # fmt: skip
    assert (a["eps_low"], a["eps_high"], a["ratio_level"]) == (0.2, 0.28, "token")
    assert values["optim"]["schedule"] == "constant" and values["train"]["steps"] == 10
    assert values["model"]["dtype"] == "float32"
    assert any("rollout.max_staleness=2" in n for n in notes) and any("vLLM server" in n for n in notes)
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(values))
    cfg = load_config(path, [])  # grpokit's own checks take it
    assert cfg.rollout.max_staleness == 2 and cfg.rollout.async_ratio == "behaviour"
    # TRL's defaults where the file says nothing: K = 4, a push every step; max_staleness 0 is the synchronous loop
    defaults = from_trl({"token_budget": 0})[0]["rollout"]
    assert (defaults["max_staleness"], defaults["sync_every"]) == (4, 1)
    assert "max_staleness" not in from_trl({"token_budget": 0, "max_staleness": 0})[0]["rollout"]
    assert looks_like_trl({"weight_sync_steps": 2})


def test_the_async_advantage_is_the_population_std_one():
    """A group of 4 with rewards (1, 0, 0, 0): mean 0.25, population std sqrt(0.1875) = 0.4330, so TRL's async
    advantage of the success is 0.75 / 0.4330 = 1.7321 (GRPOConfig's unbiased std 0.5 would give 1.5)."""
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0])
    a = from_trl({"token_budget": 0, "num_generations": 4})[0]["algo"]
    ours = group_advantages(rewards, 4, scale="group", std_ddof=a["std_ddof"], eps=a["std_eps"])
    assert float(ours[0]) == pytest.approx(0.75 / 0.1875**0.5, abs=1e-6) == pytest.approx(1.7320508, abs=1e-6)
    grpo = from_trl({"num_generations": 4})[0]["algo"]
    unbiased = group_advantages(rewards, 4, std_ddof=grpo["std_ddof"], eps=grpo["std_eps"])
    assert float(unbiased[0]) == pytest.approx(1.5, abs=1e-3)


@pytest.mark.parametrize(
    "values, words",
    [
        ({"max_staleness": 1, "token_budget": 0, "loss_type": "grpo"}, r"\['loss_type'\] are GRPOConfig's"),
        ({"max_staleness": 1}, "token_budget=None"),
        ({"token_budget": 4096}, "token_budget=4096"),
        ({"token_budget": 0, "queue_maxsize": 64}, "queue_maxsize=64"),
        ({"token_budget": 0, "max_inflight_tasks": 8}, "max_inflight_tasks=8.*one batch at a time"),
        ({"token_budget": 0, "heartbeat_stale_after_s": 60.0}, "heartbeat_stale_after_s"),
        ({"token_budget": 0, "fork_threshold_tokens": 10}, "single-turn"),
        ({"token_budget": 0, "gradient_accumulation_steps": 2}, "gradient_accumulation_steps=2"),
        (
            {"token_budget": 0, "num_generations": 3},
            "per_device_train_batch_size=8 is not a multiple of num_generations=3",
        ),
        ({"token_budget": 0, "router_aux_loss_coef": 0.1}, "router_aux_loss_coef"),
    ],
)
def test_what_grpokit_cannot_honour_in_an_async_file_is_refused_by_name(values, words):
    with pytest.raises(ConfigError, match=words):
        from_trl(values)
