"""The rollout engines (``rollout.engine``), one module or folder each behind :class:`base.Engine`:

    fast   grpokit.rollout.engines.fast   own sampling loop over a static or dynamic KV cache (the default)
    hf     grpokit.rollout.engines.hf     transformers' generate, the reference
    vllm   grpokit.rollout.engines.vllm   a vLLM engine in this process or behind a server

    generator = make_generator(cfg.rollout, max_model_len=2048, seed=cfg.train.seed, say=say)
    generator = make_generator("hf")                      # a name alone: the engine's default settings
    engine_class("vllm").needs_fresh_process              # a capability, read without starting (or importing) vLLM

Every engine takes one :class:`SamplingParams` and returns one :class:`Rollout`; what it can do is said by its
class's capabilities (``exact_logprobs``, ``holds_weights``, ``needs_fresh_process``, ``takes_lora_adapters``),
which the rest of the library reads instead of its name. Adding one: docs/design/engines.md.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from grpokit.config.schema import ENGINES, RolloutConfig
from grpokit.rollout.engines.base import Engine, Rollout, SamplingParams, rollout_metrics

ENGINE_CLASSES = {
    "fast": "grpokit.rollout.engines.fast:FastGenerator",
    "hf": "grpokit.rollout.engines.hf:HFGenerator",
    "vllm": "grpokit.rollout.engines.vllm.generator:VLLMGenerator",
}
"""rollout.engine's names and their classes (module:Class, imported when first asked for; equal to
grpokit.config.schema.ENGINES, which the config layer checks names against)."""

__all__ = [
    "ENGINE_CLASSES",
    "Engine",
    "Rollout",
    "SamplingParams",
    "engine_class",
    "make_generator",
    "rollout_metrics",
]


def engine_class(name: str) -> type[Engine]:
    """The class of the engine ``name`` (its capabilities are class attributes). Importing a class imports
    no engine library (vLLM is imported when its engine starts)."""
    if name not in ENGINE_CLASSES:
        raise ValueError(f"unknown rollout engine {name!r}; choose one of {ENGINES}")
    module, cls = ENGINE_CLASSES[name].split(":")
    return getattr(importlib.import_module(module), cls)


def moved(old: str, name: str, new: str) -> AttributeError:
    """The error of ``old.name`` where the module ``old`` kept only its public names when its code moved to
    ``new`` (grpokit.rollout.generation and the other paths from before the engines' folder)."""
    return AttributeError(
        f"module {old!r} has no attribute {name!r}: its code moved to {new} (docs/design/engines.md)"
    )


def make_generator(
    rollout: RolloutConfig | str,
    *,
    max_model_len: int = 0,
    seed: int = 0,
    say: Callable[[str], None] | None = None,
) -> Any:
    """The engine ``rollout.engine`` names, set up from ``rollout`` (a RolloutConfig, or an engine's name
    with default settings). ``max_model_len``: prompt plus completion tokens at most (vllm's engine is sized
    by it; 0 takes the model's limit); ``seed``: the engine's own seed (vllm); ``say``: where notices go."""
    r = RolloutConfig(engine=rollout) if isinstance(rollout, str) else rollout
    return engine_class(r.engine).from_settings(r, max_model_len=max_model_len, seed=seed, say=say)
