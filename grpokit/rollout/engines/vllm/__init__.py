"""vLLM as the rollout engine (``rollout.engine: vllm``, docs/guides/vllm.md): the generator (generator.py), the
engine in this process (local.py), the client and server of server mode (remote.py, server.py), the collective
weight transfer (collective.py), what is pushed (weights.py) and the named errors (errors.py). Nothing here
imports vLLM until an engine starts."""

from grpokit.rollout.engines.vllm.errors import (
    VLLMServerError,
    VLLMUnavailable,
    WeightSyncError,
    WeightSyncTimeout,
)
from grpokit.rollout.engines.vllm.generator import VLLMGenerator
from grpokit.rollout.engines.vllm.local import vllm_missing
from grpokit.rollout.engines.vllm.weights import trainer_weights

__all__ = [
    "VLLMGenerator",
    "VLLMServerError",
    "VLLMUnavailable",
    "WeightSyncError",
    "WeightSyncTimeout",
    "trainer_weights",
    "vllm_missing",
]
