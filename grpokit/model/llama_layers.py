"""The Llama family's decoder layer, run from the model's own modules: what grpokit computes itself rather than
through the model's forward (the static-cache decode engine, grpokit.rollout.engines.fast.decode; the shared
prompt under gradient checkpointing, grpokit.model.shared_prefix).

Supported: Llama, Qwen2, Qwen3 (q/k norms) and Mistral without a sliding window, with full attention in every
layer and a RoPE that does not depend on the sequence length. Each layer, pre-norm:

    h = h + o_proj(attention(q_norm(q_proj(x)), k_norm(k_proj(x)), v_proj(x)))   x = input_layernorm(h), RoPE on q, k
    h = h + mlp(post_attention_layernorm(h))

The model's modules are called (LoRA wrappers included); the attention is ``F.scaled_dot_product_attention``.
"""

from __future__ import annotations

import torch
from torch import Tensor

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral")


def llama_family_support(decoder: torch.nn.Module) -> str | None:
    """None when ``decoder`` (a transformers base decoder: ``model.model``) is one this module runs, else why not."""
    config = getattr(decoder, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        return f"model_type {model_type!r} is not one of {SUPPORTED_MODEL_TYPES}"
    for name in ("embed_tokens", "layers", "norm", "rotary_emb"):
        if not hasattr(decoder, name):
            return f"the model has no model.{name}"
    layer = decoder.layers[0] if len(decoder.layers) else None
    for name in ("self_attn", "input_layernorm", "post_attention_layernorm", "mlp"):
        if not hasattr(layer, name):
            return f"the decoder layers have no {name}"
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        if not hasattr(layer.self_attn, name):
            return f"the attention has no {name}"
    layer_types = getattr(config, "layer_types", None) or []
    if any(t != "full_attention" for t in layer_types):
        return "sliding-window layers are not supported"
    if model_type == "mistral" and getattr(config, "sliding_window", None):
        return "sliding-window attention is not supported"
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    rope_type = str(rope.get("rope_type", rope.get("type", "")))
    if "dynamic" in rope_type or "longrope" in rope_type:
        return f"{rope_type} RoPE scaling depends on the sequence length and is not supported"
    return None


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """RoPE (rotate-half layout, as the Llama family): x (B, heads, T, d), cos/sin (B, T, d)."""
    cos, sin = cos[:, None], sin[:, None]  # (B, 1, T, d)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def head_shape(decoder: torch.nn.Module) -> tuple[int, int, int]:
    """(query heads, key/value heads, head dim) of ``decoder``'s attention."""
    cfg = decoder.config
    heads = cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    return heads, kv_heads, getattr(cfg, "head_dim", None) or cfg.hidden_size // heads


def project_qkv(
    attn, x: Tensor, cos: Tensor, sin: Tensor, shape: tuple[int, int, int], rope=None
) -> tuple[Tensor, ...]:
    """q (B, heads, T, d), k and v (B, kv_heads, T, d) of ``x`` (B, T, H) under attention module ``attn``: the
    projections, Qwen3's per-head q/k norms, RoPE on q and k (cos/sin (B, T, d)); ``rope(q, k, cos, sin)`` in
    place of :func:`rotate` on each (grpokit.model.fused_layers.rope_qk, fused)."""
    h, kvh, d = shape
    B, T, _ = x.shape
    q = attn.q_proj(x).view(B, T, h, d)
    k = attn.k_proj(x).view(B, T, kvh, d)
    v = attn.v_proj(x).view(B, T, kvh, d).transpose(1, 2)  # (B, kvh, T, d)
    if hasattr(attn, "q_norm"):  # Qwen3: RMSNorm over each head before RoPE
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k = q.transpose(1, 2), k.transpose(1, 2)  # (B, h, T, d), (B, kvh, T, d)
    if rope is not None:
        return (*rope(q, k, cos, sin), v)
    return rotate(q, cos, sin), rotate(k, cos, sin), v
