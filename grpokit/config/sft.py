"""The config tree of ``grpokit sft``: supervised fine-tuning on TRL-style SFT rows.

    grpokit sft sft.yaml data.train=cold_start.jsonl optim.lr=2e-5 --output-dir runs/sft

The sections the SFT stage shares with ``grpokit train`` are the RL config's own classes (``model``,
``lora``, ``optim``, ``rewards``, ``eval``, ``train``), so a key means the same in both; only ``data``
(SFT rows instead of prompts) and ``sft`` (what the loss trains on, packing, batch size) are new. The few
shared keys that mean nothing to SFT (NOT_FOR_SFT) are refused when set, never silently ignored.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpokit.config.checks import build_config
from grpokit.config.declare import check_tree, setting
from grpokit.config.schema import (
    TEMPLATE_NAMES,
    DataConfig,
    EvalConfig,
    LoraConfig,
    ModelConfig,
    OptimConfig,
    RewardSpec,
    TrainConfig,
    load_config,
)
from grpokit.core.errors import ConfigError

SFT_FORMATS = ("auto", "messages", "prompt_completion", "text")
"""data.format: the row formats grpokit.data.sft reads (TRL's SFT conventions)."""
LOSS_ON = ("auto", "completion", "all", "trl")
"""sft.loss_on: which tokens the loss trains on (grpokit.data.sft)."""


@dataclass
class SFTDataConfig:
    train: str = setting(
        "",
        "SFT rows: JSONL, JSON, CSV, Parquet, a save_to_disk folder, a hub-layout folder, a glob or a hub id.",
    )
    eval: str | None = setting(
        None, "Held-out SFT rows: their loss, and with a reward the verifier's accuracy on their prompts."
    )
    config: str | None = setting(
        None, "Configuration (subset) of a dataset read through datasets.load_dataset."
    )
    split: str | None = setting(
        None, "Split of data.train to read (default: train, or the only split there is)."
    )
    eval_split: str | None = setting(
        None, "Split of data.eval to read (default: test, or the only split there is)."
    )
    format: str = setting(
        "auto",
        "auto | messages | prompt_completion | text (TRL's SFT conventions); auto picks by the columns.",
        choices=SFT_FORMATS,
    )
    messages_column: str = setting(
        "messages", "Column of a conversation: a list of {role, content} messages."
    )
    prompt_column: str = setting(
        "prompt", "Column of the prompt of prompt/completion rows: a string or messages."
    )
    completion_column: str = setting(
        "completion", "Column of the completion of prompt/completion rows: a string or assistant messages."
    )
    text_column: str = setting("text", "Column of plain text rows (language modelling).")
    template: str = setting(
        "auto",
        "How a string prompt is rendered, as grpokit train renders it: auto | chat | plain | r1_zero.",
        choices=TEMPLATE_NAMES,
    )
    system_prompt: str | None = setting(
        None, "System message prepended for chat templates (as grpokit train)."
    )
    chat_template_kwargs: dict[str, Any] = setting(
        {},
        "Extra arguments of the tokenizer's apply_chat_template (as grpokit train), e.g. {enable_thinking: false}.",
    )
    max_length: int | None = setting(
        1024,
        """Tokens per example; a longer example is refused with its row named (or cut, with data.truncate). null:
        no limit of its own (TRL's max_length=None): the model's positions still bound an example.""",
        range="[2, inf)",
        example=1024,
        meaning="an example needs a token to predict and one to predict from; null = the model's positions",
    )
    truncate: bool = setting(
        False,
        "Cut examples longer than data.max_length on the right (TRL's default) instead of refusing them.",
    )
    shuffle: bool = setting(True, "Shuffle the training rows each pass (seeded).")
    eval_limit: int | None = setting(
        None, "Evaluate on at most this many held-out rows.", range="[1, inf)", example=200
    )


@dataclass
class SFTSettings:
    loss_on: str = setting(
        "auto",
        """auto (the completion of prompt/completion rows, every assistant turn of messages, all of text) |
        completion (the same, refusing text rows) | all (every token but the first) | trl (TRL's SFTTrainer
        default: the completion of prompt/completion rows, every token of messages and text rows).""",
        choices=LOSS_ON,
    )
    packing: bool = setting(
        False,
        """Padding-free packing: a micro-batch's examples in one row, positions restarting at each, attention
        kept inside each example (the same gradient as unpacked; needs a model whose attention reads packed
        position_ids, checked when the trainer is built).""",
    )
    batch_size: int = setting(
        8, "Examples per optimizer step (over all ranks under torchrun).", range="[1, inf)", example=8
    )


@dataclass
class SFTConfig:
    """The config tree of ``grpokit sft``."""

    model: ModelConfig = setting(ModelConfig(), "The model and how it loads.")
    lora: LoraConfig = setting(LoraConfig(), "A LoRA adapter instead of full fine-tuning.")
    data: SFTDataConfig = setting(SFTDataConfig(), "The SFT rows and how they are read and rendered.")
    sft: SFTSettings = setting(SFTSettings(), "What the loss trains on, packing, the batch size.")
    optim: OptimConfig = setting(OptimConfig(lr=2e-5), "The optimizer, its schedule, batching and precision.")
    rewards: list[RewardSpec] = setting(
        [], "Optional: a verifier scored on the held-out prompts (its accuracy before and after)."
    )
    eval: EvalConfig = setting(EvalConfig(max_new_tokens=256), "Evaluation on the held-out rows.")
    train: TrainConfig = setting(TrainConfig(output_dir="runs/sft"), "The run: steps, checkpoints, logging.")


# Keys of the shared sections that do not apply to SFT, with the value they must keep.
NOT_FOR_SFT: dict[str, tuple[Any, str]] = {
    "optim.epochs": (1, "each SFT example is seen once per pass over data.train"),
    "optim.mini_batches": (1, "one optimizer step per sft.batch_size examples"),
    "train.samples_every": (10, "SFT samples nothing while training"),
    "train.stop_after_flat_steps": (5, "SFT has no rewards while training"),
    "train.max_reward_failure_frac": (0.0, "SFT has no rewards while training"),
    "train.ema_decay": (0.0, "grpokit sft keeps no average of the weights (grpokit train does)"),
    "train.adopt_average": ("auto", "grpokit sft keeps no average of the weights (grpokit train does)"),
    "train.adopt_every": (10, "grpokit sft keeps no average of the weights"),
    "train.adopt_prompts": (64, "grpokit sft keeps no average of the weights"),
}


def check_sft_config(cfg: SFTConfig) -> None:
    """The keys that do not apply (NOT_FOR_SFT), then every setting against its declaration (the shared
    sections as grpokit train checks them); the first problem raises ConfigError naming the key, the value
    and the fix."""
    for key, (keep, why) in NOT_FOR_SFT.items():
        section, name = key.split(".")
        value = getattr(getattr(cfg, section), name)
        if value != keep:
            raise ConfigError(f"{key}={value!r} does not apply to grpokit sft ({why}); remove it.")
    check_tree(cfg)


def sft_config_from_dict(values: dict[str, Any]) -> SFTConfig:
    """Build and validate an SFTConfig from a nested mapping (as read from YAML)."""
    if not isinstance(values, dict):
        raise ConfigError(f"a config must be a mapping of sections, got {type(values).__name__}")
    cfg = build_config(SFTConfig, values)
    check_sft_config(cfg)
    return cfg


def validated_sft(cfg: SFTConfig) -> SFTConfig:
    """grpokit.config.schema.validated for the SFT tree: an SFTConfig built in code (``SFTTrainer(cfg)``) rebuilt from
    its values with the CLI's type checks, ranges and rules; ConfigError naming the key otherwise."""
    if not isinstance(cfg, SFTConfig):
        rl = " (a grpokit.config.schema.Config goes to GRPOTrainer)" if type(cfg).__name__ == "Config" else ""
        raise ConfigError(
            f"SFTTrainer's cfg must be a grpokit.config.sft.SFTConfig (load_sft_config builds one), got "
            f"{type(cfg).__name__}{rl}"
        )
    return sft_config_from_dict(dataclasses.asdict(cfg))


def load_sft_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> SFTConfig:
    """Read a YAML file (optional; a flat TRL SFTConfig file is converted), apply dotted overrides, validate,
    return the SFTConfig."""
    return load_config(path, overrides, build=sft_config_from_dict, convert=from_trl_sft_if_flat)


def looks_like_trl_sft(values: Any) -> bool:
    """A flat mapping with TRL SFTConfig's keys and none of grpokit's SFT sections (model:, data:, sft:, ...): the
    twin of grpokit.config.trl.looks_like_trl for GRPOConfig."""
    from grpokit.config.trl_sft import SFT_KEYS

    sections = {f.name for f in dataclasses.fields(SFTConfig)}
    return bool(values) and not (set(values) & sections) and bool(set(values) & SFT_KEYS)


def from_trl_sft_if_flat(values: dict[str, Any], path: Path) -> dict[str, Any]:
    """A flat TRL SFTConfig file (TRL's fields, none of grpokit's sections) converted by
    grpokit.config.trl_sft.from_trl_sft, its notes printed once; any other mapping as it is."""
    from grpokit.config.trl_fields import converted_if_flat
    from grpokit.config.trl_sft import from_trl_sft

    return converted_if_flat(values, path, looks_like_trl_sft, from_trl_sft, "SFTConfig", f"grpokit sft {path} --print-config")


NO_LIMIT = 2**31 - 1
"""Prompt tokens allowed when data.max_length is null: none of grpokit's own (the model's positions bound them)."""


def prompt_data_config(data: SFTDataConfig) -> DataConfig:
    """The RL data settings that render a prompt the way ``grpokit train`` does (for grpokit.rollout.evaluate)."""
    return DataConfig(
        prompt_column="prompt",
        template=data.template,
        system_prompt=data.system_prompt,
        max_prompt_tokens=data.max_length if data.max_length is not None else NO_LIMIT,
        chat_template_kwargs=dict(data.chat_template_kwargs),
    )
