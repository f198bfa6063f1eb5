"""The vLLM engine's named errors, and the deadline every weight sync runs under (``rollout.vllm.sync_timeout_s``).

within(300, "a weight push to the engine", lambda: llm.load_weights(weights))   # or WeightSyncTimeout
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

from grpokit.core.errors import EngineError, TrainingError

T = TypeVar("T")


class WeightSyncError(EngineError):
    """The engine's weights are not the trainer's when they should be (a push that did not arrive): an engine
    failure (exit 4, grpokit.core.errors)."""


class WeightSyncTimeout(WeightSyncError):
    """A weight sync (in-process, over HTTP or over the collective group) did not finish within
    rollout.vllm.sync_timeout_s: the engine, the server or the channel hangs."""


class VLLMUnavailable(TrainingError):
    """vLLM cannot be imported here; the message says how to install it."""


class VLLMServerError(EngineError):
    """The vLLM server of rollout.vllm.server_url did not answer, stopped answering or failed a call: an engine
    failure (exit 4, grpokit.core.errors)."""


def within(seconds: float, what: str, work: Callable[[], T]) -> T:
    """``work()``'s result, or WeightSyncTimeout when it has not returned after ``seconds``; an exception it
    raises is raised here. It runs on a daemon thread of its own, so a hung transfer never holds this one (nor
    the process's exit); after a timeout it is left running, and the engine's weights are unknown: the run
    stops, it does not retry."""
    done: dict[str, object] = {}
    device = _cuda_device()  # a thread starts on CUDA device 0: the caller's (torchrun: its local rank) carried over

    def run() -> None:
        try:
            if device is not None:
                import torch

                torch.cuda.set_device(device)
            done["value"] = work()
        except BaseException as e:  # noqa: BLE001 (carried to the caller's thread)
            done["error"] = e

    thread = threading.Thread(target=run, name="grpokit-weight-sync", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise WeightSyncTimeout(
            f"{what} did not finish within {seconds:g} s (rollout.vllm.sync_timeout_s): the engine, the server or "
            "the channel between them hangs. Nothing was trained on samples of unknown weights; the run stops. "
            "Raise rollout.vllm.sync_timeout_s if a push of this model legitimately takes longer."
        )
    if "error" in done:
        raise done["error"]  # type: ignore[misc]
    return done["value"]  # type: ignore[return-value]


def _cuda_device() -> int | None:
    """The caller's current CUDA device, or None where CUDA was not initialised (nothing to carry over)."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    return torch.cuda.current_device()
