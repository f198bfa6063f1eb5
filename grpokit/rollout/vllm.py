"""Moved to grpokit.rollout.engines.vllm (the vLLM engine's folder): this path keeps its public names."""

from grpokit.rollout.engines import moved
from grpokit.rollout.engines.vllm.errors import VLLMUnavailable, WeightSyncError, WeightSyncTimeout
from grpokit.rollout.engines.vllm.generator import PROBE_TOKENS, SEED_SPACE, VLLMGenerator
from grpokit.rollout.engines.vllm.local import LocalEngine, start_llm, vllm_missing
from grpokit.rollout.engines.vllm.weights import FINGERPRINT_POINTS, fingerprint, trainer_weights, version_of

__all__ = [
    "FINGERPRINT_POINTS",
    "LocalEngine",
    "PROBE_TOKENS",
    "SEED_SPACE",
    "VLLMGenerator",
    "VLLMUnavailable",
    "WeightSyncError",
    "WeightSyncTimeout",
    "fingerprint",
    "start_llm",
    "trainer_weights",
    "version_of",
    "vllm_missing",
]


def __getattr__(name: str):
    raise moved(__name__, name, "grpokit.rollout.engines.vllm (generator, local, weights, errors)")
