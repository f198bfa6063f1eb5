"""TRL's save_strategy / eval_strategy (grpokit.config.trl.cadence_values) and the passes they count in
(grpokit.config.schema.resolve_epochs): epochs become steps once the rows are counted, a share of the run becomes
steps of max_steps, and what cannot be honoured is said."""

from __future__ import annotations

import pytest

from grpokit.config.epochs import resolve_epochs
from grpokit.config.schema import load_config
from grpokit.config.sft import load_sft_config
from grpokit.config.trl import from_trl
from grpokit.config.trl_sft import from_trl_sft
from grpokit.core.errors import ConfigError


@pytest.mark.parametrize("convert", [from_trl_sft, from_trl], ids=["SFTConfig", "GRPOConfig"])
def test_epoch_strategies_become_each_epoch_flags_and_steps_stay_steps(convert):
    values, notes = convert({"save_strategy": "epoch", "eval_strategy": "epoch", "save_steps": 7})
    assert values["train"]["save_each_epoch"] is True and values["train"]["save_every"] == 0
    assert values["eval"]["each_epoch"] is True and "every" not in values["eval"]
    assert any("save_each_epoch" in n for n in notes)
    values, _ = convert({"save_strategy": "steps", "save_steps": 7, "eval_strategy": "steps", "eval_steps": 3})
    assert (values["train"]["save_every"], values["eval"]["every"]) == (7, 3)
    assert "save_each_epoch" not in values["train"] and "each_epoch" not in values["eval"]
    values, _ = convert({"save_strategy": "no", "save_steps": 7})
    assert values["train"]["save_every"] == 0


@pytest.mark.parametrize("convert", [from_trl_sft, from_trl], ids=["SFTConfig", "GRPOConfig"])
def test_a_share_of_the_run_is_steps_of_max_steps_and_refused_with_epochs(convert):
    """transformers reads save_steps / eval_steps below 1 as a share of the run: ceil(0.25 x 10) = 3, ceil(0.5 x
    10) = 5. Before, int(0.25) = 0 turned checkpoints off without a word."""
    values, _ = convert({"max_steps": 10, "save_steps": 0.25, "eval_strategy": "steps", "eval_steps": 0.5})
    assert (values["train"]["save_every"], values["eval"]["every"]) == (3, 5)
    with pytest.raises(ConfigError, match=r"save_steps=0\.25 is a share of the run's steps"):
        convert({"save_steps": 0.25})  # num_train_epochs: the run's length is known only with the rows


def test_save_strategy_best_is_said_not_dropped():
    values, notes = from_trl_sft({"save_strategy": "best", "save_steps": 5})
    assert values["train"]["save_every"] == 0
    assert any("save_strategy=best" in n and "last one" in n for n in notes)


def test_a_grpo_eval_every_counts_rollouts_when_a_rollout_makes_several_optimizer_steps():
    """num_iterations 4: k = 4 optimizer steps a grpokit step, so a share of max_steps 40 (grpokit: 10 steps) is
    counted in optimizer steps first, then divided: ceil(0.2 x 40) / 4 = 2."""
    values, _ = from_trl({"max_steps": 40, "num_iterations": 4, "eval_strategy": "steps", "eval_steps": 0.2})
    assert (values["train"]["steps"], values["eval"]["every"]) == (10, 2)


def test_resolve_epochs_counts_passes_in_steps_once_rows_are_known():
    """8 rows, 3 a step: a pass ends in step ceil(8/3) = 3; two epochs are ceil(2 x 8 / 3) = 6 steps."""
    cfg = load_sft_config(None, ["train.num_train_epochs=2", "train.save_each_epoch=true", "eval.each_epoch=true"])
    resolve_epochs(cfg, rows=8, per_step=3)
    assert (cfg.train.steps, cfg.train.save_every, cfg.eval.every) == (6, 3, 3)
    resolve_epochs(cfg, rows=8, per_step=3)  # a resumed run's config already holds them: the same
    assert (cfg.train.steps, cfg.train.save_every, cfg.eval.every) == (6, 3, 3)
    rl = load_config(None, ["train.save_each_epoch=true", "train.save_every=5"])
    with pytest.raises(ConfigError, match=r"train.save_each_epoch=true and train.save_every=5: choose one .* 2 steps"):
        resolve_epochs(rl, rows=20, per_step=16)
    plain = load_config(None, ["train.steps=7"])
    resolve_epochs(plain, rows=20, per_step=16)
    assert (plain.train.steps, plain.train.save_every, plain.eval.every) == (7, 0, 0)
