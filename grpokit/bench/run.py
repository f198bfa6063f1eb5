"""Timing a grpokit training run: build a trainer from public config options, time ``train_step()`` on
the wall clock, read its public step metrics, and measure its memory by role (grpokit.bench.memory)."""

from __future__ import annotations

import dataclasses
import datetime
import gc
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grpokit.bench.memory import PeakMeter, memory_report
from grpokit.bench.model import n_words, random_prompts, random_reward
from grpokit.bench.plan import ModelDims
from grpokit.bench.roofline import decode_roofline, device_rates, phase_bounds
from grpokit.bench.shapes import BENCH_SHAPES, TIME_KEYS, BenchShape


def device_name(device) -> str:
    import torch

    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    return f"cpu ({torch.get_num_threads()} threads)"


def timed_step(device, step: Callable[[], Any]) -> tuple[Any, float]:
    """(what ``step()`` returns, its wall-clock seconds), with the GPU's queue drained before and after."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    result = step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return result, time.perf_counter() - t0


def memory_fraction(cap_gib: float, total_bytes: int) -> float:
    """The allocator fraction that caps a device of ``total_bytes`` at ``cap_gib`` GiB:
    cap_gib * 2**30 / total_bytes, refused outside (0, 1]."""
    if not cap_gib > 0:
        raise ValueError(f"--memory-cap-gib must be > 0, got {cap_gib}")
    fraction = cap_gib * 2**30 / total_bytes
    if fraction > 1:
        raise ValueError(
            f"--memory-cap-gib {cap_gib}: the device has only {total_bytes / 2**30:.1f} GiB; give a smaller cap"
        )
    return fraction


def set_memory_cap(device, cap_gib: float | None) -> float | None:
    """Cap this process's CUDA caching allocator at ``cap_gib`` GiB (an allocation past it raises
    out-of-memory, as on a smaller card); the fraction set, or None. Refused on CPU: there is no
    per-process allocator limit to set there (the peak RSS is reported instead)."""
    if cap_gib is None:
        return None
    import torch

    if device.type != "cuda":
        raise ValueError(f"--memory-cap-gib {cap_gib}: a memory cap needs a CUDA device, this run is on {device}")
    index = device.index if device.index is not None else torch.cuda.current_device()  # "cuda" has none
    fraction = memory_fraction(cap_gib, torch.cuda.get_device_properties(index).total_memory)
    torch.cuda.set_per_process_memory_fraction(fraction, index)
    return fraction


def median(values: list[float]) -> float:
    return float(statistics.median_high(values))  # sorted[n // 2], as the TRL anchor script


def resolve_shape(shape: str | BenchShape) -> tuple[str, BenchShape]:
    if isinstance(shape, BenchShape):
        return "custom", shape
    if shape not in BENCH_SHAPES:
        raise ValueError(f"unknown bench shape {shape!r}; choose one of {list(BENCH_SHAPES)}")
    return shape, BENCH_SHAPES[shape]


def _check_prompt_lengths(model_dir, rows: list[dict], shape: BenchShape) -> None:
    from grpokit.data.templates import encode_prompts
    from grpokit.model.loading import load_tokenizer

    tok = load_tokenizer(str(model_dir))
    encoded = encode_prompts([r["prompt"] for r in rows], tok, template="plain")
    lengths = {len(ids) for ids in encoded}
    if lengths != {shape.prompt_len}:
        raise ValueError(
            f"prompts encode to {sorted(lengths)} tokens, not exactly {shape.prompt_len}: the bench needs "
            "a word-level tokenizer with words w0, w1, ... (use build_random_model or --model-size)"
        )


def bench_overrides(shape: BenchShape, steps: int, *, algo: str, beta: float | None, **opts) -> list[str]:
    """The config overrides of a bench run (all public options)."""
    return [
        f"model.dtype={opts['dtype']}",
        f"optim.precision={opts['precision']}",
        f"model.device={opts['device']}",
        f"model.gradient_checkpointing={str(opts['gradient_checkpointing']).lower()}",
        "data.template=plain",
        f"data.max_prompt_tokens={shape.prompt_len}",
        "data.shuffle=false",
        f"rollout.group_size={shape.group_size}",
        f"rollout.prompts_per_step={shape.prompts}",
        f"rollout.max_new_tokens={shape.completion_len}",
        f"rollout.ignore_eos={str(opts['full_length']).lower()}",
        "rollout.temperature=1.0",
        "rollout.top_p=1.0",
        "rollout.top_k=0",
        f"rollout.engine={opts['engine']}",
        f"rollout.kv_cache={opts['kv_cache']}",
        f"rollout.cuda_graphs={str(opts['cuda_graphs']).lower()}",
        f"algo.preset={algo}",
        *([f"algo.beta={beta}"] if beta is not None else []),
        "optim.lr=1e-6",
        "optim.epochs=1",
        "optim.mini_batches=1",
        f"optim.micro_batch_size={shape.micro_batch}",
        f"train.steps={steps}",
        f"train.seed={opts['seed']}",
        "train.samples_every=0",
        "train.tensorboard=false",
        "eval.enabled=false",
        "train.adopt_average=false",  # the GRPO step as TRL's runs it: auto keeps an average of the weights on a CPU
    ]


def _step_record(i: int, wall: float, m: dict[str, float], shape: BenchShape) -> dict[str, Any]:
    splits = {f"{k}_s": float(m.get(f"time/{k}", 0.0)) for k in TIME_KEYS}
    tokens = float(m["completion_len/mean"]) * shape.completions
    gen_s = splits["generation_s"]
    return {
        "step": i + 1,
        "step_s": wall,
        **splits,
        "other_s": wall - sum(splits.values()),
        "tokens_per_s": tokens / wall,
        "generation_tokens_per_s": tokens / gen_s if gen_s > 0 else 0.0,
        "completion_len_mean": float(m["completion_len/mean"]),
        "truncated_frac": float(m["truncated_frac"]),
        "peak_memory_mb": float(m["peak_memory_mb"]),
        "cuda_graphs_used": bool(m.get("rollout/cuda_graphs", 0.0)),
        "compiled_decode": bool(m.get("rollout/compiled", 0.0)),
        "static_kv_cache": bool(m.get("rollout/static_kv_cache", 0.0)),
    }


def run_bench(
    model_dir: str | Path,
    shape: str | BenchShape,
    *,
    steps: int,
    algo: str = "grpo",
    beta: float | None = None,
    gradient_checkpointing: bool = True,
    dtype: str = "auto",
    precision: str = "auto",
    engine: str = "fast",
    kv_cache: str = "auto",
    cuda_graphs: bool = True,
    output_dir: str | Path | None = None,
    device: str = "auto",
    seed: int = 0,
    full_length: bool = True,
    overrides: list[str] | tuple[str, ...] = (),
    memory_cap_gib: float | None = None,
) -> dict[str, Any]:
    """Run ``steps`` training steps of the ``algo`` preset on ``shape`` with the model in ``model_dir``
    and time them.

    Settings as in the TRL anchor: AdamW lr 1e-6, temperature 1 (no top-k/top-p), one optimizer step
    per rollout, micro-batches of ``shape.micro_batch``; ``beta`` None keeps the preset's (grpo: 0.04,
    seq-mean-token-mean, clip 0.2, k3 KL). ``full_length`` (rollout.ignore_eos) runs every completion to
    ``completion_len`` tokens. ``overrides`` (``key=value``) come after the bench's own and win.
    ``memory_cap_gib`` caps this process's CUDA allocator (``torch.cuda.set_per_process_memory_fraction``):
    an allocation beyond it raises out-of-memory as a smaller card would.

    Returns a dict: per_step (list of per-step dicts), step_s (list), median_step_s, median (of each
    time split, tokens/s), peak_memory_gib and how it was measured, memory (the measured peak and its
    split by role, grpokit.bench.memory), shape, device, dtype, n_params, bounds (each phase's measured median,
    its bound on this device and their ratio: grpokit.bench.roofline.phase_bounds), and the decode roofline of
    this shape on an H100 SXM (roofline_h100, as earlier results have it). Medians are over steps 2..N (step 1 alone when steps == 1).
    """
    import torch

    from grpokit.config.schema import load_config, resolve_algo
    from grpokit.model.loading import pick_device
    from grpokit.trainers.grpo import GRPOTrainer

    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    shape_name, shape = resolve_shape(shape)
    if shape.completions % shape.micro_batch:
        raise ValueError(
            f"micro_batch {shape.micro_batch} must divide the {shape.completions} completions of a step"
        )
    from grpokit.model.loading import load_tokenizer

    rows = random_prompts(
        shape.prompts * steps, shape.prompt_len, n_words(load_tokenizer(str(model_dir))), seed
    )
    _check_prompt_lengths(model_dir, rows, shape)
    opts = dict(
        dtype=dtype,
        precision=precision,
        device=device,
        gradient_checkpointing=gradient_checkpointing,
        full_length=full_length,
        engine=engine,
        kv_cache=kv_cache,
        cuda_graphs=cuda_graphs,
        seed=seed,
    )
    cfg = load_config(None, [*bench_overrides(shape, steps, algo=algo, beta=beta, **opts), *overrides])
    beta = resolve_algo(cfg).kl.beta  # the preset's when not given
    tmp = None
    if output_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="grpokit-bench-")
        output_dir = tmp.name
    cfg.model.name_or_path = str(model_dir)  # set directly: a path is not parsed as YAML
    cfg.train.output_dir = str(output_dir)
    device_obj = pick_device(cfg.model.device)
    cap_fraction = set_memory_cap(device_obj, memory_cap_gib)
    meter = PeakMeter(device_obj)
    meter.baseline()
    trainer = model = None
    try:
        trainer = GRPOTrainer(cfg, train_rows=rows, reward_functions=[("random", random_reward(seed), 1.0)])
        model, dev = trainer.model, trainer.learner.device
        meter.start()
        per_step = []
        for i in range(steps):
            m, seconds = timed_step(dev, trainer.train_step)
            per_step.append(_step_record(i, seconds, m, shape))
        memory = memory_report(trainer, meter)
        peak_reserved = torch.cuda.max_memory_reserved(dev) / 2**30 if dev.type == "cuda" else None
        config = model.config
        n_params = sum(p.numel() for p in model.parameters())
        first = next(model.parameters())
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        dtype_name = str(first.dtype).replace("torch.", "")
        mode = trainer.learner.precision
        roofline = decode_roofline(
            n_params,
            first.element_size(),
            config.num_hidden_layers,
            config.num_key_value_heads,
            head_dim,
            shape.completions,
            shape.prompt_len,
            shape.completion_len,
            first.element_size(),
        )
        last = per_step[-1]
        decode_engine = "hf" if engine == "hf" else ("static" if last["static_kv_cache"] else "dynamic")
        shared_prompt = bool(trainer.learner.shared_prefix)  # optim.shared_prefix as resolved for the device
        bound_inputs = dict(  # the phases' bounds, taken once the trainer's memory is free (a rate may be measured)
            dims=ModelDims.from_dict(config.to_dict()), weight_bytes=first.element_size(), kv_bytes=first.element_size(),
            reference=trainer.algo.uses_reference, lora=cfg.lora.enabled, epochs=cfg.optim.epochs,
        )  # fmt: skip
        compute_dtype = mode.compute_dtype
    finally:
        trainer = model = first = None  # noqa: F841  (free the GPU before the next run or TRL's)
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        if cap_fraction is not None:
            torch.cuda.set_per_process_memory_fraction(
                1.0, torch.cuda.current_device() if device_obj.index is None else device_obj.index
            )
        if tmp is not None:
            tmp.cleanup()

    timed = per_step[1:] if steps > 1 else per_step
    med = {k: median([s[k] for s in timed]) for k in ("step_s", *(f"{k}_s" for k in TIME_KEYS), "other_s")}
    med["tokens_per_s"] = median([s["tokens_per_s"] for s in timed])
    med["generation_tokens_per_s"] = median([s["generation_tokens_per_s"] for s in timed])
    bounds = phase_bounds(
        med, rates=device_rates(dev, compute_dtype), rows=shape.completions, prompt_len=shape.prompt_len,
        completion_len=shape.completion_len, **bound_inputs,
    )  # fmt: skip
    import transformers

    from grpokit.core.version import VERSION

    return {
        "system": "grpokit",
        "version": VERSION,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "date": datetime.date.today().isoformat(),
        "algo": algo,
        "shape": shape_name,
        "shape_params": dataclasses.asdict(shape),
        "completions_per_step": shape.completions,
        "prompt_len": shape.prompt_len,
        "completion_len": shape.completion_len,
        "full_length_completions": full_length,
        "model_dir": str(model_dir),
        "n_params": n_params,
        "dtype": dtype_name,
        "precision": mode.name,
        "precision_description": mode.description,
        "compute_dtype": str(mode.compute_dtype).replace("torch.", ""),
        "bytes_per_param": mode.bytes_per_param,
        "engine": engine,
        "kv_cache": kv_cache,
        "decode_engine": decode_engine,
        "cuda_graphs": cuda_graphs,
        "cuda_graphs_used": last["cuda_graphs_used"],
        "compiled_decode": last["compiled_decode"],
        "shared_prompt": shared_prompt,
        "fused_logprobs": bool(cfg.optim.fused_logprobs),
        "beta": beta,
        "overrides": list(overrides),
        "memory_cap_gib": memory_cap_gib,
        "gradient_checkpointing": gradient_checkpointing,
        "device": device_name(dev),
        "steps": steps,
        "per_step": per_step,
        "step_s": [s["step_s"] for s in per_step],
        "median_step_s": med["step_s"],
        "median": med,
        "peak_memory_gib": last["peak_memory_mb"] / 1024,  # the trainer's own peak_memory_mb metric
        "peak_memory_kind": "cuda max_memory_allocated"
        if dev.type == "cuda"
        else "process peak RSS (ru_maxrss)",
        "peak_reserved_gib": peak_reserved,
        "memory": memory,
        "bounds": bounds,
        "roofline_h100": {
            **roofline,
            "note": "decode-only lower bound for this shape on an H100 SXM (datasheet numbers), "
            f"{dtype_name} weights and KV cache; meaningful beside a measurement on an H100 only",
            "generation_over_bound": med["generation_s"] / roofline["seconds"],
        },
    }


def compare_algos(results: dict[str, dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Ratios of the first algorithm's peak memory and median step time to each other's ("grpo/ppo")."""
    names = list(results)
    first = results[names[0]]
    out = {}
    for name in names[1:]:
        other = results[name]
        peak = other["memory"]["peak_bytes"]
        out[f"{names[0]}/{name}"] = {
            "peak_memory": first["memory"]["peak_bytes"] / peak if peak > 0 else None,
            "step_s": first["median_step_s"] / other["median_step_s"] if other["median_step_s"] else None,
        }
    return out
