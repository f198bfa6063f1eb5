"""The rollout engines moved to grpokit.rollout.engines (one module or folder per engine, docs/design/engines.md): this
path keeps the public names it had, for code written before."""

from grpokit.rollout.engines import moved
from grpokit.rollout.engines.base import Engine as Generator
from grpokit.rollout.engines.base import (
    Rollout,
    SamplingParams,
    completion_mask_from_ids,
    left_pad,
    rollout_metrics,
)
from grpokit.rollout.engines.fast.generator import (
    FastGenerator,
    filter_logits,
    penalise_repeats,
    process_logits,
    sample_tokens,
    seen_tokens,
)
from grpokit.rollout.engines.hf import HFGenerator

__all__ = [
    "FastGenerator",
    "Generator",
    "HFGenerator",
    "Rollout",
    "SamplingParams",
    "completion_mask_from_ids",
    "filter_logits",
    "left_pad",
    "penalise_repeats",
    "process_logits",
    "rollout_metrics",
    "sample_tokens",
    "seen_tokens",
]


def __getattr__(name: str):
    raise moved(__name__, name, "grpokit.rollout.engines (base, fast, hf)")
