"""Building a Config from nested mappings and checking it: types, unknown keys (with the nearest valid
one), numeric ranges (RANGES, plus the algo.* ranges read from grpokit.algos.AlgoSettings) and choices.
``grpokit.config.schema`` holds the config's sections; this module holds the rules their values must follow,
every section's (the KV caches, the trackers of train.report_to, critic.* needing a critic-based
estimator). It imports nothing of grpokit but errors and, inside functions, grpokit.algos (lazily: it
imports torch, which a config check does not otherwise need)."""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import os
import re
import types
import typing
from typing import TYPE_CHECKING, Any

from grpokit.core.errors import ConfigError
from grpokit.core.yaml_io import plain

if TYPE_CHECKING:
    from grpokit.config.schema import AlgoConfig, Config


MULTI_TURN = ("max_turns", "max_episode_tokens", "tool_timeout_s", "tool_workers", "max_tool_result_chars", "tool_parser")
"""rollout.* settings of multi-turn rollouts (grpokit.rollout.episodes): taken only with rollout.tools or rollout.environment."""

KV_CACHES = ("auto", "static", "dynamic")
"""rollout.kv_cache: the fast engine's KV cache (grpokit.rollout.decode)."""

REPORT_TO: dict[str, tuple[str, str]] = {
    "tensorboard": ("tensorboard", "pip install tensorboard"),
    "wandb": ("wandb", "pip install 'grpokit[wandb]'"),
    "mlflow": ("mlflow", "pip install 'grpokit[mlflow]'"),
    "none": ("", ""),
}
"""train.report_to: tracker name -> (the package it needs, how to install it) (grpokit.run.log logs to them)."""


def check_report_to(report_to: str | list[str] | tuple[str, ...], key: str = "train.report_to") -> list[str]:
    """The trackers named by ``report_to`` ("wandb", ["tensorboard", "mlflow"], "none"), deduplicated, in
    order. Raises ValueError naming ``key`` for an unknown name or a tracker whose package is missing,
    with the pip command that installs it. Imports nothing (the packages take seconds to import)."""
    names = [report_to] if isinstance(report_to, str) else list(report_to)
    chosen: list[str] = []
    for name in names:
        if name not in REPORT_TO:
            raise ValueError(
                f"{key}={name!r} is not one of {list(REPORT_TO)} (e.g. {key}=[tensorboard,wandb])."
            )
        module, pip = REPORT_TO[name]
        if module and importlib.util.find_spec(module) is None:
            raise ValueError(f"{key}={name!r} needs the {module} package, which is not installed: {pip}")
        if name != "none" and name not in chosen:
            chosen.append(name)
    return chosen


def check_critic(cfg: Config) -> None:
    """critic.* settings with an algorithm that trains no critic would be silently ignored: refuse them."""
    from grpokit.algos import PRESETS  # lazy: grpokit.algos imports torch

    preset = PRESETS.get(cfg.algo.preset)
    try:
        algo = preset.override(advantage=cfg.algo.advantage) if preset is not None else None
    except ValueError:
        return  # a bad estimator name is reported by its own check
    if algo is None or algo.uses_critic:
        return
    changed = [
        f"critic.{f.name}={getattr(cfg.critic, f.name)!r}"
        for f in dataclasses.fields(cfg.critic)
        if getattr(cfg.critic, f.name) != f.default
    ]
    if changed:
        raise ConfigError(
            f"{', '.join(changed)}: algo.preset={cfg.algo.preset} (advantage {algo.advantage.estimator}) "
            "trains no critic, so these settings would be ignored. Use algo.preset=ppo (or algo.advantage=gae) "
            "to train one, or remove the critic.* settings."
        )


def check_settings_in_use(cfg: Any) -> None:
    """Settings changed from their default in a part that is off would be silently ignored: refused, as
    critic.* without a critic is: lora.* without lora.enabled, the multi-turn rollout.* settings without
    rollout.tools or rollout.environment, the fast engine's cache settings with rollout.engine=hf. Checked
    when a trainer starts (a Python API user may set rollout.tools in code after load_config)."""
    lora = [f.name for f in dataclasses.fields(cfg.lora) if f.name != "enabled"]
    checks = [(cfg.lora, "lora", lora, cfg.lora.enabled, "lora.enabled=true")]
    r = getattr(cfg, "rollout", None)
    if r is not None:
        checks += [
            (r, "rollout", list(MULTI_TURN), bool(r.tools or r.environment), "rollout.tools or rollout.environment"),
            (r, "rollout", ["kv_cache", "cuda_graphs"], r.engine == "fast", "rollout.engine=fast"),
        ]
    for section, prefix, names, on, how in checks:
        if on:
            continue
        default = type(section)()
        changed = [n for n in names if getattr(section, n) != getattr(default, n)]
        if changed:
            shown = ", ".join(f"{prefix}.{n}={getattr(section, n)!r}" for n in changed)
            raise ConfigError(
                f"{shown}: taken only with {how}, so ignored as it stands; set that, or remove the setting."
            )


def check_algo_knobs(cfg: Config) -> None:
    """algo.* knobs set explicitly that could not take effect (grpokit.algos.AlgoSettings.ineffective):
    refused now, not silently ignored, nor refused at the first step."""
    from grpokit.algos import KNOBS, PRESETS  # lazy: grpokit.algos imports torch

    given = {key: getattr(cfg.algo, key) for key in KNOBS if getattr(cfg.algo, key) is not None}
    try:
        settings = PRESETS[cfg.algo.preset].override(**given)
    except (KeyError, ValueError):
        return  # a bad preset or value is reported by its own check
    problems = settings.ineffective(set(given))
    if problems:
        raise ConfigError(
            f"{problems[0]} (algo.preset={cfg.algo.preset}). Remove the setting or change the algorithm."
        )


def _nearest(name: str, options: list[str]) -> str:
    match = difflib.get_close_matches(name, options, n=1, cutoff=0.5)
    return f" Did you mean '{match[0]}'?" if match else f" Valid keys: {', '.join(options)}."


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against the annotation ``tp``; ints are accepted where floats are."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"{key}: bad value {value!r}")
    if tp is Any:
        return plain(value)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping of {tp.__name__} fields, got {value!r}")
        return _build(tp, value, key)
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        (item_tp,) = typing.get_args(tp)
        return [_coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return plain(dict(value))
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return int(value)
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return str(value)
        if isinstance(value, os.PathLike):  # the Python API: a Path where a path is asked for
            return os.fspath(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return getattr(value, "text", str(value))  # a path or name as written: 007, 1e3 (grpokit.core.yaml_io)
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    raise ConfigError(f"{key}: unsupported type {tp}")


def _build(cls: type, values: dict[str, Any], prefix: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in values.items():
        full = f"{prefix}.{key}" if prefix else str(key)
        if key not in names:
            raise ConfigError(f"unknown config key '{full}'.{_nearest(str(key), names)}")
        kwargs[key] = _coerce(value, hints[key], full)
    return cls(**kwargs)


# Allowed ranges of numeric settings, checked before anything loads. Interval notation: "[" includes
# the bound, "(" excludes it. An unset optional knob (None) is always allowed. The algo.* ranges are
# read from grpokit.algos.AlgoSettings (see _algo_ranges).
#   key                            allowed      example  meaning of the edge value
RANGES: dict[str, tuple[str, Any, str]] = {
    "lora.r":                      ("[1, inf)", 16, ""),
    "lora.alpha":                  ("(0, inf)", 32, ""),
    "lora.dropout":                ("[0, 1)", 0.05, ""),
    "data.max_prompt_tokens":      ("[1, inf)", 512, ""),
    "data.eval_limit":             ("[1, inf)", 200, ""),
    "rollout.prompts_per_step":    ("[1, inf)", 8, ""),
    "rollout.max_new_tokens":      ("[1, inf)", 256, ""),
    "rollout.temperature":         ("(0, inf)", 1.0, "log-probs are taken at it"),
    "rollout.top_p":               ("(0, 1]", 1.0, "1 = off"),
    "rollout.top_k":               ("[0, inf)", 50, "0 = off"),
    "rollout.max_turns":           ("[1, inf)", 4, ""),
    "rollout.max_episode_tokens":  ("[0, inf)", 1024, "0 = max_turns x max_new_tokens"),
    "rollout.tool_timeout_s":      ("(0, inf)", 10, ""),
    "rollout.tool_workers":        ("[1, inf)", 2, ""),
    "rollout.max_tool_result_chars": ("[1, inf)", 2000, ""),
    "optim.lr":                    ("(0, 1]", "1e-6", ""),
    "optim.weight_decay":          ("[0, inf)", 0.01, ""),
    "optim.adam_beta1":            ("[0, 1)", 0.9, ""),
    "optim.adam_beta2":            ("[0, 1)", 0.99, ""),
    "optim.warmup_steps":          ("[0, inf)", 10, ""),
    "optim.warmup_ratio":          ("[0, 1]", 0.1, "0 = use optim.warmup_steps"),
    "optim.adam_epsilon":          ("(0, 1)", "1e-8", ""),
    "train.num_train_epochs":      ("(0, inf)", 3, "null = train.steps"),
    "optim.max_grad_norm":         ("[0, inf)", 1.0, "0 = no clipping"),
    "optim.epochs":                ("[1, inf)", 1, ""),
    "optim.mini_batches":          ("[1, inf)", 1, ""),
    "optim.logprob_chunk_size":    ("[1, inf)", 1024, ""),
    "critic.lr":                   ("(0, 1]", "1e-5", ""),
    "critic.value_coef":           ("(0, inf)", 0.1, ""),
    "critic.cliprange_value":      ("(0, inf)", 0.2, "null = no value clipping"),
    "critic.warmup_steps":         ("[0, inf)", 5, "0 = the policy trains from the first step"),
    "eval.every":                  ("[0, inf)", 50, "0 = only before and after training"),
    "eval.num_samples":            ("[1, inf)", 4, ""),
    "eval.temperature":            ("[0, inf)", 1.0, ""),
    "eval.max_new_tokens":         ("[1, inf)", 256, ""),
    "train.steps":                 ("[1, inf)", 200, ""),
    "train.save_every":            ("[0, inf)", 50, "0 = only at the end"),
    "train.keep_checkpoints":      ("[0, inf)", 2, "0 = keep all"),
    "train.samples_every":         ("[0, inf)", 10, "0 = never"),
    "train.reward_timeout_s":      ("(0, inf)", 120, ""),
    "train.max_reward_failure_frac": ("[0, 1]", 0.05, "0 = any failure stops the run"),
    "train.stop_after_flat_steps": ("[0, inf)", 5, "0 = never stop"),
    "rewards[].weight":            ("(-inf, inf)", 1.0, ""),
}  # fmt: skip


def _in_interval(value: float, interval: str) -> bool:
    """``_in_interval(0, "[1, inf)")`` -> False. NaN is in no interval (the algo settings' own rule)."""
    from grpokit.algos.settings import in_interval

    return in_interval(value, interval)


def _describe_interval(interval: str) -> str:
    """Words for an interval: "[1, inf)" -> ">= 1"; "(0, 1]" -> "> 0 and <= 1"."""
    lo_text, hi_text = (t.strip() for t in interval[1:-1].split(","))
    parts = []
    if lo_text != "-inf":
        parts.append(f"{'>=' if interval[0] == '[' else '>'} {lo_text}")
    if hi_text != "inf":
        parts.append(f"{'<=' if interval[-1] == ']' else '<'} {hi_text}")
    return " and ".join(parts) or "a finite number"


def _check_ranges(cfg: Config, ranges: dict[str, tuple[str, Any, str]] | None = None) -> None:
    """Every numeric setting in ``ranges`` (default RANGES and the algo.* ones) within its interval; the
    message names key, value, range, example. grpokit.config.sft passes the SFT tree's."""
    for key, (interval, example, meaning) in (ranges or {**RANGES, **_algo_ranges()}).items():
        if key.startswith("rewards[]."):
            field_name = key.split(".", 1)[1]
            values = {f"rewards[{i}].{field_name}": getattr(r, field_name) for i, r in enumerate(cfg.rewards)}
        else:
            section, name = key.split(".")
            values = {key: getattr(getattr(cfg, section), name)}
        for shown, value in values.items():
            if value is None or _in_interval(value, interval):
                continue
            note = f"; {meaning}" if meaning else ""
            raise ConfigError(
                f"{shown}={value!r} is out of range: it must be {_describe_interval(interval)}{note} "
                f"(e.g. {shown}={example})."
            )


def _algo_ranges() -> dict[str, tuple[str, Any, str]]:
    """RANGES entries of the algo.* knobs, from the settings object (one place for the schema)."""
    from grpokit.algos import KNOBS

    return {f"algo.{k.key}": (k.interval, k.example, k.meaning) for k in KNOBS.values() if k.interval}


def _algo_choices(algo: AlgoConfig) -> dict[str, tuple[Any, list[Any]]]:
    """Choice checks of the algo.* knobs, from the settings object; a 'package.module:function' name
    (your own estimator) is accepted here and imported when the run starts."""
    from grpokit.algos import KNOBS

    out = {}
    for k in KNOBS.values():
        if k.choices is not None:
            value = getattr(algo, k.key)
            own = [value] if k.user_defined and isinstance(value, str) and ":" in value else []
            out[f"algo.{k.key}"] = (value, [None, *k.choices(), *own])
    return out


def check_shared_sections(cfg: Any, ranges: dict[str, tuple[str, Any, str]] | None, choices: dict) -> None:
    """The checks of the sections every trainer's config shares (model, data, optim, train): ranges,
    (None: RANGES and the algo.* ones), choices (the shared ones plus ``choices``, key -> (value, valid
    values)), micro-batch size, device,
    seed and trackers. The RL config (check_config) and the SFT config (grpokit.config.sft) both call it."""
    _check_ranges(cfg, ranges)
    choices = {
        "data.template": (cfg.data.template, ["auto", "chat", "plain", "r1_zero"]),
        "optim.schedule": (cfg.optim.schedule, ["constant", "cosine", "linear"]),
        "train.distributed": (cfg.train.distributed, ["auto", "fsdp", "ddp"]),
        "optim.precision": (
            cfg.optim.precision,
            ["auto", "fp32", "bf16_mixed", "fp16_mixed", "bf16_kahan", "bf16_pure"],
        ),
        **choices,
    }
    for key, (value, valid) in choices.items():
        if value not in valid:
            shown = [v for v in valid if v is not None]
            hint = difflib.get_close_matches(str(value), shown, n=1, cutoff=0.3)
            near = f" Did you mean '{hint[0]}'?" if hint else ""
            raise ConfigError(f"{key}={value!r} is not one of {shown}.{near}")
    if cfg.optim.micro_batch_size != "auto" and (
        not isinstance(cfg.optim.micro_batch_size, int) or cfg.optim.micro_batch_size < 1
    ):
        raise ConfigError(
            f"optim.micro_batch_size={cfg.optim.micro_batch_size} must be at least 1 "
            "or auto (e.g. optim.micro_batch_size=8, or auto: as many as fit)."
        )
    check_model_section(cfg.model)
    check_seed(cfg.train.seed, "train.seed")
    check_output_path(cfg.train.output_dir, "train.output_dir")
    try:
        check_report_to(cfg.train.report_to)
    except ValueError as e:
        raise ConfigError(str(e)) from None


DTYPES = ("auto", "float32", "bfloat16", "float16")
"""model.dtype: the dtypes a model loads in (grpokit.model.loading)."""


def check_model_section(model: Any) -> None:
    """model.dtype one of DTYPES, model.device the name of a device (whether this machine has it is checked
    when the model loads, grpokit.model.checks.check_device). Every command's model section (train, sft, sample)."""
    if model.dtype not in DTYPES:
        hint = difflib.get_close_matches(str(model.dtype), DTYPES, n=1, cutoff=0.3)
        near = f" Did you mean '{hint[0]}'?" if hint else ""
        raise ConfigError(f"model.dtype={model.dtype!r} is not one of {list(DTYPES)}.{near}")
    if not isinstance(model.device, str) or not re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", model.device):
        raise ConfigError(
            f"model.device={model.device!r} is not a device: use auto, cpu, cuda, cuda:N or mps "
            "(e.g. model.device=cuda:0)."
        )


def check_seed(seed: int, key: str) -> None:
    """A seed torch and numpy take: 0 <= seed < 2**63."""
    if not 0 <= seed < 2**63:
        raise ConfigError(f"{key}={seed} is out of range: it must be >= 0 and < 2**63 (e.g. {key}=42).")


def check_output_path(path: str, key: str) -> None:
    """An output folder is named: an empty value would write the run into the current folder."""
    if not str(path).strip():
        raise ConfigError(
            f"{key} is empty, which would write into the current folder; name the folder (e.g. {key}=runs/my_run)."
        )


def check_config(cfg: Config) -> None:
    """Ranges, choices and the cross-setting rules; the first problem raises ConfigError."""
    check_shared_sections(
        cfg,
        None,  # RANGES and the algo.* ranges
        {
            "rollout.engine": (cfg.rollout.engine, ["fast", "hf"]),
            "rollout.kv_cache": (cfg.rollout.kv_cache, list(KV_CACHES)),
            **_algo_choices(cfg.algo),
        },
    )
    from grpokit.algos import PRESETS

    if cfg.algo.preset not in PRESETS:
        raise ConfigError(
            f"algo.preset={cfg.algo.preset!r} is not a known preset.{_nearest(cfg.algo.preset, list(PRESETS))}"
        )
    check_critic(cfg)  # critic.* settings need an algorithm that trains a critic
    check_algo_knobs(cfg)  # algo.* knobs the chosen estimator, loss or batch settings would ignore
    if cfg.rollout.group_size < 2:
        raise ConfigError(
            f"rollout.group_size={cfg.rollout.group_size}: GRPO needs at least 2 completions per prompt "
            "to compare them (a group of 1 has no relative advantage). Use 2 or more, e.g. 8."
        )
    batch = cfg.rollout.prompts_per_step * cfg.rollout.group_size
    if batch % cfg.optim.mini_batches:
        raise ConfigError(
            f"optim.mini_batches={cfg.optim.mini_batches} must divide the rollout batch "
            f"(rollout.prompts_per_step * rollout.group_size = {batch})."
        )
    if not cfg.rewards:
        raise ConfigError("rewards: at least one reward function is needed.")


def build_config(cls: type, values: dict[str, Any]) -> Any:
    """``cls`` (a config dataclass) from a nested mapping, every value type-checked."""
    return _build(cls, values)
