"""Checks of a model made before any weight is read: the device exists, config.json builds a causal LM that
transformers knows, ``model.attn_implementation`` is usable, the weights' shapes fit config.json and the LoRA
target modules exist. The model is built on the ``meta`` device for this (no memory, milliseconds); every
failure is a ConfigError naming the key, the folder or file, and what to do. transformers' own errors here
are long, several lines, and come after the weights have started to load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from grpokit.core.errors import ConfigError


def check_device(name: str) -> None:
    """``model.device`` names a device this machine has: CUDA (and the index) or MPS where it is asked for."""
    key = f"model.device={name!r}"
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(f"{key} but no CUDA GPU is visible; use model.device=cpu")
        index = int(name.split(":")[1]) if ":" in name else 0
        count = torch.cuda.device_count()
        if index >= count:
            raise ConfigError(
                f"{key} but {count} CUDA GPU(s) are visible (cuda:0 to cuda:{count - 1}); use one of them, "
                "or check CUDA_VISIBLE_DEVICES."
            )
    if name == "mps" and not (torch.backends.mps.is_built() and torch.backends.mps.is_available()):
        raise ConfigError(f"{key} but this machine (or this PyTorch build) has no MPS device; use model.device=cpu")


def first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0][:300]}" if text else type(e).__name__


def model_config_object(folder: str | Path, key: str, *, trust_remote_code: bool):
    """transformers' config for the folder holding config.json: a missing or unknown ``model_type``, a field
    of the wrong type, or a file that is not a mapping is a ConfigError naming config.json; so is a type with
    no causal-LM class (AutoModelForCausalLM could not build it)."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    config_file = Path(folder) / "config.json"
    try:
        config = AutoConfig.from_pretrained(str(folder), trust_remote_code=trust_remote_code)
    except Exception as e:  # noqa: BLE001 - transformers raises ValueError, KeyError, its own validation errors
        raise ConfigError(
            f"{key}: {config_file} does not describe a model transformers can build ({first_line(e)}); fix "
            "config.json (model_type and its fields) or upgrade transformers if the architecture is new."
        ) from None
    remote = trust_remote_code and "AutoModelForCausalLM" in (getattr(config, "auto_map", None) or {})
    if not remote and config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ConfigError(
            f"{key}: model_type {config.model_type!r} in {config_file} has no causal language model class in "
            "transformers (AutoModelForCausalLM); give a decoder (causal) LM such as Qwen2, Llama or GPT-2."
        )
    return config


def meta_model(config, model_cfg) -> Any:
    """The model of ``config`` on the meta device (shapes and module names, no memory), with the attention
    implementation asked for: an unknown one, or one whose package is missing, is a ConfigError."""
    from transformers import AutoModelForCausalLM

    kwargs = {"attn_implementation": model_cfg.attn_implementation} if model_cfg.attn_implementation else {}
    try:
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config, trust_remote_code=model_cfg.trust_remote_code, **kwargs)
    except (ValueError, ImportError) as e:
        if model_cfg.attn_implementation:
            raise ConfigError(
                f"model.attn_implementation={model_cfg.attn_implementation!r} cannot be used ({first_line(e)}); "
                "use sdpa or eager, or install what the message names."
            ) from None
        raise ConfigError(
            f"model.name_or_path={model_cfg.name_or_path!r}: the model cannot be built from its config.json "
            f"({first_line(e)})."
        ) from None


def check_weight_shapes(folder: Path, model, key: str) -> None:
    """Every tensor of the folder's safetensors files whose name the model has must have the model's shape
    (config.json and the weights of one model); names the model lacks are left to transformers' loader."""
    from grpokit.model.checkpoint import header_shapes

    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    prefix = getattr(model, "base_model_prefix", "") or ""
    for f in sorted(folder.glob("*.safetensors")):
        for name, shape in header_shapes(f).items():
            want = expected.get(name, expected.get(f"{prefix}.{name}") if prefix else None)
            if want is not None and tuple(shape) != want:
                raise ConfigError(
                    f"{key}: {f.name} holds {name} of shape {list(shape)} but config.json describes "
                    f"{list(want)}; the weights and config.json are of different models: use the config.json "
                    "saved with these weights."
                )


def check_lora_targets(model, lora_cfg, where: str = "") -> None:
    """With lora.enabled, every entry of lora.target_modules names a module of the model (PEFT's rule: the
    module's name, or its name's ending after a dot); 'all-linear' as PEFT takes it."""
    if not lora_cfg.enabled:
        return
    targets = list(lora_cfg.target_modules)
    if not targets:
        raise ConfigError(
            "lora.target_modules is empty: name the modules the adapter wraps (e.g. [q_proj, k_proj, v_proj, o_proj])."
        )
    if targets == ["all-linear"]:
        return
    names = [n for n, _ in model.named_modules() if n]
    missing = [t for t in targets if not any(n == t or n.endswith(f".{t}") for n in names)]
    if missing:
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
        raise ConfigError(
            f"lora.target_modules: {missing} match no module of {where or 'the model'}; its linear layers are "
            f"{linear} (or use [all-linear])."
        )
