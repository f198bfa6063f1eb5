"""The config tree of ``grpokit sample`` (rejection sampling, grpokit.trainers.sample) and its checks.

    grpokit sample sample.yaml data.train=prompts.jsonl sample.n=16 keep.max_per_prompt=1

``model`` and ``data`` are grpokit train's sections (a key means the same in both); ``sample`` (how the
completions are drawn), ``rewards`` (each with a threshold ``min``), ``keep`` (which passing completions
are kept) and ``output`` are its own. Its own sections' bad values read "KEY=VALUE is not allowed:
expected ..."; the shared ones' as grpokit train words them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from grpokit.config.checks import check_output_path, check_seed, check_vllm_installed
from grpokit.config.declare import check_section, not_allowed, setting
from grpokit.config.rollout import check_stop_strings
from grpokit.config.schema import ENGINES, DataConfig, ModelConfig, RewardSpec
from grpokit.core.errors import ConfigError

FORMATS = ("jsonl", "parquet")
"""output.format: the file the kept rows are written to (samples.jsonl or samples.parquet)."""


@dataclass
class SampleSettings:
    n: int = setting(8, "Completions sampled per prompt.", range="[1, inf)", example=8)
    temperature: float = setting(
        1.0, "Sampling temperature (0 = greedy: n = 1 then).", range="[0, inf)", example=1.0
    )
    top_p: float = setting(1.0, "Nucleus sampling threshold.", range="(0, 1]", example=1.0)
    top_k: int = setting(0, "Top-k sampling (0 = off).", range="[0, inf)", meaning="0 = off")
    min_p: float = setting(
        0.0, "Min-p sampling (rollout.min_p's rule).", range="[0, 1]", example=0.05, meaning="0 = off"
    )
    repetition_penalty: float = setting(
        1.0, "Repetition penalty (rollout.repetition_penalty's rule).", range="(0, inf)", example=1.1, meaning="1 = off"
    )
    max_new_tokens: int = setting(
        256,
        "Length limit of a completion; longer ones are truncated (and dropped by keep.drop_truncated).",
        range="[1, inf)",
        example=256,
    )
    stop: list[str] = setting(
        [],
        "Stop strings (rollout.stop's rule): a completion ends at the token that completes one, kept with its text.",
        example=["</answer>"],
        check=check_stop_strings,
    )
    batch_prompts: int = setting(
        16,
        "Prompts per generation call; each batch's candidates are saved as it finishes (the unit of resume).",
        range="[1, inf)",
        example=16,
    )
    limit: int | None = setting(None, "Sample the first this many prompts only.", range="[1, inf)")
    seed: int = setting(
        0,
        "Seed of the sampling (batch b uses seed + its first prompt's index).",
        check=check_seed,
        allowed=">= 0 and < 2**63",
    )
    engine: str = setting(
        "fast", "fast | hf | vllm (rollout.engine's generators; vllm with rollout.vllm's defaults).", choices=ENGINES
    )


@dataclass
class KeepConfig:
    max_per_prompt: int = setting(
        4,
        "Keep at most this many completions per prompt (0 = all that pass).",
        range="[0, inf)",
        meaning="0 = no cap",
    )
    prefer_shortest: bool = setting(
        True, "Keep the shortest passing completions (by tokens) first, else the first sampled."
    )
    dedupe: bool = setting(
        True, "Drop a completion whose text (stripped) repeats an earlier one of the same prompt."
    )
    drop_truncated: bool = setting(True, "Drop completions that hit sample.max_new_tokens without EOS.")
    drop_empty: bool = setting(
        True, "Drop completions with no text but whitespace (EOS at once): SFT refuses an empty completion."
    )


def _finite_or_null(value: float | None, key: str) -> None:
    if value is not None and not math.isfinite(value):
        raise ConfigError(f"{key}={value!r}: expected a finite number or null.")


@dataclass
class FilterSpec(RewardSpec):
    min: float | None = setting(
        1.0,
        """Keep a completion only when this reward is >= min (null: scored and reported, not a filter).
        A value of None (the reward does not apply to the completion) passes.""",
        check=_finite_or_null,
        allowed="a finite number or null",
    )


@dataclass
class OutputConfig:
    dir: str = setting(
        "runs/sample",
        "Output folder (--output-dir).",
        check=check_output_path,
        allowed="a folder (not empty)",
    )
    format: str = setting("jsonl", "jsonl | parquet: the kept rows' file.", choices=FORMATS)
    reward_timeout_s: float = setting(
        120.0, "A reward call taking longer fails (as train.reward_timeout_s).", range="(0, inf)"
    )
    max_reward_failure_frac: float = setting(
        0.0,
        "Share of a batch's completions a reward may fail on (those rows do not pass); more stops the run.",
        range="[0, 1]",
    )


@dataclass
class SampleConfig:
    """The config tree of ``grpokit sample``."""

    model: ModelConfig = setting(ModelConfig(), "The model sampled from (any checkpoint, or a teacher).")
    data: DataConfig = setting(DataConfig(), "The prompts (data.train) and how they are rendered.")
    sample: SampleSettings = setting(
        SampleSettings(), "How many completions per prompt, and how they are sampled."
    )
    rewards: list[FilterSpec] = setting(
        [FilterSpec()], "The rewards scored on every completion; those with a min filter what is kept."
    )
    keep: KeepConfig = setting(KeepConfig(), "Which passing completions are kept.")
    output: OutputConfig = setting(
        OutputConfig(), "Where and how the kept rows are written; reward failures."
    )


def check_sample_config(cfg: SampleConfig) -> None:
    """Every setting against its declaration (the sections shared with grpokit train as it checks them, the
    sample's own with one "is not allowed" message), then the rules between settings; the first problem
    raises a one-line ConfigError naming the key."""
    for key in ("sample", "keep", "output"):
        check_section(getattr(cfg, key), key, says=not_allowed)
    check_section(cfg.model, "model")  # model.dtype and model.device, as grpokit train checks them
    check_section(cfg.data, "data")
    for i, spec in enumerate(cfg.rewards):
        check_section(spec, f"rewards[{i}]")
    s = cfg.sample
    check_vllm_installed(s.engine, "sample.engine")
    if s.temperature == 0 and s.n > 1:
        raise ConfigError(
            f"sample.temperature=0 (greedy) with sample.n={s.n}: the n completions would be equal; "
            "set sample.n=1 or a temperature > 0."
        )
    if not cfg.data.train:
        raise ConfigError("data.train is empty: give the prompts to sample from (JSONL, Parquet, ...).")
    if not cfg.rewards:
        raise ConfigError("rewards is empty: name at least one reward, e.g. rewards=[{name: math_accuracy}].")
