"""``grpokit vllm-serve --model DIR [--port 8000]``: the vLLM server of ``rollout.vllm.mode: server``
(grpokit.rollout.vllm_server), in the environment where vLLM is installed."""

from __future__ import annotations

from grpokit.cli.args import fail


def add_vllm_serve_parser(subparsers, parents: list) -> None:
    """Register ``grpokit vllm-serve`` (parents: the shared --debug parser)."""
    p = subparsers.add_parser(
        "vllm-serve",
        help="a vLLM engine in its own process for rollout.vllm.mode=server (weights pushed by the trainer)",
        parents=parents,
        description="Start a vLLM engine of MODEL and answer the trainer's rollouts and weight pushes over HTTP "
        "until stopped. The trainer: rollout.engine=vllm rollout.vllm.mode=server "
        "rollout.vllm.server_url=http://HOST:PORT (docs/guides/vllm.md).",
    )
    p.add_argument("--model", required=True, help="the model folder (config.json, safetensors) or hub id to start from")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface; trusted networks only)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on")
    p.add_argument("--dtype", default="auto", help="the engine's dtype: auto (the model's), float32, bfloat16, float16")
    p.add_argument("--max-model-len", type=int, help="prompt plus completion tokens at most (default: the model's)")
    p.add_argument("--seed", type=int, default=0, help="the engine's seed (each request brings its own too)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9, help="GPU: vLLM's share of the GPU's memory")
    p.add_argument("--cpu-kv-cache-gib", type=int, default=1, help="CPU: GiB of KV cache (VLLM_CPU_KVCACHE_SPACE unless set)")
    p.add_argument(
        "--enforce-eager", action="store_true", default=None,
        help="no torch.compile / CUDA graphs (the default on a CPU, where compiling takes minutes)",
    )  # fmt: skip
    p.add_argument("--threads", type=int, help="torch threads of the engine (CPU)")
    p.add_argument(
        "--max-lora-rank", type=int, default=0, choices=(0, 1, 8, 16, 32, 64, 128, 256, 320, 512),  # vLLM's values
        help="LoRA runs: take the trainer's adapter alone, up to this rank (rollout.vllm.lora_push); 0: no LoRA, "
        "the trainer pushes merged weights",
    )  # fmt: skip
    p.set_defaults(func=cmd_vllm_serve)


def cmd_vllm_serve(args) -> int:
    from grpokit.rollout.vllm import vllm_missing

    missing = vllm_missing()
    if missing:
        return fail(args, missing.replace("rollout.engine=vllm", "grpokit vllm-serve"), 2)
    from grpokit.rollout.vllm_server import model_folder_problem, serve

    problem = model_folder_problem(args.model)
    if problem:
        return fail(args, problem, 2)
    serve(
        args.model, host=args.host, port=args.port, dtype=args.dtype, max_model_len=args.max_model_len,
        seed=args.seed, enforce_eager=args.enforce_eager, cpu_kv_cache_gib=args.cpu_kv_cache_gib,
        gpu_memory_utilization=args.gpu_memory_utilization, threads=args.threads, max_lora_rank=args.max_lora_rank,
    )  # fmt: skip
    return 0
