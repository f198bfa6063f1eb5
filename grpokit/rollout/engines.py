"""The rollout engines by name (``rollout.engine``): one place that builds a generator.

    generator = make_generator(cfg.rollout, max_model_len=2048, seed=cfg.train.seed, say=say)
    generator = make_generator("hf")                      # a name alone: the engine's default settings

fast and hf are grpokit.rollout.generation's; vllm is grpokit.rollout.vllm's (imported only when asked for,
so that nothing else needs vLLM installed).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from grpokit.config.schema import ENGINES, RolloutConfig
from grpokit.rollout.generation import FastGenerator, HFGenerator


def make_generator(
    rollout: RolloutConfig | str,
    *,
    max_model_len: int = 0,
    seed: int = 0,
    say: Callable[[str], None] | None = None,
) -> Any:
    """The generator ``rollout.engine`` names, set up from ``rollout`` (a RolloutConfig, or an engine's name
    with default settings). ``max_model_len``: prompt plus completion tokens at most (vllm's engine is sized
    by it; 0 takes the model's limit); ``seed``: the engine's own seed (vllm); ``say``: where notices go."""
    r = RolloutConfig(engine=rollout) if isinstance(rollout, str) else rollout
    if r.engine not in ENGINES:
        raise ValueError(f"unknown rollout engine {r.engine!r}; choose one of {ENGINES}")
    if r.engine == "fast":
        return FastGenerator(kv_cache=r.kv_cache, cuda_graphs=r.cuda_graphs)
    if r.engine == "hf":
        return HFGenerator()
    from grpokit.rollout.vllm import VLLMGenerator

    return VLLMGenerator(r.vllm, max_model_len=max_model_len or None, seed=seed, say=say)
