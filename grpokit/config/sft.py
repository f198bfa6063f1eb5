"""The config tree of ``grpokit sft``: supervised fine-tuning on TRL-style SFT rows.

    grpokit sft sft.yaml data.train=cold_start.jsonl optim.lr=2e-5 --output-dir runs/sft

The sections the SFT stage shares with ``grpokit train`` are the RL config's own classes (``model``,
``lora``, ``optim``, ``rewards``, ``eval``, ``train``), so a key means the same in both; only ``data``
(SFT rows instead of prompts) and ``sft`` (what the loss trains on, packing, batch size) are new. The few
shared keys that mean nothing to SFT (NOT_FOR_SFT) are refused when set, never silently ignored.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpokit.config.checks import RANGES, build_config, check_shared_sections
from grpokit.config.schema import (
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
LOSS_ON = ("auto", "completion", "all")


@dataclass
class SFTDataConfig:
    train: str = ""
    """SFT rows: JSONL, JSON, CSV, Parquet, a save_to_disk folder, a hub-layout folder, a glob or a hub id."""
    eval: str | None = None
    """Held-out SFT rows: their loss, and with a reward the verifier's accuracy on their prompts."""
    config: str | None = None
    """Configuration (subset) of a dataset read through datasets.load_dataset."""
    split: str | None = None
    """Split of data.train to read (default: train, or the only split there is)."""
    eval_split: str | None = None
    """Split of data.eval to read (default: test, or the only split there is)."""
    format: str = "auto"
    """auto | messages | prompt_completion | text (TRL's SFT conventions); auto picks by the columns."""
    messages_column: str = "messages"
    """Column of a conversation: a list of {role, content} messages."""
    prompt_column: str = "prompt"
    """Column of the prompt of prompt/completion rows: a string or messages."""
    completion_column: str = "completion"
    """Column of the completion of prompt/completion rows: a string or assistant messages."""
    text_column: str = "text"
    """Column of plain text rows (language modelling)."""
    template: str = "auto"
    """How a string prompt is rendered, as grpokit train renders it: auto | chat | plain | r1_zero."""
    system_prompt: str | None = None
    """System message prepended for chat templates (as grpokit train)."""
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra arguments of the tokenizer's apply_chat_template (as grpokit train), e.g. {enable_thinking: false}."""
    max_length: int = 1024
    """Tokens per example; a longer example is refused with its row named (or cut, with data.truncate)."""
    truncate: bool = False
    """Cut examples longer than data.max_length on the right (TRL's default) instead of refusing them."""
    shuffle: bool = True
    """Shuffle the training rows each pass (seeded)."""
    eval_limit: int | None = None
    """Evaluate on at most this many held-out rows."""


@dataclass
class SFTSettings:
    loss_on: str = "auto"
    """auto (the completion of prompt/completion rows, every assistant turn of messages, all of text) |
    completion (the same, refusing text rows) | all (every token but the first)."""
    packing: bool = False
    """Padding-free packing: a micro-batch's examples in one row, positions restarting at each, attention
    kept inside each example (the same gradient as unpacked; needs a model whose attention reads packed
    position_ids, checked when the trainer is built)."""
    batch_size: int = 8
    """Examples per optimizer step (over all ranks under torchrun)."""


@dataclass
class SFTConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    data: SFTDataConfig = field(default_factory=SFTDataConfig)
    sft: SFTSettings = field(default_factory=SFTSettings)
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=2e-5))
    rewards: list[RewardSpec] = field(default_factory=list)
    eval: EvalConfig = field(default_factory=lambda: EvalConfig(max_new_tokens=256))
    train: TrainConfig = field(default_factory=lambda: TrainConfig(output_dir="runs/sft"))


# Keys of the shared sections that do not apply to SFT, with the value they must keep.
NOT_FOR_SFT: dict[str, tuple[Any, str]] = {
    "optim.epochs": (1, "each SFT example is seen once per pass over data.train"),
    "optim.mini_batches": (1, "one optimizer step per sft.batch_size examples"),
    "train.samples_every": (10, "SFT samples nothing while training"),
    "train.stop_after_flat_steps": (5, "SFT has no rewards while training"),
    "train.max_reward_failure_frac": (0.0, "SFT has no rewards while training"),
}

SFT_RANGES: dict[str, tuple[str, Any, str]] = {
    "data.max_length": ("[2, inf)", 1024, "an example needs a token to predict and one to predict from"),
    "data.eval_limit": ("[1, inf)", 200, ""),
    "sft.batch_size": ("[1, inf)", 8, ""),
}


def check_sft_config(cfg: SFTConfig) -> None:
    """Ranges (the shared sections' from grpokit.config.checks.RANGES, and SFT_RANGES), choices, the keys
    that do not apply; the first problem raises ConfigError naming the key, the value and the fix."""
    for key, (keep, why) in NOT_FOR_SFT.items():
        section, name = key.split(".")
        value = getattr(getattr(cfg, section), name)
        if value != keep:
            raise ConfigError(f"{key}={value!r} does not apply to grpokit sft ({why}); remove it.")
    sections = {f.name for f in dataclasses.fields(cfg)}
    shared = {k: v for k, v in RANGES.items() if k.split(".")[0] in sections and not k.startswith("data.")}
    check_shared_sections(
        cfg,
        {**shared, **SFT_RANGES},
        {
            "data.format": (cfg.data.format, list(SFT_FORMATS)),
            "sft.loss_on": (cfg.sft.loss_on, list(LOSS_ON)),
        },
    )


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
    """Read a YAML file (optional), apply dotted overrides, validate, return the SFTConfig."""
    return load_config(path, overrides, build=sft_config_from_dict)


def prompt_data_config(data: SFTDataConfig) -> DataConfig:
    """The RL data settings that render a prompt the way ``grpokit train`` does (for grpokit.rollout.evaluate)."""
    return DataConfig(
        prompt_column="prompt",
        template=data.template,
        system_prompt=data.system_prompt,
        max_prompt_tokens=data.max_length,
        chat_template_kwargs=dict(data.chat_template_kwargs),
    )
