"""grpokit: GRPO and its family for fine-tuning language models with verifiable rewards.

The Python API (the README's "Python API" section has a complete example)::

    from grpokit import GRPOTrainer, load_config

    cfg = load_config("cfg.yaml", ["train.steps=50"])     # or Config(), or load_config(None, [...])
    trainer = GRPOTrainer(cfg, callbacks=[lambda step, metrics, trainer: print(step, metrics["accuracy"])])
    summary = trainer.train()

Names are imported on first use, so ``import grpokit`` stays cheap (no torch, no transformers).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    "GRPOTrainer": "grpokit.trainer",
    "TrainingError": "grpokit.trainer",
    "Config": "grpokit.config",
    "ConfigError": "grpokit.config",
    "load_config": "grpokit.config",
    "config_from_dict": "grpokit.config",
    "DataError": "grpokit.data",
    "load_prompts": "grpokit.data",
    "evaluate": "grpokit.evaluate",
    "plot_training_curves": "grpokit.plots",
    "SFTConfig": "grpokit.sft_config",
    "SFTTrainer": "grpokit.sft",
    "load_sft_config": "grpokit.sft_config",
}

__all__ = [
    "Config",
    "ConfigError",
    "DataError",
    "GRPOTrainer",
    "TrainingError",
    "__version__",
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
    from grpokit.config import Config, ConfigError, config_from_dict, load_config
    from grpokit.data import DataError, load_prompts
    from grpokit.evaluate import evaluate
    from grpokit.plots import plot_training_curves
    from grpokit.sft import SFTTrainer
    from grpokit.sft_config import SFTConfig, load_sft_config
    from grpokit.trainer import GRPOTrainer, TrainingError


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'grpokit' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
