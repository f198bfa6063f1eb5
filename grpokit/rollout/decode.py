"""Moved to grpokit.rollout.engines.fast.decode (the fast engine's folder): this path keeps its public names."""

from grpokit.model.llama_layers import SUPPORTED_MODEL_TYPES
from grpokit.rollout.engines import moved
from grpokit.rollout.engines.fast.decode import (
    DynamicCacheEngine,
    StaticCacheEngine,
    check_kv_cache,
    make_engine,
    static_cache_support,
)

__all__ = [
    "DynamicCacheEngine",
    "SUPPORTED_MODEL_TYPES",
    "StaticCacheEngine",
    "check_kv_cache",
    "make_engine",
    "static_cache_support",
]


def __getattr__(name: str):
    raise moved(__name__, name, "grpokit.rollout.engines.fast.decode")
