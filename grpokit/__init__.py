"""grpokit: GRPO and its family for fine-tuning language models with verifiable rewards.

The Python API (docs/guides/python-api.md has complete examples)::

    from grpokit import GRPOTrainer, load_config

    cfg = load_config("cfg.yaml", ["train.steps=50"])     # or Config(), or load_config(None, [...])
    trainer = GRPOTrainer(cfg, callbacks=[lambda step, metrics, trainer: print(step, metrics["accuracy"])])
    summary = trainer.train()

Names are imported on first use, so ``import grpokit`` stays cheap (no torch, no transformers).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from grpokit.core.version import VERSION as __version__

# public name -> module that defines it
_EXPORTS = {
    "GRPOTrainer": "grpokit.trainers.grpo",
    "GRPOParts": "grpokit.trainers.parts",
    "build_parts": "grpokit.trainers.parts",
    "TrainingError": "grpokit.core.errors",
    "Config": "grpokit.config.schema",
    "ConfigError": "grpokit.config.schema",
    "load_config": "grpokit.config.schema",
    "config_from_dict": "grpokit.config.schema",
    "DataError": "grpokit.data.prompts",
    "load_prompts": "grpokit.data.prompts",
    "evaluate": "grpokit.rollout.evaluate",
    "plot_training_curves": "grpokit.run.plots",
    "SFTConfig": "grpokit.config.sft",
    "SFTTrainer": "grpokit.trainers.sft",
    "load_sft_config": "grpokit.config.sft",
}

__all__ = [
    "Config",
    "ConfigError",
    "DataError",
    "GRPOParts",
    "GRPOTrainer",
    "TrainingError",
    "__version__",
    "build_parts",
    "config_from_dict",
    "evaluate",
    "load_config",
    "load_prompts",
    "load_sft_config",
    "plot_training_curves",
    "SFTConfig",
    "SFTTrainer",
]

if TYPE_CHECKING:
    from grpokit.config.schema import Config, ConfigError, config_from_dict, load_config
    from grpokit.config.sft import SFTConfig, load_sft_config
    from grpokit.core.errors import TrainingError
    from grpokit.data.prompts import DataError, load_prompts
    from grpokit.rollout.evaluate import evaluate
    from grpokit.run.plots import plot_training_curves
    from grpokit.trainers.grpo import GRPOTrainer
    from grpokit.trainers.parts import GRPOParts, build_parts
    from grpokit.trainers.sft import SFTTrainer


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'grpokit' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
