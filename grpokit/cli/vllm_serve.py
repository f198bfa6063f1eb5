"""``grpokit vllm-serve --model DIR [--port 8000]``: the vLLM server of ``rollout.vllm.mode: server``
(grpokit.rollout.vllm_server), in the environment where vLLM is installed."""

from __future__ import annotations

import json
import math
from pathlib import Path

from grpokit.cli.args import fail

DTYPES = ("auto", "float32", "bfloat16", "float16")


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
    p.add_argument("--dtype", default="auto", choices=DTYPES, help="the engine's dtype: auto (the model's), float32, bfloat16, float16")
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
    problem = option_problem(args) or model_length_problem(args.model, args.max_model_len)
    if problem:  # before vLLM is looked for: a bad option is named wherever the command runs
        return fail(args, f"vllm-serve: {problem}", 2)
    from grpokit.rollout.vllm import vllm_missing

    missing = vllm_missing()
    if missing:
        return fail(args, missing.replace("rollout.engine=vllm", "grpokit vllm-serve"), 2)
    from grpokit.rollout.vllm_server import serve
    serve(
        args.model, host=args.host, port=args.port, dtype=args.dtype, max_model_len=args.max_model_len,
        seed=args.seed, enforce_eager=args.enforce_eager, cpu_kv_cache_gib=args.cpu_kv_cache_gib,
        gpu_memory_utilization=args.gpu_memory_utilization, threads=args.threads, max_lora_rank=args.max_lora_rank,
    )  # fmt: skip
    return 0


def option_problem(args) -> str | None:
    """Why an option's value cannot serve (the first, by name), or None; nothing is imported or started."""
    if not args.model.strip():
        return "--model is empty; give the model folder (config.json, safetensors) or a hub id"
    checks = [
        ("--port", args.port, lambda v: 0 <= v <= 65535, "a port 0-65535 (0: any free one)"),
        ("--max-model-len", args.max_model_len, lambda v: v >= 1, "a number of tokens >= 1"),
        ("--seed", args.seed, lambda v: 0 <= v < 2**63, "a seed >= 0"),
        ("--gpu-memory-utilization", args.gpu_memory_utilization, lambda v: 0 < v <= 1, "a share in (0, 1], e.g. 0.9"),
        ("--cpu-kv-cache-gib", args.cpu_kv_cache_gib, lambda v: v >= 1, "a whole number of GiB >= 1"),
        ("--threads", args.threads, lambda v: v >= 1, "a number of threads >= 1"),
    ]  # fmt: skip
    for flag, value, ok, what in checks:
        if value is not None and (isinstance(value, float) and not math.isfinite(value) or not ok(value)):
            return f"{flag} {value:g}: give {what}"
    return None


def model_length_problem(model: str, max_model_len: int | None) -> str | None:
    """Why ``model`` cannot be served with ``max_model_len`` tokens, or None: a local path that is not a model
    folder, or a length beyond the positions its config.json gives (max_position_embeddings); a hub id is
    left to vLLM."""
    path = Path(model)
    if not path.exists():
        return None  # a hub id (vLLM resolves it, or names what is wrong)
    config = path / "config.json"
    if not config.is_file():
        return f"--model {model}: no config.json there (a model folder written by save_pretrained is needed)"
    if max_model_len is None:
        return None
    try:
        values = json.loads(config.read_text())
    except (OSError, ValueError) as e:
        return f"--model {model}: config.json cannot be read ({type(e).__name__}: {e})"
    text = values.get("text_config") if isinstance(values.get("text_config"), dict) else values
    positions = text.get("max_position_embeddings") if isinstance(text, dict) else None
    if isinstance(positions, int) and not isinstance(positions, bool) and max_model_len > positions:
        return (
            f"--max-model-len {max_model_len} is beyond the {positions} positions of {config} "
            f"(max_position_embeddings); give at most {positions}, or leave it out for the model's own"
        )
    return None
