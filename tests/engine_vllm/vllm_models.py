"""Tiny models vLLM's CPU attention accepts (head_dim 32) and the engine settings of the tests."""

from __future__ import annotations

from tiny_model import make_tiny_model

from grpokit.config.schema import VLLMConfig


def vllm_model(seed: int = 0, arch: str = "qwen2"):
    """A tiny ``arch`` model (hidden 64, 2 heads of 32, 1 KV head, 512 positions) and its tokenizer."""
    return make_tiny_model(
        arch, seed=seed, hidden_size=64, num_heads=2, num_kv_heads=1, max_position_embeddings=512
    )


def settings(**changes) -> VLLMConfig:
    """rollout.vllm as the tests run it (defaults, 1 GiB of KV cache)."""
    return VLLMConfig(**changes)
