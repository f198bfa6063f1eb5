"""What a TRL config holds before grpokit.config.trl maps it: its form (a YAML mapping, a ``trl.GRPOConfig`` object,
or its ``to_dict()``), each field's type, and the ``transformers.TrainingArguments`` fields a GRPOConfig inherits.

A GRPOConfig carries ~110 TrainingArguments fields. Those that change nothing in what a GRPO run trains (display,
the hub, dataloader workers, distributed plumbing, evaluation bookkeeping) are accepted and listed in the notes
(``TRAINING_INERT``); those that would change the run are refused by name when set to anything but their default
(``TRAINING_REFUSED_UNLESS_DEFAULT``, with why); a field neither table knows is refused unless it equals TRL's own
default (read from ``trl.GRPOConfig`` when TRL is installed).

    given, inert = trl_mapping(GRPOConfig(output_dir="out", learning_rate=1e-5))   # or .to_dict(), or a dict
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

from grpokit.core.errors import ConfigError

TRAINING_INERT = frozenset({
    "accelerator_config", "auto_find_batch_size", "average_tokens_across_devices", "batch_eval_metrics",
    "dataloader_drop_last", "dataloader_in_order", "dataloader_multiprocessing_context",
    "dataloader_persistent_workers", "dataloader_prefetch_factor", "ddp_backend", "ddp_broadcast_buffers",
    "ddp_bucket_cap_mb", "ddp_find_unused_parameters", "ddp_static_graph", "ddp_timeout", "debug", "do_predict",
    "enable_jit_checkpoint", "eval_accumulation_steps", "eval_do_concat_batches", "eval_on_start",
    "eval_use_gather_object", "greater_is_better", "hub_always_push", "hub_private_repo", "hub_revision",
    "hub_strategy", "hub_token", "ignore_data_skip", "include_for_metrics", "include_num_input_tokens_seen",
    "label_names", "length_column_name", "local_rank", "log_completions_hub_repo", "log_level_replica",
    "log_on_each_node", "logging_nan_inf_filter", "metric_for_best_model", "prediction_loss_only", "project",
    "restore_callback_states_from_checkpoint", "save_on_each_node", "skip_memory_metrics", "torch_empty_cache_steps",
    "trackio_bucket_id", "trackio_space_id", "trackio_static_space_id", "use_transformers_continuous_batching",
    "use_transformers_paged", "transformers_continuous_batching_config", "use_cache",
})  # fmt: skip
"""TrainingArguments (and GRPOConfig) fields that change nothing in what a GRPO run trains: accepted and listed.
(grpokit evaluates before training anyway, averages the loss over the whole step on every process, samples with
its own engine.)"""

_DISTRIBUTED = "grpokit shards with FSDP2 (or DDP) itself under torchrun / grpokit launch (train.distributed)"
TRAINING_REFUSED_UNLESS_DEFAULT: dict[str, tuple[Any, str]] = {
    "activation_checkpointing_kwargs": (None, "gradient checkpointing takes no arguments"),
    "deepspeed": (None, _DISTRIBUTED),
    "fsdp": (None, _DISTRIBUTED),
    "fsdp_config": (None, _DISTRIBUTED),
    "parallelism_config": (None, _DISTRIBUTED),
    "eval_delay": (0, "evaluation runs before training and every eval.every steps"),
    "full_determinism": (False, "one seed (train.seed); deterministic kernels are not forced"),
    "label_smoothing_factor": (0.0, "label smoothing is no term of the GRPO loss"),
    "use_liger_kernel": (False, "grpokit sft chunks the log-probs itself (optim.logprob_chunk_size); grpokit train "
                                "maps it to optim.fused_logprobs"),
    "liger_kernel_config": (None, "grpokit chunks the log-probs itself (optim.logprob_chunk_size)"),
    "load_best_model_at_end": (False, "the final checkpoint is the last step's"),
    "neftune_noise_alpha": (None, "no noise is added to the embeddings"),
    "optim_args": (None, "AdamW takes the optim.* settings only"),
    "optim_target_modules": (None, "AdamW takes the optim.* settings only"),
    "resume_from_checkpoint": (None, "resume with GRPOTrainer(..., resume=True or a checkpoint path) or "
                                     "grpokit train --resume"),
    "tf32": (None, "TF32 matmuls are not a setting"),
    "torch_compile_backend": (None, "no whole-model torch.compile (model.compile, rollout.compile)"),
    "torch_compile_mode": (None, "no whole-model torch.compile (model.compile, rollout.compile)"),
    "train_sampling_strategy": ("random", "prompts come shuffled (data.shuffle) or in order"),
    "vllm_structured_outputs_regex": (None, "no constrained decoding"),
}  # fmt: skip
"""TrainingArguments (and GRPOConfig) fields grpokit cannot honour: refused by name, with why, unless default."""

ALIASES = {"activation_checkpointing": "gradient_checkpointing"}
"""transformers 5's new names of fields grpokit maps (its to_dict() holds both; the new one wins when set)."""

_INT = ("an integer", lambda x: isinstance(x, int) and not isinstance(x, bool))
_NUM = ("a number", lambda x: isinstance(x, (int, float)) and not isinstance(x, bool))
_BOOL = ("true or false", lambda x: isinstance(x, bool))
_STR = ("a string", lambda x: isinstance(x, str))
KINDS: dict[str, tuple[str, Any]] = {
    **dict.fromkeys((
        "num_generations", "max_completion_length", "top_k", "per_device_train_batch_size",
        "gradient_accumulation_steps", "steps_per_generation", "generation_batch_size", "num_iterations",
        "max_steps", "seed", "logging_steps", "save_total_limit", "num_generations_eval",
        "max_prompt_length", "vllm_tensor_parallel_size", "vllm_max_model_length", "vllm_server_port",
        "vllm_group_port", "max_staleness", "weight_sync_steps", "token_budget", "max_length",
        "max_tool_calling_iterations", "ref_model_sync_steps",
    ), _INT),
    **dict.fromkeys((
        "temperature", "top_p", "min_p", "repetition_penalty", "learning_rate", "weight_decay", "adam_beta1",
        "adam_beta2", "adam_epsilon", "max_grad_norm", "num_train_epochs", "beta", "epsilon", "epsilon_high",
        "sapo_temperature_pos", "sapo_temperature_neg", "off_policy_mask_threshold", "top_entropy_quantile",
        "vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg", "entropy_coef", "entropy_target",
        "entropy_coef_delta", "entropy_coef_min", "entropy_coef_max", "warmup_steps", "warmup_ratio",
        "eval_steps", "save_steps", "delta", "vllm_gpu_memory_utilization", "vllm_importance_sampling_cap",
        "vllm_importance_sampling_clip_max", "vllm_importance_sampling_clip_min", "vllm_server_timeout",
        "ref_model_mixup_alpha",
    ), _NUM),
    **dict.fromkeys((
        "use_bias_correction_kl", "use_adaptive_entropy", "mask_truncated_completions", "gradient_checkpointing",
        "activation_checkpointing", "shuffle_dataset", "log_completions", "bf16", "fp16", "use_vllm",
        "vllm_enable_sleep_mode", "vllm_importance_sampling_correction", "trust_remote_code", "sync_ref_model",
        "disable_dropout", "cast_lm_head_to_fp32", "torch_compile", "packing", "padding_free",
        "assistant_only_loss", "activation_offloading", "use_liger_kernel",
    ), _BOOL),
    **dict.fromkeys((
        "loss_type", "importance_sampling_level", "lr_scheduler_type", "output_dir", "eval_strategy", "save_strategy",
        "multi_objective_aggregation", "vllm_mode", "vllm_importance_sampling_mode", "model_name_or_path",
        "dataset_name", "dataset_config", "dataset_train_split", "dataset_test_split", "dataset_text_field",
        "truncation_mode", "packing_strategy",
    ), _STR),
}  # fmt: skip
"""Each field's type (None is also accepted where TRL's default is None: the callers fill defaults after)."""

AT_LEAST_ONE = frozenset({
    "num_generations", "max_completion_length", "per_device_train_batch_size", "gradient_accumulation_steps",
    "steps_per_generation", "generation_batch_size", "num_iterations", "num_generations_eval", "logging_steps",
    "weight_sync_steps", "max_length", "ref_model_sync_steps",
})  # fmt: skip
"""Counts that divide or size the batch: 0 or less is refused by name (not a division by zero later)."""


def _default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


def _trl_field_defaults(trl_class: str = "GRPOConfig") -> dict[str, Any]:
    """trl.<trl_class>'s declared defaults (GRPOConfig, SFTConfig), or {} without TRL."""
    try:
        import trl

        config_class = getattr(trl, trl_class)
    except Exception:  # noqa: BLE001 - TRL absent or broken: the tables alone decide
        return {}
    return {f.name: _default(f) for f in dataclasses.fields(config_class)}


def _is_default(value: Any, default: Any) -> bool:
    if value == default or (default is None and value in ({}, [], "")):
        return True
    if default is None and isinstance(value, str) and value.startswith("<") and value.endswith("_TOKEN>"):
        return True  # TrainingArguments.to_dict() writes every *_token as "<NAME_TOKEN>", set or not
    return default == "" and value == []  # TrainingArguments.debug: '' declared, [] after __post_init__


def trl_mapping(
    args: Any, known: frozenset[str], examples: Mapping[str, Any], trl_class: str = "GRPOConfig"
) -> tuple[dict[str, Any], list[str]]:
    """(the fields grpokit.config.trl maps, the inert TrainingArguments fields given) from a TRL config: a mapping
    (a YAML file's), a ``trl.GRPOConfig`` (or any TrainingArguments dataclass with ``to_dict()``), or its
    ``to_dict()``. ``known``: the fields from_trl maps; ``examples``: their defaults, shown in a type error; ``trl_class``: whose
    declared defaults a mapping's other fields are compared with (an unknown field at its default passes). Raises
    ConfigError naming a field it cannot honour."""
    is_object = dataclasses.is_dataclass(args) and not isinstance(args, type)
    if is_object and callable(getattr(args, "to_dict", None)):
        values = args.to_dict()  # enums as their values, as a file would hold them
        declared = {f.name: _default(f) for f in dataclasses.fields(args)}
    elif isinstance(args, Mapping):
        values, declared = dict(args), None
    else:
        raise ConfigError(
            f"a TRL config must be a mapping of field: value (a GRPOConfig file), a trl.GRPOConfig or its "
            f"to_dict(); got {type(args).__name__}"
            + (" (a YAML list: write one field: value per line)" if isinstance(args, list) else "")
        )
    bad_keys = [k for k in values if not isinstance(k, str)]
    if bad_keys:
        raise ConfigError(f"TRL config keys must be field names (text); got {bad_keys[0]!r}")
    for new, old in ALIASES.items():  # transformers 5: activation_checkpointing is gradient_checkpointing
        if values.get(new) is not None:
            values[old] = values[new]
        values.pop(new, None)
    given: dict[str, Any] = {}
    inert: list[str] = []
    unknown: list[str] = []
    defaults = declared if declared is not None else (_trl_field_defaults(trl_class) if set(values) - known else {})
    for key, value in values.items():
        if key in known:
            given[key] = value
        elif key in TRAINING_INERT:  # listed when set (to_dict() holds all: those at TRL's default are not)
            if key not in defaults or not _is_default(value, defaults[key]):
                inert.append(key)
        elif key in TRAINING_REFUSED_UNLESS_DEFAULT:
            default, why = TRAINING_REFUSED_UNLESS_DEFAULT[key]
            if not _is_default(value, default):
                raise ConfigError(f"TRL {key}={value!r} is not supported: {why}; remove it")
        elif key not in defaults or not _is_default(value, defaults[key]):
            unknown.append(key)
    if unknown:
        raise ConfigError(
            f"TRL field(s) {sorted(unknown)} have no grpokit equivalent (known: every mapped {trl_class} field, see "
            f"{'grpokit.config.trl_sft' if trl_class == 'SFTConfig' else 'grpokit.config.trl'}); remove them, or "
            "write a grpokit config (grpokit config > cfg.yaml)"
        )
    check_types(given, examples)
    return given, sorted(inert)


def check_types(values: Mapping[str, Any], examples: Mapping[str, Any]) -> None:
    """Each known field's value of its type (None where TRL allows it is left to the defaults), counts >= 1:
    else a ConfigError naming the field and the value."""
    for key, value in values.items():
        if value is None or key not in KINDS:
            continue
        what, ok = KINDS[key]
        if not ok(value):
            raise ConfigError(f"TRL {key}={value!r}: expected {what}, e.g. {key}: {_example(examples.get(key), what)}")
        if what == "a number" and not math.isfinite(value) and key != "max_grad_norm":
            raise ConfigError(f"TRL {key}={value!r}: expected a finite number")
        if key in AT_LEAST_ONE and value < 1:
            raise ConfigError(f"TRL {key}={value!r}: must be at least 1")


def _example(default: Any, what: str) -> str:
    if default is not None:
        return str(default).lower() if isinstance(default, bool) else str(default)
    return {"an integer": "8", "a number": "1.0", "true or false": "true", "a string": "name"}[what]


def converted_if_flat(
    values: dict[str, Any], path: Any, looks_like: Callable[[Any], bool], convert: Callable, trl_class: str,
    shows: str,
) -> dict[str, Any]:
    """A flat TRL ``trl_class`` file (``looks_like`` says so) converted by ``convert`` (values -> (nested values,
    notes)), its notes printed once on stderr with ``shows``, the command that prints the result; any other mapping
    as it is. A field ``convert`` refuses is a ConfigError naming the file. The loaders of grpokit train
    (GRPOConfig) and grpokit sft (SFTConfig) call it."""
    import sys

    if not looks_like(values):
        return values
    try:
        converted, notes = convert(values)
    except ConfigError as e:
        raise ConfigError(f"{path} (a TRL {trl_class}): {e}") from None
    print(
        f"grpokit: {path} holds TRL {trl_class} fields; converted ({shows} shows the result):\n"
        + "\n".join(f"  - {n}" for n in notes),
        file=sys.stderr,
    )
    return converted
