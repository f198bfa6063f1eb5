"""What the trainer pushes to a vLLM engine, and how a push is checked: the weights by their Hugging Face names
(a LoRA adapter merged in), a fingerprint of a tensor, and the version that says the model changed."""

from __future__ import annotations

import torch
from torch import Tensor

FINGERPRINT_POINTS = 4096
"""Values compared per fingerprinted tensor: evenly spaced over the flattened tensor."""


def trainer_weights(model: torch.nn.Module) -> dict[str, Tensor]:
    """The weights to push, by their Hugging Face names (``model.layers.0.self_attn.q_proj.weight``...):
    the model's own, or with a PEFT LoRA adapter its base with the adapter merged in (W + delta, computed
    apart, the model untouched). A tied LM head is left out (vLLM ties it to the embedding itself)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    state = {}
    for name, tensor in base.state_dict().items():
        if ".lora_" in name or "lora_embedding" in name:
            continue
        state[name.replace(".base_layer.", ".")] = tensor.detach()
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


def version_of(model: torch.nn.Module) -> tuple[int, int]:
    """(id, sum of the parameters' in-place version counters): changes whenever an optimizer step, a
    load_state_dict or any in-place write touched a parameter, or the model is another object."""
    return id(model), sum(p._version for p in model.parameters())
