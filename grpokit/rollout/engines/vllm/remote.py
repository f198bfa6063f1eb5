"""The client side of server mode (``rollout.vllm.mode: server``): the calls the vLLM generator makes on its
engine (grpokit.rollout.engines.vllm.local.LocalEngine's), sent over HTTP to a ``grpokit vllm-serve`` process
(grpokit.rollout.engines.vllm.server), which makes them on its own LocalEngine. The client needs no vLLM.

    engine = ServerEngine("http://127.0.0.1:8000", timeout_s=240)   # waits for /health, then ready
    engine.sample([(prompt_ids, {"temperature": 1.0, "max_tokens": 64, "seed": 7, ...})])
    engine.load_weights(list(state.items()))                         # POST /weights, safetensors bytes

Wire format. Sampling requests and their results are JSON (token ids and log-probs: a float32 log-prob
goes through JSON's decimal text and back to the same float). Weights go as one safetensors file in the
body of a POST (``safetensors.torch.save``), read back by the server with ``safetensors.torch.load``:
- it works the same over loopback and between two machines (server mode exists for a server on other GPUs
  or another node), where a shared-memory file would need both processes on one host;
- safetensors holds tensors and nothing else: a body cannot run code in the server, as a pickle could;
- the cost is two copies of the weights (the blob, then the engine's own) and the socket: 0.6-0.75 s a push
  of 113 MiB over loopback on a 2-core CPU (0.15-0.5 s colocated), so about 3 GB a push for a 1.5B model
  in bf16, which is why TRL and verl send weights over NCCL between GPUs: ``weight_transfer="collective"``
  does (grpokit.rollout.engines.vllm.collective: a group of the two processes, NCCL on CUDA, gloo otherwise).

Errors: no server answering within ``timeout_s`` at the start, a server that stops answering mid-run and
a call the server fails all raise VLLMServerError naming the URL and what to do.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from grpokit.rollout.engines.vllm.errors import VLLMServerError, WeightSyncTimeout

START = "grpokit vllm-serve --model MODEL_DIR --port PORT"
"""How to start the server (grpokit.cli.vllm_serve), for the messages."""


def pack_weights(weights: list[tuple[str, Tensor]], metadata: dict[str, str] | None = None) -> bytes:
    """The tensors as one safetensors file (bytes), on the CPU, contiguous; a tensor sharing another's
    storage is copied (safetensors refuses shared storage). ``metadata``: strings kept in its header."""
    from safetensors.torch import save

    state: dict[str, Tensor] = {}
    seen: set[int] = set()
    for name, tensor in weights:
        t = tensor.detach().cpu().contiguous()
        ptr = t.untyped_storage().data_ptr()
        state[name] = t.clone() if ptr in seen else t
        seen.add(ptr)
    return save(state, metadata=metadata)


def unpack_weights(blob: bytes) -> list[tuple[str, Tensor]]:
    """pack_weights' tensors back, by name."""
    from safetensors.torch import load

    return list(load(blob).items())


def metadata_of(blob: bytes) -> dict[str, str]:
    """The metadata in the header of a safetensors file (``blob``): 8 bytes of header length, then its JSON."""
    header_len = int.from_bytes(blob[:8], "little")
    return json.loads(blob[8 : 8 + header_len]).get("__metadata__", {})


def pack_fingerprints(tensors: dict[str, tuple[tuple[int, ...], Tensor]]) -> bytes:
    """LocalEngine.readable()'s fingerprints as safetensors bytes, each tensor's full shape in the metadata."""
    from safetensors.torch import save

    shapes = {name: json.dumps(list(shape)) for name, (shape, _) in tensors.items()}
    return save({name: values.contiguous().clone() for name, (_, values) in tensors.items()}, metadata=shapes)


def unpack_fingerprints(blob: bytes) -> dict[str, tuple[tuple[int, ...], Tensor]]:
    """pack_fingerprints' (shape, values) by name."""
    from safetensors.torch import load

    values = load(blob)
    metadata = metadata_of(blob)
    return {name: (tuple(json.loads(metadata[name])), tensor) for name, tensor in values.items()}


class ServerEngine:
    """A ``grpokit vllm-serve`` server at ``url``, reached over HTTP (urllib: one request at a time, no
    dependency). Waits up to ``timeout_s`` for its health check at construction. ``weight_transfer``: how a
    push travels, ``http`` (a safetensors file in a POST) or ``collective`` (each tensor broadcast over a
    process group of the two, grpokit.rollout.engines.vllm.collective, which meets at the server's host on
    ``collective_port``). ``sync_timeout_s``: how long each call of a weight push may take
    (rollout.vllm.sync_timeout_s: WeightSyncTimeout past it); the other calls wait as long as the server works (a
    long rollout is not a dead server)."""

    def __init__(
        self, url: str, *, timeout_s: float = 240.0, weight_transfer: str = "http", collective_port: int = 51216,
        sync_timeout_s: float = 300.0,
    ):  # fmt: skip
        self.url = url.rstrip("/")
        self.timeout_s, self.sync_timeout_s = timeout_s, sync_timeout_s
        self.info = self._wait_healthy(timeout_s)
        self.dtype: str = self.info["dtype"]
        self.max_lora_rank: int = int(self.info.get("max_lora_rank", 0))  # 0: the server takes no adapter
        self.weight_transfer, self.collective_port = weight_transfer, collective_port
        self.group: Any = None  # the collective's process group (opened at the first push) and its name
        self.group_name = ""
        self.group_device: Any = None  # where tensors are broadcast from: CUDA (nccl) or the CPU (gloo)

    def describe(self) -> str:
        i = self.info
        return f"model {i['model']}, {i['dtype']}, max_model_len {i['max_model_len']}, pid {i['pid']}"

    # ----------------------------------------------------------------------------- HTTP

    def _wait_healthy(self, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        last = "no answer"
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=min(5.0, max(timeout_s, 0.1))) as r:
                    return json.loads(r.read())
            except (OSError, http.client.HTTPException, ValueError) as e:  # refused, reset, timed out, not JSON
                last = f"{type(e).__name__}: {getattr(e, 'reason', e)}"
            if time.monotonic() >= deadline:
                raise VLLMServerError(
                    f"no vLLM server answered at {self.url}/health within {timeout_s:g} s (last: {last}). "
                    f"rollout.vllm.mode=server samples on a server started apart: start it with {START} "
                    "(the port of rollout.vllm.server_url), or raise rollout.vllm.server_timeout_s while it loads."
                )
            time.sleep(0.5)

    def _call(
        self, what: str, path: str, *, body: bytes | None = None, json_body: Any = None, timeout: float | None = None
    ) -> bytes:
        """POST (with a body) or GET ``path``; the answer's bytes. VLLMServerError when the server is gone or
        the call failed there (its message); WeightSyncTimeout when ``timeout`` seconds passed without an answer
        (None: no limit)."""
        headers = {}
        if json_body is not None:
            body = json.dumps(json_body).encode()
            headers["Content-Type"] = "application/json"
        elif body is not None:
            headers["Content-Type"] = "application/octet-stream"
        request = urllib.request.Request(f"{self.url}{path}", data=body, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as r:  # None: a long rollout is not a dead server
                return r.read()
        except urllib.error.HTTPError as e:
            try:
                detail = json.loads(e.read()).get("error", "")
            except (ValueError, OSError):
                detail = ""
            raise VLLMServerError(
                f"the vLLM server at {self.url} failed {what} (HTTP {e.code}): {detail or e.reason}"
            ) from None
        except (OSError, http.client.HTTPException) as e:  # refused, reset, timed out (OSError too)
            timed_out = isinstance(e, TimeoutError) or isinstance(getattr(e, "reason", None), TimeoutError)
            if timeout is not None and timed_out:  # reading the answer, or connecting (URLError's reason)
                raise WeightSyncTimeout(
                    f"the vLLM server at {self.url} did not answer {what} within {timeout:g} s "
                    "(rollout.vllm.sync_timeout_s): it hangs or is overloaded. Nothing was trained on samples of "
                    "unknown weights; the run stops. Raise rollout.vllm.sync_timeout_s if a push of this model "
                    "legitimately takes longer."
                ) from None
            raise VLLMServerError(
                f"the vLLM server at {self.url} stopped answering during {what} ({type(e).__name__}: "
                f"{getattr(e, 'reason', e)}): it was stopped or died (its own output says why). Nothing was "
                f"trained on this step's samples; restart it ({START}) and resume the run (grpokit train --resume)."
            ) from None

    def _json(self, what: str, path: str, payload: Any = None, timeout: float | None = None) -> Any:
        return json.loads(self._call(what, path, json_body=payload if payload is not None else {}, timeout=timeout))

    # ----------------------------------------------------------------------------- LocalEngine's calls

    def sample(self, requests: list[tuple[list[int], dict[str, Any]]]) -> list[tuple[list[int], list[float]]]:
        payload = {"requests": [{"prompt_token_ids": list(ids), "params": params} for ids, params in requests]}
        answer = self._json("a rollout", "/generate", payload)
        return [(out["token_ids"], out["logprobs"]) for out in answer["outputs"]]

    def load_weights(self, weights: list[tuple[str, Tensor]]) -> None:
        if self.weight_transfer == "collective":
            self._broadcast_weights(weights)
        else:
            self._call("a weight push", "/weights", body=pack_weights(weights), timeout=self.sync_timeout_s)

    def load_adapter(self, weights: list[tuple[str, Tensor]], config: dict[str, Any]) -> None:
        """The LoRA adapter in a POST (safetensors, its adapter_config in the header), over HTTP whatever the weight
        transfer: a few MB, where the collective channel is for whole models."""
        blob = pack_weights(weights, metadata={"adapter_config": json.dumps(config)})
        self._call("an adapter push", "/lora", body=blob, timeout=self.sync_timeout_s)

    # ----------------------------------------------------------------------------- the collective transfer

    def _alongside(self, what: str, path: str, payload: Any, work: Callable[[], None]) -> Any:
        """POST ``payload`` to ``path`` from a thread while ``work`` runs here (the server answers once its side of
        the collective is done); the answer. A failed ``work`` drops the group and raises VLLMServerError: the
        server's own error when it answers with one, else ours."""
        answer: dict[str, Any] = {}

        def post() -> None:
            try:
                answer["value"] = self._json(what, path, payload)
            except Exception as e:  # noqa: BLE001 (carried to the caller's thread)
                answer["error"] = e

        thread = threading.Thread(target=post, name="grpokit-vllm-collective", daemon=True)
        thread.start()  # daemon: a server stuck in its side never holds the trainer's exit
        try:
            work()
        except Exception as e:  # the rendezvous or a broadcast failed: a dead, stuck or unreachable peer
            self.group = None
            thread.join(timeout=min(self.timeout_s, 30.0))
            if isinstance(answer.get("error"), VLLMServerError):
                raise answer["error"] from None
            raise VLLMServerError(
                f"the weight channel to the vLLM server at {self.url} failed during {what} ({type(e).__name__}: {e}). "
                "Nothing was trained on this step's samples. The server's host must accept connections on "
                f"rollout.vllm.collective_port ({self.collective_port}) and gloo's / NCCL's own ports; or set "
                "rollout.vllm.weight_transfer=http."
            ) from None
        thread.join()
        if "error" in answer:
            self.group = None  # the server failed its side: the next push opens a new group
            raise answer["error"]
        return answer["value"]

    def _open_group(self, on_cuda: bool) -> None:
        from datetime import timedelta

        from torch.distributed import PrefixStore, TCPStore

        from grpokit.rollout.engines.vllm.collective import SOURCE, make_group, new_group_name

        backend = "nccl" if on_cuda and self.info.get("device") == "cuda" else "gloo"
        name = new_group_name()
        host = urllib.parse.urlsplit(self.url).hostname or "127.0.0.1"
        payload = {"port": self.collective_port, "backend": backend, "group": name, "timeout_s": self.timeout_s}
        made: dict[str, Any] = {}

        def join() -> None:
            store = TCPStore(host, self.collective_port, is_master=False, timeout=timedelta(seconds=self.timeout_s))
            made["group"] = make_group(PrefixStore(name, store), SOURCE, backend, peer=host, timeout_s=self.timeout_s)

        self._alongside("opening the weight channel", "/collective/open", payload, join)
        self.group, self.group_name = made["group"], name
        self.group_device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")

    def _broadcast_weights(self, weights: list[tuple[str, Tensor]]) -> None:
        from grpokit.rollout.engines.vllm.collective import describe, send

        if self.group is None:
            self._open_group(any(t.is_cuda for _, t in weights))
        payload = {"group": self.group_name, "tensors": describe(weights)}
        self._alongside("a weight push", "/collective/weights", payload, lambda: send(self.group, weights, self.group_device))

    def refresh_tied_head(self) -> None:
        self._json("the tied LM head's refresh", "/refresh_tied_head", timeout=self.sync_timeout_s)

    def reset_prefix_cache(self) -> None:
        self._json("the prefix cache reset", "/reset_prefix_cache", timeout=self.sync_timeout_s)

    def readable(self) -> dict[str, tuple[tuple[int, ...], Tensor]]:
        return unpack_fingerprints(self._call("the weight check", "/fingerprints", body=b""))

    def prompt_logprobs(self, ids: list[int]) -> list[float]:
        return self._json("the probe", "/prompt_logprobs", {"prompt_token_ids": list(ids)})["logprobs"]

    def wake_up(self, tags: list[str]) -> None:
        """The server keeps its engine awake (it has its own GPUs): nothing to do."""

    def sleep(self) -> None:
        """As wake_up."""

    def close(self) -> None:
        """The server was started apart and keeps running (another run may use it)."""
