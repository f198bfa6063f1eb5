"""The fast engine (``rollout.engine: fast``): its own sampling loop (generator.py) over a decode engine with a
static or dynamic KV cache (decode.py)."""

from grpokit.rollout.engines.fast.generator import FastGenerator

__all__ = ["FastGenerator"]
