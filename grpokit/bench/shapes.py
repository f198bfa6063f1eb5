"""The bench's fixed shapes: random-model dimensions, step shapes, H100 datasheet numbers, and where
built models are kept."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MODEL_SHAPES: dict[str, dict[str, Any]] = {
    "tiny": dict(
        vocab_size=1024,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    ),
    "30m": dict(  # 32M parameters, small vocabulary: weights, gradients, AdamW states and the reference
        # are ~90% of a CPU step's memory on the tiny shape (tests/unit/bench/test_memory.py); quick to build
        vocab_size=4096,
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=10,
        num_attention_heads=8,
        num_key_value_heads=2,
    ),
    "60m": dict(  # 63M parameters: weights and optimizer states dominate a CPU step's memory, quickly
        vocab_size=32768,
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=6,
        num_attention_heads=12,
        num_key_value_heads=4,
    ),
    "0.5b": dict(  # Qwen2.5-0.5B's dimensions (494M parameters, tied embeddings)
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
    ),
    "1.5b": dict(  # Qwen2.5-1.5B's dimensions
        vocab_size=151936,
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
    ),
}
"""Qwen2-architecture dimensions of the random models (the same as shared/bench/make_model.py)."""

SPECIAL_TOKENS = ["<pad>", "<eos>", "<bos>"]  # ids 0, 1, 2; word "w{k}" has id k + 3
MAX_WORD = 150_000
"""Prompt words are w5 .. w{min(MAX_WORD, n_words) - 1}, as in the TRL anchor (its --vocab-hi)."""
MODEL_FORMAT = 1  # bump when the builder changes, so cached models are rebuilt


@dataclass(frozen=True)
class BenchShape:
    prompts: int
    """Prompts per step (P)."""
    group_size: int
    """Completions per prompt (G); a step generates P * G completions."""
    prompt_len: int
    """Tokens per prompt, exactly."""
    completion_len: int
    """Tokens per completion, exactly (EOS is never sampled)."""
    micro_batch: int
    """Completions per forward/backward (TRL's per_device_train_batch_size)."""

    @property
    def completions(self) -> int:
        return self.prompts * self.group_size


BENCH_SHAPES: dict[str, BenchShape] = {
    "standard": BenchShape(prompts=32, group_size=8, prompt_len=128, completion_len=256, micro_batch=32),
    "long": BenchShape(prompts=16, group_size=8, prompt_len=128, completion_len=1024, micro_batch=16),
    "tiny": BenchShape(prompts=2, group_size=4, prompt_len=8, completion_len=8, micro_batch=8),
    # A memory shape: 32 rows x 4224 tokens per micro-batch. Full-vocabulary logits for one micro-batch
    # would be 32 * 4224 * 151936 bf16 values (41 GB, twice that with their gradient); grpokit never
    # builds them (chunked log-probs), TRL does.
    "xlong": BenchShape(prompts=16, group_size=8, prompt_len=128, completion_len=4096, micro_batch=32),
}

H100_SXM_MEM_BW = 3.35e12
"""H100 SXM5 80GB HBM3 bandwidth, bytes/s (NVIDIA datasheet)."""
H100_SXM_BF16_FLOPS = 989e12
"""H100 SXM5 dense bfloat16 tensor-core peak, FLOP/s (NVIDIA datasheet; 1979e12 is with sparsity)."""

TIME_KEYS = ("generation", "scoring", "reference", "update")


def cache_root() -> Path:
    """Where built random models are kept: ``$GRPOKIT_CACHE/bench`` or ``~/.cache/grpokit/bench``."""
    return Path(os.environ.get("GRPOKIT_CACHE", Path.home() / ".cache" / "grpokit")) / "bench"


class BenchError(RuntimeError):
    """The bench cannot run as asked; the message says why and what to do."""
