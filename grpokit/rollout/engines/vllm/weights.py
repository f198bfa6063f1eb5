"""What the trainer pushes to a vLLM engine, and how a push is checked: the weights by their Hugging Face names
(a LoRA adapter merged in, or the base alone and the adapter apart), a fingerprint of a tensor, and the versions
that say the model (its base, its adapter) changed."""

from __future__ import annotations

import itertools
import threading
import weakref

import torch
from torch import Tensor

FINGERPRINT_POINTS = 4096
"""Values compared per fingerprinted tensor: evenly spaced over the flattened tensor."""


def trainer_weights(model: torch.nn.Module) -> dict[str, Tensor]:
    """The weights to push, by their Hugging Face names (``model.layers.0.self_attn.q_proj.weight``...):
    the model's own, or with a PEFT LoRA adapter its base with the adapter merged in (W + delta, computed
    apart, the model untouched). A tied LM head is left out (vLLM ties it to the embedding itself)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    state = _base_state(base)
    for module_name, module in base.named_modules():
        if hasattr(module, "get_delta_weight") and hasattr(module, "base_layer"):
            if getattr(module, "merged", False):
                continue  # already in its base weight
            key = f"{module_name}.weight"
            delta = sum(module.get_delta_weight(a) for a in module.active_adapters if a in module.lora_A)
            state[key] = state[key] + delta.to(state[key].dtype) if torch.is_tensor(delta) else state[key]
    if getattr(base.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    return state


def fingerprint(tensor: Tensor) -> Tensor:
    """(<= FINGERPRINT_POINTS,) evenly spaced values of ``tensor`` on the CPU, as stored (no cast)."""
    flat = tensor.detach().reshape(-1)
    n = flat.numel()
    if n <= FINGERPRINT_POINTS:
        return flat.cpu().clone()
    index = torch.linspace(0, n - 1, FINGERPRINT_POINTS, device=flat.device).long()
    return flat[index].cpu()


def _base_state(base: torch.nn.Module) -> dict[str, Tensor]:
    """The base model's own tensors by their Hugging Face names: PEFT's wrappers (``.base_layer.``) unwrapped, the
    adapter's tensors left out."""
    return {
        name.replace(".base_layer.", "."): t.detach()
        for name, t in base.state_dict().items()
        if ".lora_" not in name and "lora_embedding" not in name
    }


_serials: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_next_serial = itertools.count(1)
_serials_lock = threading.Lock()


def identity_of(model: torch.nn.Module) -> int:
    """A number for this model object, never given to another one in this process. Not ``id(model)``: CPython
    gives a freed object's id to the next one made, so a new model (a pipeline's next stage, a test's next
    model) could pass for the one whose weights the engine holds."""
    with _serials_lock:
        serial = _serials.get(model)
        if serial is None:
            serial = _serials[model] = next(_next_serial)
        return serial


def version_of(model: torch.nn.Module) -> tuple[int, int]:
    """(identity_of, sum of the parameters' in-place version counters): changes whenever an optimizer step, a
    load_state_dict or any in-place write touched a parameter, or the model is another object."""
    return identity_of(model), sum(p._version for p in model.parameters())


def weight_bytes(weights) -> int:
    """Bytes of the tensors of ``weights`` ([(name, tensor)]): what a push carries."""
    return sum(t.numel() * t.element_size() for _, t in weights)


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The modules whose LoRA adapter vLLM applies in the models grpokit trains (the attention and MLP projections)."""
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The max_lora_rank values vLLM accepts: an adapter of rank r needs the smallest one >= r."""


def lora_config(model: torch.nn.Module):
    """The PEFT LoRA config of ``model``'s active adapter, or None (not a PEFT model, or not LoRA)."""
    configs = getattr(model, "peft_config", None)
    if not configs or not hasattr(model, "get_base_model"):  # a PeftModel (grpokit's LoRA policies are)
        return None
    config = configs.get(getattr(model, "active_adapter", "default"))
    return config if str(getattr(config, "peft_type", "")).endswith("LORA") else None


def adapter_problem(model: torch.nn.Module) -> str | None:
    """Why ``model``'s LoRA adapter cannot be pushed alone to a vLLM engine (then the merged weights are), or None.
    vLLM's own check (PEFTHelper) refuses the same features at load time; this says so before the engine starts."""
    config = lora_config(model)
    if config is None:
        return "the policy has no PEFT LoRA adapter"
    if len(getattr(model, "active_adapters", [model.active_adapter])) != 1:
        return "the policy has several active adapters"
    targets = config.target_modules
    targets = [targets] if isinstance(targets, str) else sorted(targets)
    outside = [t for t in targets if t not in LORA_TARGETS]
    if outside:
        return f"the adapter targets {outside}, where vLLM's LoRA takes {list(LORA_TARGETS)}"
    for what, bad in (
        ("modules_to_save", config.modules_to_save),
        ("use_dora", getattr(config, "use_dora", False)),
        ("lora_bias", getattr(config, "lora_bias", False)),
        ("bias", config.bias != "none" and config.bias),
        ("layers_to_transform", getattr(config, "layers_to_transform", None)),
        ("init_lora_weights", isinstance(config.init_lora_weights, str) and config.init_lora_weights),
    ):
        if bad:
            return f"the adapter's {what}={bad!r} is not something vLLM's LoRA applies"
    rank = max([config.r, *(config.rank_pattern or {}).values()])
    if rank > LORA_RANKS[-1]:
        return f"the adapter's rank {rank} is above vLLM's largest max_lora_rank {LORA_RANKS[-1]}"
    return None


def lora_rank(model: torch.nn.Module) -> int:
    """The max_lora_rank a vLLM engine needs for ``model``'s adapter: the smallest LORA_RANKS entry >= its rank."""
    config = lora_config(model)
    rank = max([config.r, *(config.rank_pattern or {}).values()])
    return next(r for r in LORA_RANKS if r >= rank)


def adapter_weights(model: torch.nn.Module) -> tuple[list[tuple[str, Tensor]], dict]:
    """The active adapter's tensors by PEFT's saved names (``base_model.model.model.layers.0.self_attn.q_proj.
    lora_A.weight``...), detached, and its adapter_config.json as a dict: what vLLM loads as a LoRA adapter."""
    from peft import get_peft_model_state_dict

    config = lora_config(model)
    state = get_peft_model_state_dict(model, adapter_name=model.active_adapter)
    as_json = {
        k: sorted(v) if isinstance(v, set) else v for k, v in config.to_dict().items() if _plain(v)
    }  # fmt: skip
    return [(name, t.detach()) for name, t in state.items()], as_json


def _plain(value) -> bool:
    """JSON can hold it (a set as a list): what adapter_config.json keeps of PEFT's config."""
    if isinstance(value, set | list | tuple):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return value is None or isinstance(value, str | int | float | bool)


def base_weights(model: torch.nn.Module) -> dict[str, Tensor]:
    """The weights of ``model``'s base by their Hugging Face names, the adapter left out (not merged): what an engine
    that applies the adapter itself holds."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    state = _base_state(base)
    if getattr(base.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    return state


def base_version(model: torch.nn.Module) -> tuple[int, int]:
    """version_of over the base's parameters alone (the adapter's left out): changes when a base weight does."""
    return identity_of(model), sum(p._version for n, p in model.named_parameters() if ".lora_" not in n)


def adapter_version(model: torch.nn.Module) -> int:
    """The in-place version counters of the adapter's parameters: changes with every optimizer step on them."""
    return sum(p._version for n, p in model.named_parameters() if ".lora_" in n)
