"""TRL's GRPOConfig (and the TrainingArguments it extends) in grpokit's terms: `from_trl(values)`. (Over 500 lines:
GRPOConfig's and AsyncGRPOConfig's tables and each field's mapping, read together; what a config may hold before it
is mapped, its form and types and the TrainingArguments tables, is grpokit.config.trl_fields.)

    grpokit config --from-trl trl_grpo.yaml > cfg.yaml      # the grpokit config, with notes
    grpokit train trl_grpo.yaml                             # a flat TRL file is converted the same way

Every field that has a grpokit equivalent is mapped, with TRL 1.16's default for those left out (so
the run is TRL's run, not grpokit's defaults); every other field set in the file is refused by name
with the reason. What "the same" means was checked numerically against TRL's GRPOTrainer
(tests/integration/test_trl_parity.py: per-sequence advantages and the loss gradient of one step, per loss_type and
scale_rewards mode).

Step units. TRL counts optimizer steps; a grpokit step is one rollout of `rollout.prompts_per_step`
prompts x G completions, followed by k = optim.mini_batches x optim.epochs optimizer steps, where
mini_batches = steps_per_generation / gradient_accumulation_steps and epochs = num_iterations. So
max_steps, warmup_steps, save_steps, eval_steps and logging_steps are divided by k (and refused when k
does not divide them). The learning rate changes once per grpokit step (TRL: every optimizer step), so
with k > 1 TRL's schedule is followed as a staircase of k equal steps (said in the notes).

Loss normalisers. TRL's loss is per micro-batch (per_device_train_batch_size rows) divided by the
gradient accumulation steps; grpokit's always uses the whole mini-batch's normaliser. They agree for
grpo and sapo (mean over sequences), luspo (mean over sequences of their token sums), dr_grpo (sum / (rows x
max_completion_length)) and dapo and cispo (tokens of the generation batch) when k = 1; bnpo (each micro-batch's
own token count) only without accumulation. The other cases are refused, naming the nearest setting.

The second generation (issue 35): loss_type cispo and sapo choose algo.surrogate (cispo's epsilon_high is the cap
of the weight itself, grpokit's 1 + eps_high), off_policy_mask_threshold is algo.off_policy_mask (its KL is to the
sampler's log-probs, as TRL's sampling_per_token_logps), use_bias_correction_kl with beta > 0 is
algo.kl_is_correction, top_entropy_quantile is algo.top_entropy_quantile; vespo (+ its k / lambda) is
algo.surrogate=vespo; multi_objective_aggregation=normalize_then_sum (GDPO) is algo.reward_aggregation with the
batch-whitened advantage TRL then takes. entropy_coef, use_adaptive_entropy and its entropy_target / entropy_coef_*
are algo.entropy_coef, algo.adaptive_entropy and the same names (Skywork-OR1's bonus: grpokit.algos.entropy_bonus).

TRL's AsyncGRPOConfig (trl.experimental.async_grpo, a file setting any of ASYNC_MARKS): its trainer's loss is fixed
(the clipped ratio to the sampler's own log-probs, token-mean, advantages (r - mean) / (population std + 1e-8), no
KL), so its file maps to rollout.max_staleness (max_staleness), rollout.sync_every (weight_sync_steps),
rollout.async_ratio=behaviour with no importance weights, algo.std_ddof=0 / std_eps=1e-8, model.dtype (dtype) and
the fields it shares with GRPOConfig as above; GRPOConfig's own fields in it, and the queue and worker settings
grpokit's sampler process has no counterpart for, are refused by name (``_from_trl_async``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from grpokit.config.trl_fields import TRAINING_INERT, trl_mapping
from grpokit.core.errors import ConfigError

SCALE_REWARDS = {"group": "group_std", "batch": "group_centre_reward_std", "none": "group_centre"}
"""TRL's scale_rewards -> algo.advantage (batch: std of the batch's rewards, not of the centred ones)."""

LOSS_TYPES = {
    "grpo": "seq-mean-token-mean", "dr_grpo": "seq-sum-norm", "dapo": "token-mean", "bnpo": "token-mean",
    "cispo": "token-mean", "sapo": "seq-mean-token-mean", "luspo": "seq-sum-norm", "vespo": "token-mean",
}  # fmt: skip
"""TRL's loss_type -> algo.agg (conditions in the module doc); cispo and sapo also choose algo.surrogate, luspo
sums over tokens (algo.norm_len=1). TRL's normaliser of cispo is dapo's, of sapo grpo's, of luspo a mean over
sequences of the token sums."""

SURROGATES = {"cispo": "cispo", "sapo": "sapo", "vespo": "vespo"}
"""TRL's loss_type -> algo.surrogate where it is not the clipped one."""

TRL_DEFAULTS: dict[str, Any] = {
    "num_generations": 8, "max_completion_length": 512, "temperature": 1.0, "top_p": 1.0, "top_k": 0,
    "min_p": None, "repetition_penalty": 1.0,
    "per_device_train_batch_size": 8, "gradient_accumulation_steps": 1, "steps_per_generation": None,
    "generation_batch_size": None, "num_iterations": 1, "learning_rate": 1e-6, "weight_decay": 0.0,
    "adam_beta1": 0.9, "adam_beta2": 0.999, "adam_epsilon": 1e-8, "max_grad_norm": 1.0,
    "lr_scheduler_type": "linear", "warmup_steps": 0, "max_steps": -1,
    "num_train_epochs": 3.0, "seed": 42, "beta": 0.0, "epsilon": 0.2, "epsilon_high": None,
    "importance_sampling_level": "token", "loss_type": "dapo", "scale_rewards": "group",
    "sapo_temperature_pos": 1.0, "sapo_temperature_neg": 1.05, "off_policy_mask_threshold": None,
    "use_bias_correction_kl": True, "top_entropy_quantile": 1.0, "vespo_k_pos": 2.0, "vespo_lambda_pos": 3.0,
    "vespo_k_neg": 3.0, "vespo_lambda_neg": 2.0, "multi_objective_aggregation": "sum_then_normalize",
    "entropy_coef": 0.0, "use_adaptive_entropy": False, "entropy_target": 0.2, "entropy_coef_delta": 0.005,
    "entropy_coef_min": 0.0, "entropy_coef_max": 1.0,
    "mask_truncated_completions": False, "gradient_checkpointing": True, "shuffle_dataset": True,
    "logging_steps": 10, "save_steps": 500, "save_total_limit": None, "eval_steps": None,
    "eval_strategy": "no", "save_strategy": "steps", "report_to": "none", "log_completions": False,
    "output_dir": "trainer_output", "bf16": None, "max_tool_calling_iterations": None, "disable_dropout": False,
    "delta": None, "generation_kwargs": None, "sync_ref_model": False, "ref_model_mixup_alpha": 0.6,
    "ref_model_sync_steps": 512, "use_liger_kernel": False,
}  # fmt: skip
"""TRL 1.16's defaults of the fields mapped (tests check them against trl.GRPOConfig)."""

ARGS_INERT = frozenset({
    "logging_dir", "logging_strategy", "logging_first_step", "log_level", "disable_tqdm", "run_name",
    "per_device_eval_batch_size", "dataloader_num_workers", "dataloader_pin_memory", "remove_unused_columns",
    "overwrite_output_dir", "do_train", "do_eval", "use_cpu", "push_to_hub", "hub_model_id",
    "save_only_model", "bf16_full_eval", "fp16_full_eval",
})  # fmt: skip
"""TrainingArguments fields (display, the hub, data loading) with no effect on what grpokit trains: accepted and
ignored by GRPOConfig's conversion and SFTConfig's (grpokit.config.trl_sft)."""

INERT = ARGS_INERT | {
    "num_completions_to_print", "log_unique_prompts", "ds3_gather_for_generation", "vllm_mode", "vllm_gpu_memory_utilization", "vllm_server_host", "vllm_server_port",
    "vllm_server_timeout", "vllm_tensor_parallel_size", "vllm_enable_sleep_mode", "vllm_max_model_length",
    "vllm_model_impl", "vllm_server_base_url", "vllm_group_port", "vllm_importance_sampling_correction",
    "vllm_importance_sampling_mode", "vllm_importance_sampling_cap", "vllm_importance_sampling_clip_max",
    "vllm_importance_sampling_clip_min", "log_multimodal",
}  # fmt: skip
"""GRPOConfig's fields with no effect on what is trained (ARGS_INERT; the vLLM ones when use_vllm is off, else
mapped by _vllm): accepted, ignored."""

REFUSED_UNLESS_DEFAULT: dict[str, tuple[Any, str]] = {
    "cache_implementation": (None, "the fast engine picks its cache (rollout.kv_cache)"),
    "cast_lm_head_to_fp32": (False, "log-probs are computed chunk by chunk in the model's dtype"),
    "router_aux_loss_coef": (None, "no MoE router loss"),
    "pad_to_multiple_of": (None, "no padding to a multiple"),
    "fp16": (False, "set optim.precision=fp16_mixed"),
    "gradient_checkpointing_kwargs": (None, "gradient checkpointing takes no arguments"),
    "data_seed": (None, "one seed (train.seed) for data and sampling"),
    "lr_scheduler_kwargs": (None, "the schedules take no arguments"),
    "optim": ("adamw_torch", "the optimizer is AdamW (torch's, or torch-optimi's Kahan AdamW in bf16)"),
    "torch_compile": (False, "the whole model is not compiled; model.compile fuses its norms and MLPs, rollout.compile "
                              "the decode's layers"),
}  # fmt: skip
"""Fields grpokit cannot honour: refused by name, with why, when set to anything but TRL's default."""

SAME_AS_DEFAULT = {"optim": ("adamw_torch", "adamw_torch_fused")}
"""Values that mean the default of a refused field (torch's fused AdamW is AdamW)."""

SCRIPT_KEYS = {
    "model_name_or_path": "model.name_or_path", "dataset_name": "data.train", "dataset_config": "data.config",
    "dataset_train_split": "data.split", "dataset_test_split": "data.eval_split",
}  # fmt: skip
"""TRL scripts' ScriptArguments / ModelConfig keys, often in the same YAML."""

VLLM_DEFAULTS: dict[str, Any] = {
    "vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.3, "vllm_enable_sleep_mode": False,
    "vllm_max_model_length": None, "vllm_tensor_parallel_size": 1, "vllm_importance_sampling_correction": True,
    "vllm_importance_sampling_mode": "sequence_mask", "vllm_importance_sampling_clip_max": 3.0,
    "vllm_importance_sampling_clip_min": None, "vllm_importance_sampling_cap": None,
    "vllm_server_base_url": None, "vllm_server_host": "0.0.0.0", "vllm_server_port": 8000, "vllm_server_timeout": 240.0,
}  # fmt: skip
"""TRL 1.16's defaults of the vLLM fields use_vllm=true maps (rollout.engine=vllm, rollout.vllm.*, the correction)."""

ASYNC_MARKS = frozenset({
    "max_staleness", "weight_sync_steps", "token_budget", "max_inflight_tasks", "queue_maxsize",
    "heartbeat_stale_after_s", "fork_threshold_tokens", "request_timeout", "weight_sync_timeout",
})  # fmt: skip
"""Fields only TRL's AsyncGRPOConfig has: a file setting any of them is read as one (``_from_trl_async``)."""

TRL_KEYS = frozenset(TRL_DEFAULTS) | INERT | frozenset(REFUSED_UNLESS_DEFAULT) | frozenset(SCRIPT_KEYS) | ASYNC_MARKS | {
    "use_vllm",
    "model_init_kwargs", "trust_remote_code", "num_generations_eval", "chat_template_kwargs",
    "max_prompt_length", "reward_weights", "reward_funcs", "warmup_ratio",
}
"""Every key from_trl knows (what makes a flat YAML look like a TRL one)."""


ASYNC_DEFAULTS: dict[str, Any] = {
    "max_staleness": 4, "weight_sync_steps": 1, "token_budget": None, "max_inflight_tasks": -1,
    "queue_maxsize": 1024, "heartbeat_stale_after_s": 300.0, "fork_threshold_tokens": 1024,
    "request_timeout": 600, "weight_sync_timeout": 1800, "vllm_server_base_url": "http://localhost:8000",
    "vllm_server_timeout": 240.0, "dtype": "float32", "ignore_data_skip": True,
    "max_completion_length": 2048, "lr_scheduler_type": "constant", "logging_steps": 1, "learning_rate": 1e-6,
}  # fmt: skip
"""TRL 1.16's AsyncGRPOConfig defaults: its own fields, and the shared ones whose default differs from GRPOConfig's
(tests check them against trl)."""

ASYNC_REFUSED_UNLESS_DEFAULT = {
    "queue_maxsize": "grpokit's queue holds at most rollout.max_staleness batches (the sampler process waits for room)",
    "max_inflight_tasks": "grpokit's sampler process makes one batch at a time",
    "heartbeat_stale_after_s": "grpokit notices its sampler process's death at once (the process's exit), with no heartbeat",
    "fork_threshold_tokens": "grpokit's asynchronous sampler runs single-turn rollouts",
}  # fmt: skip
"""AsyncGRPOConfig's fields grpokit cannot honour: refused by name, with why, when set to anything but TRL's default."""

ASYNC_INERT = frozenset({"request_timeout", "weight_sync_timeout", "vllm_server_base_url", "vllm_server_timeout", "ignore_data_skip"})
"""AsyncGRPOConfig's fields about its vLLM server and the Trainer's data skipping: accepted, not used (noted)."""

GRPO_ONLY = frozenset({
    "steps_per_generation", "generation_batch_size", "num_iterations", "beta", "importance_sampling_level",
    "loss_type", "scale_rewards", "sapo_temperature_pos", "sapo_temperature_neg", "off_policy_mask_threshold",
    "use_bias_correction_kl", "top_entropy_quantile", "vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg",
    "vespo_lambda_neg", "multi_objective_aggregation", "entropy_coef", "use_adaptive_entropy", "entropy_target",
    "entropy_coef_delta", "entropy_coef_min", "entropy_coef_max", "mask_truncated_completions", "shuffle_dataset",
    "log_unique_prompts", "ds3_gather_for_generation", "vllm_mode", "vllm_gpu_memory_utilization",
    "vllm_server_host", "vllm_server_port", "vllm_tensor_parallel_size", "vllm_enable_sleep_mode",
    "vllm_max_model_length", "vllm_model_impl", "vllm_group_port", "vllm_importance_sampling_correction",
    "vllm_importance_sampling_mode", "vllm_importance_sampling_cap", "vllm_importance_sampling_clip_max",
    "vllm_importance_sampling_clip_min", "log_multimodal", "delta", "generation_kwargs", "cache_implementation",
    "sync_ref_model", "disable_dropout", "cast_lm_head_to_fp32", "pad_to_multiple_of", "use_vllm",
    "num_generations_eval", "ref_model_mixup_alpha", "ref_model_sync_steps",
})  # fmt: skip
"""GRPOConfig's fields that AsyncGRPOConfig does not have (of those from_trl knows): refused in an async file."""

ASYNC_LOSS = {"loss_type": "dapo", "beta": 0.0, "scale_rewards": "group", "importance_sampling_level": "token"}
"""AsyncGRPOTrainer's fixed loss in GRPOConfig's terms: per-token clipped ratio, token-mean over the step, no KL
(its advantage's std is the population's, set after: algo.std_ddof=0, std_eps=1e-8)."""


def looks_like_trl(values: dict) -> bool:
    """A flat mapping with TRL keys and none of grpokit's sections."""
    sections = {"model", "lora", "data", "rollout", "algo", "critic", "optim", "rewards", "eval", "train"}
    return bool(values) and not (set(values) & sections) and bool(set(values) & TRL_KEYS)


def _per(name: str, value: int, k: int) -> int:
    if value % k:
        raise ConfigError(
            f"TRL {name}={value} is in optimizer steps and a grpokit step makes k={k} of them "
            f"(steps_per_generation / gradient_accumulation_steps x num_iterations); use a multiple of {k}"
        )
    return value // k


def cadence_values(v: Mapping[str, Any], per: Callable[[str, int], int] = lambda name, n: n) -> tuple[dict, dict, list[str]]:
    """(train values, eval values, notes): TRL's save_strategy / save_steps / save_total_limit and eval_strategy /
    eval_steps as grpokit's cadence. ``steps``: train.save_every / eval.every (``per`` turns TRL's optimizer steps
    into grpokit steps); ``epoch``: train.save_each_epoch / eval.each_epoch (the step in which each pass over the
    rows ends); ``best``: no best checkpoint is kept, said in a note; ``no``: only the last checkpoint, evaluation
    before and after. A share of the run (a step count below 1, as transformers reads it) becomes
    ceil(share x max_steps); with epochs instead of max_steps it is refused, naming the field."""
    train: dict[str, Any] = {"save_every": 0, "keep_checkpoints": int(v["save_total_limit"] or 0)}
    evaluation: dict[str, Any] = {}
    notes: list[str] = []

    def steps(name: str, value: float) -> int:
        if 0 < value < 1:
            if int(v["max_steps"]) <= 0:
                raise ConfigError(
                    f"TRL {name}={value} is a share of the run's steps, and with num_train_epochs grpokit counts "
                    "them only once the rows are loaded: give a number of steps, or max_steps"
                )
            value = math.ceil(value * int(v["max_steps"]))
        return per(name, int(value))

    save = str(v.get("save_strategy", "steps"))
    if save == "epoch":
        train["save_each_epoch"] = True
        notes.append("save_strategy=epoch: train.save_each_epoch, a checkpoint in the step each pass over the rows ends")
    elif save == "steps" and v["save_steps"]:
        train["save_every"] = steps("save_steps", float(v["save_steps"]))
    elif save == "best":
        notes.append(
            "save_strategy=best: grpokit keeps no best checkpoint, only the last one; for checkpoints to choose "
            "from, use save_strategy: steps and read eval.jsonl"
        )
    evaluate = str(v["eval_strategy"])
    if evaluate == "epoch":
        evaluation["each_epoch"] = True
    elif evaluate != "no":
        every = v["eval_steps"] if v["eval_steps"] is not None else v["logging_steps"]
        evaluation["every"] = steps("eval_steps" if v["eval_steps"] is not None else "logging_steps", float(every))
    return train, evaluation, notes


GENERATION_KWARGS = {
    "temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
    "repetition_penalty": "repetition_penalty", "max_tokens": "max_new_tokens", "max_new_tokens": "max_new_tokens",
    "stop": "stop", "stop_strings": "stop",
}  # fmt: skip
"""generation_kwargs keys (vLLM's SamplingParams, transformers' GenerationConfig) -> rollout.* settings. Stop strings
(vLLM's ``stop``, transformers' ``stop_strings``; a string or a list) are rollout.stop, which keeps the string in the
completion as transformers' generate does (TRL without vLLM); vLLM's own handling of the last tokens may differ."""


def sampling_kwargs(kwargs: Any) -> dict[str, Any]:
    """TRL's generation_kwargs as rollout.* values; a key with no rollout setting (min_tokens, a seed,
    include_stop_str_in_output, ...) is refused by name: ignoring it would sample otherwise than TRL's run does."""
    if not isinstance(kwargs, dict):
        raise ConfigError(f"TRL generation_kwargs={kwargs!r}: expected a mapping of sampling settings")
    other = sorted(set(kwargs) - set(GENERATION_KWARGS))
    if other:
        raise ConfigError(
            f"TRL generation_kwargs {other} have no grpokit rollout setting (those it takes: "
            f"{', '.join(sorted(GENERATION_KWARGS))}); remove them"
        )
    out = {GENERATION_KWARGS[k]: value for k, value in kwargs.items()}
    if isinstance(out.get("stop"), str):
        out["stop"] = [out["stop"]]
    return out


def reference_sync(v: Mapping[str, Any], algo: dict[str, Any], beta: float, k: int) -> list[str]:
    """TRL's sync_ref_model (TR-DPO's soft update every ref_model_sync_steps optimizer steps, by
    ref_model_mixup_alpha) as algo.ref_sync_every (in grpokit steps: divided by k) and algo.ref_sync_alpha; the notes.
    Refused with beta 0, as TRL does (no reference to move); its LoRA refusal is grpokit's own (config checks)."""
    changed = [key for key in ("ref_model_mixup_alpha", "ref_model_sync_steps") if v[key] != TRL_DEFAULTS[key]]
    if not v["sync_ref_model"]:
        return [f"{', '.join(changed)}: no effect without sync_ref_model=True (as in TRL)"] if changed else []
    if beta == 0:
        raise ConfigError(
            "TRL sync_ref_model=True with beta=0.0: there is no reference model to synchronize (no KL); set beta > 0 "
            "or sync_ref_model=False (TRL refuses this too)"
        )
    every = _per("ref_model_sync_steps", int(v["ref_model_sync_steps"]), k)
    algo.update(ref_sync_every=every, ref_sync_alpha=float(v["ref_model_mixup_alpha"]))
    return [
        f"sync_ref_model: algo.ref_sync_every={every}, algo.ref_sync_alpha={float(v['ref_model_mixup_alpha']):g} (the "
        "reference moves toward the policy after every such step; checkpoints hold it in reference/)"
    ]


def two_sided_clip(algo: dict[str, Any], delta: float, loss_type: str, eps_high: float) -> str:
    """TRL's ``delta`` (INTELLECT-2's two-sided clip, -min(min(rho, delta) A, clip(rho) A)) in grpokit's terms, put in
    ``algo``; the note that says so. With delta > 1 + eps_high it is dual-clip PPO's bound for negative advantages,
    algo.dual_clip = delta: for A < 0 the loss is |A| max(min(rho, delta), clip(rho)) = |A| min(max(rho, clip(rho)),
    delta), and for A > 0 min(rho, delta) never goes below min(rho, clip(rho)) <= 1 + eps_high. Below that it also
    cuts positive advantages' ratio at delta, which no grpokit rule does: refused, naming the bound. TRL applies it
    to its clipped losses only (not cispo, sapo, vespo): there it changes nothing, as in TRL, and the note says so."""
    if SURROGATES.get(loss_type, "clip") != "clip":
        return f"delta={delta:g}: TRL's two-sided clip is for its clipped losses; with loss_type={loss_type} it has no effect"
    if delta <= 1 + eps_high:
        raise ConfigError(
            f"TRL delta={delta:g} is not above 1 + epsilon_high = {1 + eps_high:g}: there TRL's two-sided clip also cuts "
            f"the ratio of positive advantages at delta, which grpokit has no rule for; use a delta above "
            f"{1 + eps_high:g} (TRL recommends one greater than 1 + epsilon)"
        )
    algo["dual_clip"] = delta
    return f"delta={delta:g}: algo.dual_clip={delta:g} (TRL's two-sided clip above 1 + epsilon_high is dual-clip PPO's bound)"


def from_trl(args: Any, tools: Sequence[str] = (), environment: Any = None) -> tuple[dict[str, Any], list[str]]:
    """TRL GRPOConfig fields -> (grpokit's nested config values, notes for the user). ``args``: a flat mapping (a
    TRL YAML file's), a ``trl.GRPOConfig`` object or its ``to_dict()``; the TrainingArguments fields that change
    nothing in a GRPO run are accepted and listed in the notes (grpokit.config.trl_fields).

    Raises ConfigError naming the first field grpokit cannot honour and why (a value of the wrong type too). A file
    with AsyncGRPOConfig's own fields (ASYNC_MARKS) is read as an AsyncGRPOConfig (``_from_trl_async``)."""
    values, inert = trl_mapping(args, TRL_KEYS | (ASYNC_INERT - TRAINING_INERT) | {"dtype"}, TRL_DEFAULTS)
    if set(values) & ASYNC_MARKS:
        out, notes = _from_trl_async(values, tools, environment)
        return out, notes + inert_note(inert)
    unknown = sorted(set(values) - TRL_KEYS)
    if unknown:
        raise ConfigError(
            f"TRL field(s) {unknown} have no grpokit equivalent (known: every mapped GRPOConfig field, see "
            "grpokit.config.trl); remove them, or write a grpokit config (grpokit config > cfg.yaml)"
        )
    for key, (default, why) in REFUSED_UNLESS_DEFAULT.items():
        value = values.get(key, default)
        if value != default and not (default is None and value == {}) and str(value) not in SAME_AS_DEFAULT.get(key, ()):
            raise ConfigError(f"TRL {key}={values[key]!r} is not supported: {why}; remove it")
    v = {**TRL_DEFAULTS, **values}
    notes: list[str] = inert_note(inert)
    out: dict[str, dict[str, Any]] = {s: {} for s in ("model", "data", "rollout", "algo", "optim", "eval", "train")}

    # batch geometry: rows per micro-batch, per optimizer step, per generation
    G, B, GA = int(v["num_generations"]), int(v["per_device_train_batch_size"]), int(v["gradient_accumulation_steps"])
    gbs, spg = v["generation_batch_size"], v["steps_per_generation"]
    if gbs is not None and spg is not None and gbs == B * spg:  # a GRPOConfig's own: __post_init__ sets both
        gbs = None
    if gbs is not None and spg is not None:
        raise ConfigError("TRL generation_batch_size and steps_per_generation are both set; TRL allows one")
    spg = int(spg) if spg is not None else (int(gbs) // B if gbs is not None else GA)
    gbs = int(gbs) if gbs is not None else B * spg
    if gbs % G or spg % GA or gbs != B * spg:
        raise ConfigError(
            f"TRL generation_batch_size={gbs} must be a multiple of num_generations={G} and of "
            f"per_device_train_batch_size={B}, and steps_per_generation={spg} a multiple of "
            f"gradient_accumulation_steps={GA}"
        )
    mini_batches, epochs = spg // GA, int(v["num_iterations"])
    k = mini_batches * epochs
    out["rollout"].update(group_size=G, prompts_per_step=gbs // G, max_new_tokens=int(v["max_completion_length"]))
    iterations = v["max_tool_calling_iterations"]
    if tools or environment:  # the trainer's tools= / environment_factory=: max_completion_length bounds the
        # whole episode, the model's turns and the tools' results together; max_tool_calling_iterations the rounds
        # of calls (None: until a turn calls no tool or the tokens run out, so as many turns as tokens)
        if tools:
            out["rollout"]["tools"] = list(tools)
        if environment:
            out["rollout"]["environment"] = environment
        out["rollout"]["max_episode_tokens"] = int(v["max_completion_length"])
        out["rollout"]["max_turns"] = int(iterations) + 1 if iterations is not None else int(v["max_completion_length"])
    elif iterations is not None:
        notes.append("max_tool_calling_iterations: no tools given to the trainer, so no effect")
    out["optim"].update(mini_batches=mini_batches, epochs=epochs, micro_batch_size=B)
    notes.append(
        f"one grpokit step = one rollout of {gbs // G} prompts x {G} completions = k={k} TRL optimizer step(s) "
        f"of {B * GA} completions (steps_per_generation {spg} / gradient_accumulation_steps {GA} x "
        f"num_iterations {epochs}); step counts below are divided by k"
    )
    for key in ("temperature", "top_p", "top_k", "repetition_penalty"):
        out["rollout"][key] = v[key]
    out["rollout"]["min_p"] = 0.0 if v["min_p"] is None else v["min_p"]  # TRL's None: off
    if v["generation_kwargs"]:  # TRL: they take precedence over the fields of the same meaning
        out["rollout"].update(sampling_kwargs(v["generation_kwargs"]))
        notes.append(f"generation_kwargs {sorted(v['generation_kwargs'])}: rollout.* (they win over the fields)")

    # the algorithm: laid over the grpo preset, every axis said
    loss_type, scale = v["loss_type"], v["scale_rewards"]
    scale = {True: "group", False: "none"}.get(scale, scale)
    if loss_type not in LOSS_TYPES:
        raise ConfigError(
            f"TRL loss_type={loss_type!r} is not supported; "
            f"choose one of {sorted(LOSS_TYPES)}"
        )
    if scale not in SCALE_REWARDS:
        raise ConfigError(f"TRL scale_rewards={scale!r}: choose one of {sorted(SCALE_REWARDS)}")
    if loss_type == "bnpo" and GA > 1:
        raise ConfigError(
            "TRL loss_type='bnpo' with gradient_accumulation_steps > 1 divides each micro-batch by its own "
            "token count (the result depends on how the batch is split; 13.5% off in one test); grpokit "
            "normalises by the whole mini-batch: use loss_type='dapo' (the same, split-free) or accumulation 1"
        )
    if loss_type in ("dapo", "cispo", "vespo") and mini_batches > 1:
        raise ConfigError(
            f"TRL loss_type={loss_type!r} with steps_per_generation > gradient_accumulation_steps divides every "
            "optimizer step by the generation batch's tokens / steps (not the step's own tokens); grpokit "
            "uses the mini-batch's own token count: set steps_per_generation = gradient_accumulation_steps"
        )
    beta = float(v["beta"])
    eps = float(v["epsilon"])
    eps_high = float(v["epsilon_high"] if v["epsilon_high"] is not None else eps)
    # TRL's cispo caps the weight at epsilon_high itself, min(rho, epsilon_high), with no lower bound
    if loss_type == "cispo":
        if eps_high <= 1:
            raise ConfigError(
                f"TRL loss_type='cispo' caps the importance weight at epsilon_high={eps_high:g} itself (not at "
                "1 + epsilon_high), so every token's weight would be below 1; set epsilon_high above 1 (TRL "
                "recommends 5.0)"
            )
        eps, eps_high = 1.0, eps_high - 1.0
    out["algo"].update(
        preset="grpo", advantage=SCALE_REWARDS[scale], std_ddof=1, std_eps=1e-4, agg=LOSS_TYPES[loss_type],
        eps_low=eps, eps_high=eps_high, beta=beta, kl_kind="k3", ratio_level=v["importance_sampling_level"],
        surrogate=SURROGATES.get(loss_type, "clip"), kl_is_correction=beta > 0 and bool(v["use_bias_correction_kl"]),
        mask_truncated=bool(v["mask_truncated_completions"]), dynamic_sampling=False, overlong_shaping=False,
    )  # fmt: skip
    notes += reference_sync(v, out["algo"], beta, k)
    if v["delta"] is not None:  # INTELLECT-2's two-sided clip: TRL's min(rho, delta) inside the clipped surrogate
        notes.append(two_sided_clip(out["algo"], float(v["delta"]), loss_type, eps_high))
    if loss_type == "dr_grpo":
        out["algo"]["norm_len"] = int(v["max_completion_length"])
    if loss_type == "luspo":
        out["algo"]["norm_len"] = 1
    if loss_type == "sapo":
        taus = float(v["sapo_temperature_pos"]), float(v["sapo_temperature_neg"])
        out["algo"].update(sapo_tau_pos=taus[0], sapo_tau_neg=taus[1])
    if loss_type == "vespo":
        out["algo"].update({key: float(v[key]) for key in ("vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg")})
        if v["importance_sampling_level"] != "token":
            raise ConfigError("TRL loss_type='vespo' builds its own sequence weight: set importance_sampling_level: token")
    aggregation = v["multi_objective_aggregation"]
    if aggregation not in ("sum_then_normalize", "normalize_then_sum"):
        raise ConfigError(
            f"TRL multi_objective_aggregation={aggregation!r}: choose sum_then_normalize or normalize_then_sum"
        )
    if aggregation == "normalize_then_sum":  # GDPO: per-reward group normalisation, then the batch's (TRL's code)
        out["algo"].update(reward_aggregation=aggregation, advantage="batch_whiten")
    if float(v["top_entropy_quantile"]) < 1:
        out["algo"]["top_entropy_quantile"] = float(v["top_entropy_quantile"])
        notes.append(
            "top_entropy_quantile: the entropies that choose the tokens are the policy's before the update, over "
            "each mini-batch (TRL: the current policy's, over each micro-batch); the same on one micro-batch"
        )
    if v["off_policy_mask_threshold"] is not None:
        out["algo"]["off_policy_mask"] = float(v["off_policy_mask_threshold"])
    if float(v["entropy_coef"]) != 0 or v["use_adaptive_entropy"]:  # Skywork-OR1's entropy bonus
        out["algo"]["entropy_coef"] = float(v["entropy_coef"])
        if v["use_adaptive_entropy"]:
            keys = ("entropy_target", "entropy_coef_delta", "entropy_coef_min", "entropy_coef_max")
            out["algo"].update(adaptive_entropy=True, **{key: float(v[key]) for key in keys})
        notes.append(
            "entropy_coef: the bonus is the entropy's token mean over each mini-batch (TRL: over each micro-batch, "
            "divided by the accumulation steps); the same with one micro-batch per optimizer step"
        )

    # optimisation
    out["optim"].update(optimiser_values(v, notes, k))

    # length of the run, checkpoints, evaluation, logging
    max_steps = int(v["max_steps"])
    if max_steps > 0:
        out["train"]["steps"] = _per("max_steps", max_steps, k)
    else:
        out["train"]["num_train_epochs"] = float(v["num_train_epochs"])
        notes.append(f"max_steps unset: num_train_epochs={v['num_train_epochs']} passes over the prompts")
    out["train"]["seed"] = int(v["seed"])
    out["train"]["stop_after_flat_steps"] = 0  # TRL trains on through steps without reward spread
    notes.append("train.stop_after_flat_steps=0: TRL has no stop after steps without reward spread (grpokit's default: 5)")
    out["train"]["adopt_average"] = False  # TRL trains its policy's own weights only
    notes.append("train.adopt_average=false: TRL's policy never takes the weights of an average of itself (grpokit's "
                 "default: auto, on a CPU)")
    out["train"]["output_dir"] = str(v["output_dir"])
    train, evaluation, cadence_notes = cadence_values(v, lambda name, n: _per(name, n, k))
    out["train"].update(train)
    out["eval"].update(evaluation)
    notes += cadence_notes
    out["model"]["gradient_checkpointing"] = bool(v["gradient_checkpointing"])
    if v["disable_dropout"]:
        out["model"]["disable_dropout"] = True
    if v["use_liger_kernel"]:  # liger's fused log-prob loss: the same numbers up to rounding, grpokit's own kernels
        out["optim"]["fused_logprobs"] = True
        notes.append("use_liger_kernel: grpokit's fused log-softmax (optim.fused_logprobs); liger's own kernels "
                     "(RMSNorm, RoPE, SwiGLU) are not applied")  # fmt: skip
    out["data"]["shuffle"] = bool(v["shuffle_dataset"])
    out["train"]["report_to"] = report_targets(v["report_to"])
    if v["log_completions"]:
        out["train"]["samples_every"] = max(1, _per("logging_steps", int(v["logging_steps"]), k))
    notes.append("logging_steps: grpokit logs every step")

    # optional fields
    if "num_generations_eval" in v and v["num_generations_eval"] is not None:
        out["eval"]["num_samples"] = int(v["num_generations_eval"])
    if v.get("chat_template_kwargs"):
        out["data"]["chat_template_kwargs"] = dict(v["chat_template_kwargs"])
    if v.get("max_prompt_length") is not None:
        out["data"]["max_prompt_tokens"] = int(v["max_prompt_length"])
        notes.append("max_prompt_length: longer prompts are refused with the row named, not truncated")
    out["model"].update(model_init_values(v, notes))
    for key, dotted in SCRIPT_KEYS.items():
        if v.get(key) is not None:
            section, name = dotted.split(".")
            out[section][name] = v[key]
    funcs, weights = v.get("reward_funcs"), v.get("reward_weights")
    if funcs is not None:
        funcs = [funcs] if isinstance(funcs, str) else list(funcs)
        weights = [1.0] * len(funcs) if weights is None else list(weights)
        if len(weights) != len(funcs):
            raise ConfigError(f"TRL reward_weights has {len(weights)} values for {len(funcs)} reward_funcs")
        out["rewards"] = [{"name": f, "weight": float(w)} for f, w in zip(funcs, weights)]  # type: ignore[assignment]
    elif weights is not None:
        raise ConfigError(
            "TRL reward_weights needs the rewards it weighs: add reward_funcs: [math_accuracy, ...] (grpokit "
            "reward names) to the file, or write rewards: [{name: ..., weight: ...}] in a grpokit config"
        )
    if v.get("use_vllm"):
        _vllm(v, out, notes)
    return {key: section for key, section in out.items() if section}, notes


def optimiser_values(v: dict[str, Any], notes: list[str], k: int = 1) -> dict[str, Any]:
    """The optim section from TRL's TrainingArguments fields (``v``: every mapped field, defaults filled): AdamW's
    settings, the schedule and warm-up (in grpokit steps: TRL's optimizer steps / k), the precision. Shared by
    GRPOConfig's and SFTConfig's conversions (grpokit.config.trl_sft)."""
    optim: dict[str, Any] = dict(
        lr=float(v["learning_rate"]), weight_decay=float(v["weight_decay"]), adam_beta1=float(v["adam_beta1"]),
        adam_beta2=float(v["adam_beta2"]), adam_epsilon=float(v["adam_epsilon"]),
        max_grad_norm=float(v["max_grad_norm"] or 0.0),
    )  # fmt: skip
    schedule = {"linear": "linear", "cosine": "cosine", "constant": "constant", "constant_with_warmup": "constant"}
    if v["lr_scheduler_type"] not in schedule:
        raise ConfigError(f"TRL lr_scheduler_type={v['lr_scheduler_type']!r}: choose one of {sorted(schedule)}")
    optim["schedule"] = schedule[v["lr_scheduler_type"]]
    ratio = v.get("warmup_ratio") or (v["warmup_steps"] if 0 < v["warmup_steps"] < 1 else 0)
    if ratio:  # transformers 5: a warmup_steps in (0, 1) is a ratio of the steps (older: warmup_ratio)
        optim["warmup_ratio"] = float(ratio)
    else:
        optim["warmup_steps"] = _per("warmup_steps", int(v["warmup_steps"]), k)
    if k > 1:
        notes.append(f"the learning rate changes once per grpokit step, i.e. every {k} TRL optimizer steps")
    if v["bf16"] is True:
        optim["precision"] = "bf16_mixed"
    elif v.get("bf16") is None:
        notes.append(
            "TRL's bf16=None means bf16 autocast over float32 weights on a GPU (optim.precision=bf16_mixed); "
            "grpokit's optim.precision=auto uses bf16 weights with Kahan-compensated AdamW there (bf16_kahan)"
        )
    return optim


def report_targets(report: Any) -> list[str]:
    """TRL's report_to (a name, a list, "all" or None) as train.report_to; an unknown tracker is refused."""
    report = [report] if isinstance(report, str) else list(report or ["none"])
    report = ["tensorboard", "wandb", "mlflow"] if report == ["all"] else report
    bad = [r for r in report if r not in ("tensorboard", "wandb", "mlflow", "none")]
    if bad:
        raise ConfigError(f"TRL report_to={bad}: grpokit reports to tensorboard, wandb, mlflow or none")
    return report


def model_init_values(v: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    """The model section from TRL's model_init_kwargs (dtype, attn_implementation, trust_remote_code; use_cache
    noted, a revision other than main and anything else refused by name)."""
    model: dict[str, Any] = {}
    init = dict(v.get("model_init_kwargs") or {})
    dtype = init.pop("dtype", init.pop("torch_dtype", None))
    if dtype is not None:
        model["dtype"] = str(dtype).replace("torch.", "")
    if "attn_implementation" in init:
        model["attn_implementation"] = init.pop("attn_implementation")
    trust = init.pop("trust_remote_code", v.get("trust_remote_code", False))
    model["trust_remote_code"] = bool(trust)
    if init.pop("use_cache", None) is not None:  # open-r1 sets it from gradient_checkpointing
        notes.append("model_init_kwargs use_cache: no effect (grpokit's training passes run without a KV cache and "
                     "its rollout engine keeps its own)")  # fmt: skip
    revision = init.pop("revision", None)
    if revision not in (None, "main"):  # "main": the hub's default, what a model without a revision loads
        raise ConfigError(
            f"TRL model_init_kwargs revision={revision!r}: grpokit loads a model folder or a hub id at its default "
            f"branch; download that revision (hf download REPO --revision {revision} --local-dir DIR) and give DIR "
            "as the model"
        )
    if init:
        raise ConfigError(f"TRL model_init_kwargs {sorted(init)} have no grpokit equivalent; remove them")
    return model


def _from_trl_async(
    values: dict[str, Any], tools: Sequence[str] = (), environment: Any = None
) -> tuple[dict[str, Any], list[str]]:
    """TRL AsyncGRPOConfig fields -> (grpokit's config values, notes): the shared fields as from_trl maps them over
    AsyncGRPOConfig's defaults and its fixed loss (ASYNC_LOSS), then the asynchronous settings (module doc)."""
    marks = sorted(set(values) & ASYNC_MARKS)
    grpo_only = sorted(set(values) & GRPO_ONLY)
    if grpo_only:
        raise ConfigError(
            f"TRL field(s) {grpo_only} are GRPOConfig's, not AsyncGRPOConfig's, and this file sets AsyncGRPOConfig's "
            f"{marks}: AsyncGRPOTrainer's loss is fixed (the clipped ratio to the sampler's log-probs, token-mean, "
            "no KL). Remove them, or the asynchronous fields for a GRPOConfig file"
        )
    v = {**ASYNC_DEFAULTS, **values}
    for key, why in ASYNC_REFUSED_UNLESS_DEFAULT.items():
        if v[key] != ASYNC_DEFAULTS[key]:
            raise ConfigError(f"TRL AsyncGRPOConfig {key}={v[key]!r} is not supported: {why}; remove it")
    if v["token_budget"] is None or int(v["token_budget"]) > 0:
        raise ConfigError(
            f"TRL AsyncGRPOConfig token_budget={v['token_budget']!r} (None: the vLLM server's max_model_len) fills "
            "each optimizer step with as many samples as fit in that many tokens per rank, a number that varies; "
            "a grpokit step has rollout.prompts_per_step x group_size completions. Set token_budget: 0 (TRL then "
            "takes per_device_train_batch_size samples a step per process)"
        )
    G = int(v.get("num_generations", TRL_DEFAULTS["num_generations"]))
    B = int(v.get("per_device_train_batch_size", TRL_DEFAULTS["per_device_train_batch_size"]))
    if int(v.get("gradient_accumulation_steps", 1)) != 1:
        raise ConfigError(
            f"TRL AsyncGRPOConfig gradient_accumulation_steps={v['gradient_accumulation_steps']}: AsyncGRPOTrainer "
            "divides each micro-batch's loss by that micro-batch's own tokens, grpokit by the step's; set "
            "gradient_accumulation_steps: 1 (and a larger per_device_train_batch_size)"
        )
    if B % G:
        raise ConfigError(
            f"TRL AsyncGRPOConfig per_device_train_batch_size={B} is not a multiple of num_generations={G}: a "
            "grpokit step trains whole groups; use a multiple of num_generations"
        )
    shared = {key: v[key] for key in ("max_completion_length", "lr_scheduler_type", "logging_steps", "learning_rate")}
    own = ASYNC_MARKS | ASYNC_INERT | {"dtype"}
    out, notes = from_trl({**shared, **ASYNC_LOSS, **{k: x for k, x in values.items() if k not in own}}, tools, environment)
    out.setdefault("algo", {}).update(std_ddof=0, std_eps=1e-8)
    out.setdefault("model", {}).setdefault("dtype", str(v["dtype"]))  # a dtype in model_init_kwargs comes first
    k, every = int(v["max_staleness"]), int(v["weight_sync_steps"])
    if k > 0:
        out.setdefault("rollout", {}).update(
            max_staleness=k, sync_every=every, async_ratio="behaviour", mismatch_correction="none"
        )
        notes.append(
            f"AsyncGRPOConfig: rollout.max_staleness={k} (max_staleness), rollout.sync_every={every} "
            "(weight_sync_steps), the ratio to the sampler's log-probs (rollout.async_ratio=behaviour, no importance "
            "weights), advantages with the population std + 1e-8 (algo.std_ddof=0, std_eps=1e-8), token-mean, no KL"
        )
    else:  # only samples of the current weights: the synchronous loop
        notes.append("AsyncGRPOConfig max_staleness=0: only fresh samples, grpokit's synchronous loop (rollout.max_staleness=0)")
    notes.append(
        "AsyncGRPOTrainer generates on a vLLM server; grpokit's sampler process generates with rollout.engine (CPU "
        f"only for now, docs/guides/async.md). Not used: {', '.join(sorted(ASYNC_INERT))}"
    )
    notes.append(
        f"a TRL step takes per_device_train_batch_size x num_processes samples: here {B} ({B // G} prompts x {G}) "
        "for one process; under grpokit launch set rollout.prompts_per_step to the total prompts a step"
    )
    return out, notes


def _vllm(v: dict[str, Any], out: dict[str, dict[str, Any]], notes: list[str]) -> None:
    """use_vllm=true: rollout.engine=vllm (colocated, or vllm_mode server: rollout.vllm.mode=server at TRL's
    vllm_server_base_url or host:port), its settings, and TRL's importance-sampling correction
    as rollout.mismatch_correction / _cap / _floor (grpokit.algos.mismatch: the same four modes)."""
    w = {**VLLM_DEFAULTS, **{k: v[k] for k in VLLM_DEFAULTS if k in v}}
    if w["vllm_mode"] not in ("colocate", "server"):
        raise ConfigError(f"TRL vllm_mode={w['vllm_mode']!r}: choose colocate or server")
    if int(w["vllm_tensor_parallel_size"]) != 1:
        raise ConfigError(f"TRL vllm_tensor_parallel_size={w['vllm_tensor_parallel_size']}: grpokit's engine uses one device")
    if w["vllm_mode"] == "server":  # the engine's own settings are the server's (grpokit vllm-serve options)
        url = w["vllm_server_base_url"] or f"http://{w['vllm_server_host']}:{int(w['vllm_server_port'])}"
        vllm = {"mode": "server", "server_url": url, "server_timeout_s": float(w["vllm_server_timeout"])}
        vllm["collective_port"] = int(v.get("vllm_group_port", 51216))
        given = [k for k in ("vllm_gpu_memory_utilization", "vllm_enable_sleep_mode", "vllm_max_model_length") if k in v]
        notes.append(
            f"vllm_mode: server: rollout.vllm.mode=server at {url}; start the server with grpokit vllm-serve "
            "--model MODEL --port PORT (not trl vllm-serve); grpokit pushes weights over HTTP by default, TRL over "
            "NCCL: rollout.vllm.weight_transfer=collective does that (at vllm_group_port, rollout.vllm.collective_port)"
            + (f"; {', '.join(given)} are the server's options (grpokit vllm-serve --help)" if given else "")
        )
    else:
        vllm = {"gpu_memory_utilization": float(w["vllm_gpu_memory_utilization"]), "sleep": bool(w["vllm_enable_sleep_mode"])}
        if w["vllm_max_model_length"] is not None:
            vllm["max_model_len"] = int(w["vllm_max_model_length"])
    out["rollout"].update(engine="vllm", vllm=vllm)
    cap = w["vllm_importance_sampling_cap"] if w["vllm_importance_sampling_cap"] is not None else w["vllm_importance_sampling_clip_max"]
    cap = float(cap)
    floor = w["vllm_importance_sampling_clip_min"]
    if not w["vllm_importance_sampling_correction"]:
        out["rollout"]["mismatch_correction"] = "none"
        return
    mode = w["vllm_importance_sampling_mode"]
    out["rollout"].update(mismatch_correction=mode, mismatch_cap=cap, mismatch_floor=None if floor is None else float(floor))
    notes.append(
        f"use_vllm: rollout.engine=vllm, {'served' if w['vllm_mode'] == 'server' else 'colocated'}; TRL's importance-sampling correction as "
        f"rollout.mismatch_correction={mode} with cap {cap} (grpokit's own default on vllm: token_truncate, cap 2)"
    )


SWITCH_LEAVES = frozenset({
    ("train", "output_dir"), ("train", "report_to"), ("train", "save_every"), ("train", "keep_checkpoints"),
    ("rollout", "group_size"), ("rollout", "prompts_per_step"), ("optim", "micro_batch_size"),
    ("optim", "mini_batches"), ("optim", "epochs"), ("model", "trust_remote_code"),
})  # fmt: skip
"""What train.defaults=trl leaves as it is: where the run writes and reports, and the batch's geometry (TRL's is
counted in completions per device, grpokit's in prompts per step: set rollout.prompts_per_step x group_size)."""


def with_trl_defaults(values: dict[str, Any], ours: dict[str, Any]) -> dict[str, Any]:
    """train.defaults=trl: the config's values (nested, as read) with TRL GRPOConfig's defaults (``from_trl({})``)
    laid under every setting left unset or at grpokit's default, except SWITCH_LEAVES; the algorithm's only when
    algo.preset is left at grpo (a preset chosen keeps its own), the epochs only when train.steps is left at its
    default (``ours``: grpokit's defaults, nested). The defaults that differ, and why grpokit's are what they are:
    docs/guides/from-trl.md."""
    import copy

    theirs, _ = from_trl({})
    out = copy.deepcopy(values)
    sections = {name: out.get(name) if isinstance(out.get(name), dict) else {} for name in theirs}
    preset_chosen = sections["algo"].get("preset", "grpo") != "grpo"
    steps_given = sections["train"].get("steps", ours["train"]["steps"]) != ours["train"]["steps"]
    for name, fields in theirs.items():
        if (name == "algo" and preset_chosen) or not isinstance(out.setdefault(name, {}), dict):
            continue  # (a section that is no mapping is refused by the config's own check)
        for key, value in fields.items():
            if (name, key) in SWITCH_LEAVES or (name, key) == ("train", "num_train_epochs") and steps_given:
                continue
            if key not in out[name] or out[name][key] == ours[name][key]:
                out[name][key] = value
    return out


def grpokit_yaml(values: dict[str, Any], notes: list[str], source: str, trl_class: str = "GRPOConfig") -> str:
    """The converted config as YAML that `grpokit train` (an SFTConfig's: `grpokit sft`) reads, the notes as comments
    on top."""
    import yaml

    module = "grpokit.config.trl_sft" if trl_class == "SFTConfig" else "grpokit.config.trl"
    head = [f"# converted from TRL's {trl_class} in {source} ({module})"] + [f"# - {n}" for n in notes]
    return "\n".join(head) + "\n" + yaml.safe_dump(_plain(values), sort_keys=False)


def _plain(value: Any) -> Any:
    """``value`` with the YAML reader's numbers that remember their text (grpokit.core.yaml_io) as plain int and
    float, which yaml.safe_dump writes (it refuses their subclasses)."""
    if isinstance(value, dict):
        return {k: _plain(x) for k, x in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(x) for x in value]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    return value


def inert_note(inert: list[str]) -> list[str]:
    if not inert:
        return []
    return [f"accepted, no effect on what a grpokit run trains ({len(inert)} TrainingArguments fields): {', '.join(inert)}"]
