"""Moved to grpokit.rollout.engines.vllm.remote: this path keeps its public names."""

from grpokit.rollout.engines import moved
from grpokit.rollout.engines.vllm.errors import VLLMServerError
from grpokit.rollout.engines.vllm.remote import (
    START,
    ServerEngine,
    pack_fingerprints,
    pack_weights,
    unpack_fingerprints,
    unpack_weights,
)

__all__ = [
    "START",
    "ServerEngine",
    "VLLMServerError",
    "pack_fingerprints",
    "pack_weights",
    "unpack_fingerprints",
    "unpack_weights",
]


def __getattr__(name: str):
    raise moved(__name__, name, "grpokit.rollout.engines.vllm.remote")
