"""``grpokit vllm-serve``: a vLLM engine in its own process (on other GPUs, another node, or over loopback)
for ``rollout.vllm.mode: server``. It answers the calls of grpokit.rollout.engines.vllm.remote.ServerEngine with one
grpokit.rollout.engines.vllm.local.LocalEngine, the engine the colocated mode runs in the trainer's process:

    GET  /health              model, dtype, max_model_len, pid (answers once the engine is up)
    POST /generate            {"requests": [{"prompt_token_ids": [...], "params": {...}}]} -> token ids, log-probs
    POST /weights             a safetensors file in the body: vLLM's reload_weights with its tensors
    POST /lora                a LoRA adapter as a safetensors file, its adapter_config in the header (--max-lora-rank)
    POST /refresh_tied_head   a tied LM head rebuilt from the embedding (grpokit.rollout.engines.vllm.local._refresh_tied_head)
    POST /reset_prefix_cache  no KV block of the old weights serves a prompt again
    POST /fingerprints        the weight check's values (safetensors bytes)
    POST /prompt_logprobs     {"prompt_token_ids": [...]} -> the probe's log-probs
    POST /collective/open     {port, backend, group, timeout_s}: this side of a weight channel (grpokit.rollout.engines.vllm.collective)
    POST /collective/weights  {group, tensors: [[name, dtype, shape]...]}: receive them over it, then reload_weights

Why a server of our own: vLLM's OpenAI server cannot take weights pushed into it (TRL writes its own for the
same reason). FastAPI and uvicorn come with vLLM. Every call runs on the event loop's thread, the one that
started the engine, one at a time (an in-process vLLM engine is not for concurrent callers).

It trusts its callers: anyone who reaches the port can replace the weights (not run code: the weights are
safetensors, never a pickle). It listens on 127.0.0.1 unless told otherwise (--host).
"""

# no `from __future__ import annotations`: FastAPI reads the handlers' Request annotations
import asyncio
import json
import os
import socket
from pathlib import Path
from typing import Any

from grpokit.rollout.engines.vllm.local import LocalEngine, start_llm
from grpokit.rollout.engines.vllm.remote import metadata_of, pack_fingerprints, unpack_weights


class Channel:
    """The server's side of the collective weight transfer (grpokit.rollout.engines.vllm.collective): one TCPStore per
    port asked for, hosted here for the server's life, and the group of the trainer connected last (a new
    trainer, e.g. a resumed run, replaces the group of the one before)."""

    def __init__(self, host: str = "127.0.0.1"):
        self.host = host  # the server's --host: the store listens there only, as the HTTP server does
        self.stores: dict[int, Any] = {}  # port -> (TCPStore, its listening socket)
        self.groups: dict[str, tuple[Any, Any]] = {}  # name -> (group, the device tensors are received on)

    def open(self, body: dict[str, Any], peer: str) -> None:
        from datetime import timedelta

        import torch
        from torch.distributed import PrefixStore, TCPStore

        from grpokit.rollout.engines.vllm.collective import RECEIVER, make_group

        port, backend, timeout_s = int(body["port"]), body["backend"], float(body["timeout_s"])
        if port not in self.stores:  # torch's own listener would take every interface: ours takes --host's
            listener = socket.create_server((self.host, port))
            store = TCPStore(
                self.host, port, is_master=True, timeout=timedelta(seconds=timeout_s), wait_for_workers=False,
                master_listen_fd=listener.fileno(),
            )  # fmt: skip
            self.stores[port] = (store, listener)
        self.groups.clear()  # one trainer at a time
        store = PrefixStore(body["group"], self.stores[port][0])
        group = make_group(store, RECEIVER, backend, peer=peer, timeout_s=timeout_s)
        device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        self.groups[body["group"]] = (group, device)

    def receive(self, name: str, announced: list[list]) -> list:
        from grpokit.rollout.engines.vllm.collective import receive

        if name not in self.groups:
            raise KeyError(f"no weight channel {name!r} is open here (a newer trainer replaced it, or none opened it)")
        group, device = self.groups[name]
        return receive(group, announced, device)


def build_app(engine: LocalEngine, info: dict[str, Any], host: str = "127.0.0.1"):
    """The FastAPI application over ``engine``; ``info``: what /health says about it; ``host``: the address it
    listens on (the collective transfer's store listens there too)."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response

    app = FastAPI(title="grpokit vllm-serve")

    @app.exception_handler(Exception)
    async def failed(request: Request, e: Exception):  # the client shows this message (VLLMServerError)
        return JSONResponse(status_code=500, content={"error": f"{type(e).__name__}: {e}"})

    @app.get("/health")
    async def health():
        return info

    @app.post("/generate")
    async def generate(request: Request):
        body = await request.json()
        requests = [(r["prompt_token_ids"], r["params"]) for r in body["requests"]]
        outputs = engine.sample(requests)
        return {"outputs": [{"token_ids": ids, "logprobs": lps} for ids, lps in outputs]}

    @app.post("/weights")
    async def weights(request: Request):
        tensors = unpack_weights(await request.body())
        engine.load_weights(tensors)
        return {"tensors": len(tensors)}

    channel = Channel(host)

    @app.post("/collective/open")
    async def collective_open(request: Request):
        body = await request.json()
        peer = request.client.host if request.client else "127.0.0.1"
        await asyncio.to_thread(channel.open, body, peer)  # blocks until the trainer has joined the group
        return {"group": body["group"]}

    @app.post("/collective/weights")
    async def collective_weights(request: Request):
        body = await request.json()
        tensors = await asyncio.to_thread(channel.receive, body["group"], body["tensors"])
        engine.load_weights(tensors)  # on the event loop's thread, as every engine call
        return {"tensors": len(tensors)}

    @app.post("/lora")
    async def lora(request: Request):
        blob = await request.body()
        tensors = unpack_weights(blob)
        engine.load_adapter(tensors, json.loads(metadata_of(blob)["adapter_config"]))
        return {"tensors": len(tensors)}

    @app.post("/refresh_tied_head")
    async def refresh_tied_head():
        engine.refresh_tied_head()
        return {}

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache():
        engine.reset_prefix_cache()
        return {}

    @app.post("/fingerprints")
    async def fingerprints():
        return Response(pack_fingerprints(engine.readable()), media_type="application/octet-stream")

    @app.post("/prompt_logprobs")
    async def prompt_logprobs(request: Request):
        body = await request.json()
        return {"logprobs": engine.prompt_logprobs(body["prompt_token_ids"])}

    return app


def serve(
    model: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    dtype: str = "auto",
    max_model_len: int | None = None,
    seed: int = 0,
    enforce_eager: bool | None = None,
    cpu_kv_cache_gib: int = 1,
    gpu_memory_utilization: float = 0.9,
    threads: int | None = None,
    max_lora_rank: int = 0,
) -> None:
    """Start the engine of ``model`` (a folder with config.json and safetensors, or a hub id), then answer
    on ``host``:``port`` until stopped (Ctrl-C, SIGTERM). ``max_lora_rank`` > 0: with vLLM's LoRA support, so a LoRA
    run pushes its adapter alone (rollout.vllm.lora_push), of at most that rank."""
    import torch
    import uvicorn

    if threads:
        torch.set_num_threads(threads)  # before the engine starts: vLLM's CPU worker fixes it afterwards
    cuda = torch.cuda.is_available()
    llm = start_llm(
        model, dtype=dtype, seed=seed, max_model_len=max_model_len, enforce_eager=enforce_eager,
        cpu_kv_cache_gib=cpu_kv_cache_gib, gpu_memory_utilization=gpu_memory_utilization, sleep=False, cuda=cuda,
        max_lora_rank=max_lora_rank,
    )  # fmt: skip
    config = llm.llm_engine.model_config
    resolved = str(config.dtype).removeprefix("torch.")
    info = {
        "model": str(model), "dtype": resolved, "max_model_len": config.max_model_len, "pid": os.getpid(),
        "device": "cuda" if cuda else "cpu", "max_lora_rank": max_lora_rank,
    }  # fmt: skip
    app = build_app(LocalEngine(llm, resolved), info, host)
    print(f"grpokit vllm-serve: {json.dumps(info)} at http://{host}:{port}", flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")


def model_folder_problem(model: str) -> str | None:
    """Why ``model`` cannot be served (a local path without config.json), or None (a folder, or a hub id)."""
    path = Path(model)
    if path.exists() and not (path / "config.json").is_file():
        return f"--model {model}: no config.json there (a model folder written by save_pretrained is needed)"
    return None
