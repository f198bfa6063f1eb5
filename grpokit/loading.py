"""Load the policy (and, when beta > 0, a frozen reference) the way Hugging Face users expect."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch

from grpokit.config import ConfigError, LoraConfig, ModelConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"model.device={name!r} but no CUDA GPU is visible; use model.device=cpu")
    return torch.device(name)


def pick_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[name]


def load_tokenizer(name_or_path: str, *, trust_remote_code: bool = False):
    """AutoTokenizer, except for local directories whose tokenizer_config names
    PreTrainedTokenizerFast (transformers 5 may otherwise swap in the architecture's class)."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    config_path = Path(name_or_path) / "tokenizer_config.json"
    if config_path.is_file():
        declared = json.loads(config_path.read_text()).get("tokenizer_class")
        if declared == "PreTrainedTokenizerFast":
            tok = PreTrainedTokenizerFast.from_pretrained(name_or_path)
            return _ensure_pad(tok)
    tok = AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
    return _ensure_pad(tok)


def save_local_tokenizer(tokenizer, directory: str | Path) -> None:
    """save_pretrained, then pin tokenizer_class to PreTrainedTokenizerFast so that
    load_tokenizer (and AutoTokenizer on non-Qwen2 architectures) rebuilds this exact tokenizer."""
    tokenizer.save_pretrained(directory)
    path = Path(directory) / "tokenizer_config.json"
    data = json.loads(path.read_text())
    data["tokenizer_class"] = "PreTrainedTokenizerFast"
    path.write_text(json.dumps(data, indent=2))


def _ensure_pad(tok):
    if tok.pad_token_id is None:
        if tok.eos_token_id is None:
            raise ConfigError(
                "the tokenizer defines neither a pad nor an eos token; set one in tokenizer_config.json"
            )
        tok.pad_token = tok.eos_token
    return tok


def load_policy(model_cfg: ModelConfig, lora_cfg: LoraConfig):
    """-> (model, tokenizer, device). The model is on ``device``; LoRA-wrapped when asked."""
    from transformers import AutoModelForCausalLM

    path = model_cfg.name_or_path
    if not path:
        raise ConfigError("model.name_or_path is empty: give a Hugging Face model directory or hub id")
    local = Path(path)
    if (path.startswith(("/", ".", "~")) or local.exists()) and not (local / "config.json").is_file():
        raise ConfigError(
            f"model.name_or_path={path!r}: no config.json there; is it a Hugging Face model directory?"
        )
    device = pick_device(model_cfg.device)
    dtype = pick_dtype(model_cfg.dtype, device)
    kwargs = {"dtype": dtype, "trust_remote_code": model_cfg.trust_remote_code}
    if model_cfg.attn_implementation:
        kwargs["attn_implementation"] = model_cfg.attn_implementation
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs).to(device)
    tokenizer = load_tokenizer(path, trust_remote_code=model_cfg.trust_remote_code)
    model = prepare_policy(model, model_cfg, lora_cfg)
    return model, tokenizer, device


def prepare_policy(model, model_cfg: ModelConfig, lora_cfg: LoraConfig):
    """Gradient checkpointing, no KV cache in training forwards, LoRA when enabled."""
    if model_cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if lora_cfg.enabled:
            model.enable_input_require_grads()
    if lora_cfg.enabled:
        try:
            from peft import LoraConfig as PeftLoraConfig
            from peft import get_peft_model
        except ImportError as e:
            raise ConfigError("lora.enabled=true needs PEFT: pip install 'grpokit[peft]'") from e
        peft_cfg = PeftLoraConfig(
            r=lora_cfg.r,
            lora_alpha=lora_cfg.alpha,
            lora_dropout=lora_cfg.dropout,
            target_modules=list(lora_cfg.target_modules),
            task_type="CAUSAL_LM",
        )
        model = get_peft_model(model, peft_cfg)
    return model


def frozen_reference(model, lora_enabled: bool):
    """The reference policy for the KL term. With LoRA it is the base model with the adapter
    disabled (returns None: no second copy); otherwise a frozen copy of the initial weights."""
    if lora_enabled:
        return None
    ref = copy.deepcopy(model)
    ref.requires_grad_(False)
    ref.eval()
    return ref
