"""Training step time: seconds per GRPO step and peak memory, on fixed shapes, optionally beside TRL.

    grpokit bench --shape standard --model-size 0.5b --compare trl
    grpokit bench --shape long --model-size 0.5b --compare trl --json long.json
    grpokit bench --shape tiny --model-size tiny --steps 3          # CPU smoke run

One step is what TRL's ``GRPOTrainer`` does per optimizer step: generate P*G completions, score them,
compute the reference log-probs (beta > 0), then one pass of gradient-accumulated updates over all of
them (one optimizer step). The reported s/step is the median of steps 2..N (step 1 warms up kernels
and allocators), each timed on the wall clock with ``torch.cuda.synchronize()`` on both ends.

The model is randomly initialised (``build_random_model``): speed and memory do not depend on the
weights. A random model almost never emits EOS (probability about 1/vocab per token), so in TRL its
completions run to the full length. We make that exact rather than likely: the bench sets the
trainer's EOS to an id outside the vocabulary, so every completion is exactly ``completion_len``
tokens and both sides do the same amount of work. Prompts are random words of the word-level
tokenizer, exactly ``prompt_len`` tokens each (checked); the reward is a seeded random 0/1.

Precision (``--precision``, grpokit.precision): on a GPU grpokit's default is ``bf16_kahan`` (bfloat16
weights and gradients, AdamW states in bfloat16 plus a Kahan compensation buffer: 10 bytes/param);
float32 on CPU. TRL (1.16) loads a model given by path in float32 unless ``model_init_kwargs["dtype"]``
says otherwise, and ``bf16=True`` runs it under bfloat16 autocast: float32 weights, gradients and AdamW
states (16 bytes/param), which is grpokit's ``--precision bf16_mixed``. Report both: the defaults side
by side, and the same numerics side by side. ``--dtype float32`` gives float32 everything.

Peak memory: ``torch.cuda.max_memory_allocated`` since the trainer was built (model, reference and
optimizer included, as in the TRL anchor); on CPU the process's peak RSS (``ru_maxrss``), which
also counts everything the process did before.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import importlib.util
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpokit.config import KV_CACHES

# ---------------------------------------------------------------------------------------------
# shapes

MODEL_SHAPES: dict[str, dict[str, Any]] = {
    "tiny": dict(
        vocab_size=1024,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    ),
    "60m": dict(  # 63M parameters: weights and optimizer states dominate a CPU step's memory, quickly
        vocab_size=32768,
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=6,
        num_attention_heads=12,
        num_key_value_heads=4,
    ),
    "0.5b": dict(  # Qwen2.5-0.5B's dimensions (494M parameters, tied embeddings)
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
    ),
    "1.5b": dict(  # Qwen2.5-1.5B's dimensions
        vocab_size=151936,
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
    ),
}
"""Qwen2-architecture dimensions of the random models (the same as shared/bench/make_model.py)."""

SPECIAL_TOKENS = ["<pad>", "<eos>", "<bos>"]  # ids 0, 1, 2; word "w{k}" has id k + 3
MAX_WORD = 150_000
"""Prompt words are w5 .. w{min(MAX_WORD, n_words) - 1}, as in the TRL anchor (its --vocab-hi)."""
MODEL_FORMAT = 1  # bump when the builder changes, so cached models are rebuilt


@dataclass(frozen=True)
class BenchShape:
    prompts: int
    """Prompts per step (P)."""
    group_size: int
    """Completions per prompt (G); a step generates P * G completions."""
    prompt_len: int
    """Tokens per prompt, exactly."""
    completion_len: int
    """Tokens per completion, exactly (EOS is never sampled)."""
    micro_batch: int
    """Completions per forward/backward (TRL's per_device_train_batch_size)."""

    @property
    def completions(self) -> int:
        return self.prompts * self.group_size


BENCH_SHAPES: dict[str, BenchShape] = {
    "standard": BenchShape(prompts=32, group_size=8, prompt_len=128, completion_len=256, micro_batch=32),
    "long": BenchShape(prompts=16, group_size=8, prompt_len=128, completion_len=1024, micro_batch=16),
    "tiny": BenchShape(prompts=2, group_size=4, prompt_len=8, completion_len=8, micro_batch=8),
    # A memory shape: 32 rows x 4224 tokens per micro-batch. Full-vocabulary logits for one micro-batch
    # would be 32 * 4224 * 151936 bf16 values (41 GB, twice that with their gradient); grpokit never
    # builds them (chunked log-probs), TRL does.
    "xlong": BenchShape(prompts=16, group_size=8, prompt_len=128, completion_len=4096, micro_batch=32),
}

H100_SXM_MEM_BW = 3.35e12
"""H100 SXM5 80GB HBM3 bandwidth, bytes/s (NVIDIA datasheet)."""
H100_SXM_BF16_FLOPS = 989e12
"""H100 SXM5 dense bfloat16 tensor-core peak, FLOP/s (NVIDIA datasheet; 1979e12 is with sparsity)."""

TIME_KEYS = ("generation", "scoring", "reference", "update")


def cache_root() -> Path:
    """Where built random models are kept: ``$GRPOKIT_CACHE/bench`` or ``~/.cache/grpokit/bench``."""
    return Path(os.environ.get("GRPOKIT_CACHE", Path.home() / ".cache" / "grpokit")) / "bench"


# ---------------------------------------------------------------------------------------------
# the random model


def _build_tokenizer(vocab_size: int):
    """Word-level tokenizer: <pad> <eos> <bos> then words w0, w1, ...; whitespace-split, no network."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = SPECIAL_TOKENS + [f"w{k}" for k in range(vocab_size - len(SPECIAL_TOKENS))]
    backend = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.decoder = decoders.WordPiece(prefix="##")  # joins the words with spaces
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>"
    )
    tok.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    return tok


def build_random_model(shape: str, out_dir: str | Path | None = None, *, seed: int = 0) -> Path:
    """A randomly initialised Qwen2 model of ``shape`` ("tiny", "0.5b", "1.5b") and its word-level
    tokenizer, saved (float32) under ``out_dir`` (default ``cache_root()``) and reused on later calls.

    Returns the model directory. ``tokenizer_config.json`` names ``PreTrainedTokenizerFast`` so that
    ``grpokit.loading.load_tokenizer`` (and the TRL script) load this tokenizer rather than the Qwen2
    byte-level class transformers 5 would substitute.
    """
    if shape not in MODEL_SHAPES:
        raise ValueError(f"unknown model shape {shape!r}; choose one of {list(MODEL_SHAPES)}")
    root = Path(out_dir) if out_dir is not None else cache_root()
    final = root / f"random-qwen2-{shape}-seed{seed}-v{MODEL_FORMAT}"
    if (final / "COMPLETE").is_file():
        return final
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from grpokit.loading import save_local_tokenizer

    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".building-{shape}-", dir=root))
    try:
        dims = MODEL_SHAPES[shape]
        tok = _build_tokenizer(dims["vocab_size"])
        save_local_tokenizer(tok, work)
        config = Qwen2Config(
            **dims,
            tie_word_embeddings=True,
            max_position_embeddings=4096,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
            bos_token_id=tok.bos_token_id,
        )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = Qwen2ForCausalLM(config).to(torch.float32)
        model.generation_config.pad_token_id = tok.pad_token_id
        model.generation_config.eos_token_id = tok.eos_token_id
        model.generation_config.bos_token_id = tok.bos_token_id
        model.save_pretrained(work)
        n_params = sum(p.numel() for p in model.parameters())
        (work / "COMPLETE").write_text(json.dumps({"shape": shape, "seed": seed, "n_params": n_params}))
        del model
        if final.exists():  # an incomplete earlier attempt
            shutil.rmtree(final)
        work.rename(final)
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
    return final


# ---------------------------------------------------------------------------------------------
# the roofline


def decode_roofline(
    n_params: float,
    bytes_per_param: float,
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    batch: int,
    prompt_len: int,
    completion_len: int,
    kv_bytes: float,
    mem_bw_bytes_s: float = H100_SXM_MEM_BW,
    peak_flops: float = H100_SXM_BF16_FLOPS,
) -> dict[str, Any]:
    """Lower bound on the time to decode ``batch`` completions of ``completion_len`` tokens.

    Decode step t (t = 0 .. completion_len - 1) produces one token for every row. It must read all the
    weights once (n_params * bytes_per_param) and every row's KV cache of prompt_len + t positions
    (num_layers * 2 (K and V) * num_kv_heads * head_dim * kv_bytes per position), and it does at
    least 2 * n_params * batch FLOPs (one multiply-add per weight per row). Its time is at least
    max(bytes / mem_bw_bytes_s, flops / peak_flops); the bound sums that over the steps.

    Not counted (so the bound stays a lower bound): the prefill, attention FLOPs, activations, KV
    writes, sampling, kernel launches. Defaults are the H100 SXM datasheet numbers: 3.35e12 B/s HBM3
    and 989e12 dense bfloat16 FLOP/s. ``n_params`` counts tied embeddings once (the LM head reads them).

    Returns seconds, tokens_per_s (batch * completion_len / seconds), memory_s and compute_s (the
    sums of each side alone), weight_bytes_per_step, kv_bytes_total, decode_steps and bound
    ("memory" or "compute": the side that dominates more steps).
    """
    if min(batch, completion_len) < 1 or prompt_len < 0:
        raise ValueError("batch and completion_len must be >= 1 and prompt_len >= 0")
    weight_bytes = n_params * bytes_per_param
    kv_per_position = num_layers * 2 * num_kv_heads * head_dim * kv_bytes
    flops_per_step = 2.0 * n_params * batch
    compute_t = flops_per_step / peak_flops
    seconds = memory_s = kv_total = 0.0
    memory_steps = 0
    for t in range(completion_len):
        kv = batch * (prompt_len + t) * kv_per_position
        mem_t = (weight_bytes + kv) / mem_bw_bytes_s
        seconds += max(mem_t, compute_t)
        memory_s += mem_t
        kv_total += kv
        memory_steps += mem_t >= compute_t
    return {
        "seconds": seconds,
        "tokens_per_s": batch * completion_len / seconds,
        "memory_s": memory_s,
        "compute_s": compute_t * completion_len,
        "weight_bytes_per_step": weight_bytes,
        "kv_bytes_total": kv_total,
        "decode_steps": completion_len,
        "bound": "memory" if 2 * memory_steps >= completion_len else "compute",
        "mem_bw_bytes_s": mem_bw_bytes_s,
        "peak_flops": peak_flops,
    }


# ---------------------------------------------------------------------------------------------
# our side


def _random_prompts(n: int, prompt_len: int, n_words: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    hi = min(MAX_WORD, n_words)
    if hi <= 5:
        raise ValueError(f"the tokenizer has only {n_words} words; the bench needs more than 5")
    return [{"prompt": " ".join(f"w{rng.randrange(5, hi)}" for _ in range(prompt_len))} for _ in range(n)]


def random_reward(seed: int = 0):
    """A seeded random 0/1 reward with TRL's signature (the same for every call pattern)."""
    rng = random.Random(seed)

    def random_01(prompts, completions, **columns) -> list[float]:
        return [float(rng.random() < 0.5) for _ in completions]

    return random_01


def _device_name(device) -> str:
    import torch

    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    return f"cpu ({torch.get_num_threads()} threads)"


def _peak_memory_gib(device) -> tuple[float, str]:
    from grpokit.update import peak_memory_mb  # the trainer's own peak_memory_mb metric

    kind = "cuda max_memory_allocated" if device.type == "cuda" else "process peak RSS (ru_maxrss)"
    return peak_memory_mb(device) / 1024, kind


def _median(values: list[float]) -> float:
    return float(statistics.median_high(values))  # sorted[n // 2], as the TRL anchor script


def _n_words(tokenizer) -> int:
    return sum(1 for w in tokenizer.get_vocab() if w[:1] == "w" and w[1:].isdigit())


def run_bench(
    model_dir: str | Path,
    shape: str | BenchShape,
    *,
    steps: int,
    beta: float = 0.04,
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
) -> dict[str, Any]:
    """Run ``steps`` GRPO steps of ``shape`` on the model in ``model_dir`` and time them.

    Settings as in the TRL anchor: AdamW lr 1e-6, temperature 1 (no top-k/top-p), beta, grpo loss
    (seq-mean-token-mean, clip 0.2, k3 KL), one optimizer step per rollout, micro-batches of
    ``shape.micro_batch``. ``full_length`` forces every completion to ``completion_len`` tokens.

    Returns a dict: per_step (list of per-step dicts), step_s (list), median_step_s, median (of each
    time split, tokens/s), peak_memory_gib and how it was measured, shape, device, dtype, n_params,
    and a decode roofline for this shape on an H100 SXM. Medians are over steps 2..N (step 1 alone
    when steps == 1).
    """
    import torch

    from grpokit.config import load_config
    from grpokit.trainer import GRPOTrainer

    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    shape_name = shape if isinstance(shape, str) else "custom"
    if isinstance(shape, str):
        if shape not in BENCH_SHAPES:
            raise ValueError(f"unknown bench shape {shape!r}; choose one of {list(BENCH_SHAPES)}")
        shape = BENCH_SHAPES[shape]
    if shape.completions % shape.micro_batch:
        raise ValueError(
            f"micro_batch {shape.micro_batch} must divide the {shape.completions} completions of a step"
        )
    tmp = None
    if output_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="grpokit-bench-")
        output_dir = tmp.name

    from grpokit.loading import load_tokenizer

    n_words = _n_words(load_tokenizer(str(model_dir)))
    rows = _random_prompts(shape.prompts * steps, shape.prompt_len, n_words, seed)
    cfg = load_config(
        None,
        [
            f"model.dtype={dtype}",
            f"optim.precision={precision}",
            f"model.device={device}",
            f"model.gradient_checkpointing={str(gradient_checkpointing).lower()}",
            "data.template=plain",
            f"data.max_prompt_tokens={shape.prompt_len}",
            "data.shuffle=false",
            f"rollout.group_size={shape.group_size}",
            f"rollout.prompts_per_step={shape.prompts}",
            f"rollout.max_new_tokens={shape.completion_len}",
            "rollout.temperature=1.0",
            "rollout.top_p=1.0",
            "rollout.top_k=0",
            f"rollout.engine={engine}",
            f"rollout.kv_cache={kv_cache}",
            f"rollout.cuda_graphs={str(cuda_graphs).lower()}",
            "algo.preset=grpo",
            f"algo.beta={beta}",
            "optim.lr=1e-6",
            "optim.epochs=1",
            "optim.mini_batches=1",
            f"optim.micro_batch_size={shape.micro_batch}",
            f"train.steps={steps}",
            f"train.seed={seed}",
            "train.samples_every=0",
            "train.tensorboard=false",
            "eval.enabled=false",
        ],
    )
    cfg.model.name_or_path = str(model_dir)  # set directly: a path is not parsed as YAML
    cfg.train.output_dir = str(output_dir)
    try:
        trainer = GRPOTrainer(cfg, train_rows=rows, reward_functions=[("random", random_reward(seed), 1.0)])
        lengths = {len(ids) for ids in trainer.encoded}
        if lengths != {shape.prompt_len}:
            raise ValueError(
                f"prompts encode to {sorted(lengths)} tokens, not exactly {shape.prompt_len}: the bench needs "
                "a word-level tokenizer with words w0, w1, ... (use build_random_model or --model-size)"
            )
        model = trainer.model
        vocab = int(model.get_output_embeddings().weight.shape[0])
        if full_length:
            # no sampled id can equal `vocab`: no completion ends before completion_len tokens
            trainer.eos_ids = [vocab]
        dev = trainer.device
        cuda = dev.type == "cuda"
        if cuda:
            torch.cuda.synchronize(dev)
            torch.cuda.reset_peak_memory_stats(dev)
        per_step = []
        for i in range(steps):
            if cuda:
                torch.cuda.synchronize(dev)
            t0 = time.perf_counter()
            m = trainer.train_step()
            if cuda:
                torch.cuda.synchronize(dev)
            wall = time.perf_counter() - t0
            splits = {f"{k}_s": float(m.get(f"time/{k}", 0.0)) for k in TIME_KEYS}
            tokens = float(m["completion_len/mean"]) * shape.completions
            per_step.append(
                {
                    "step": i + 1,
                    "step_s": wall,
                    **splits,
                    "other_s": wall - sum(splits.values()),
                    "tokens_per_s": tokens / wall,
                    "generation_tokens_per_s": tokens / splits["generation_s"]
                    if splits["generation_s"] > 0
                    else 0.0,
                    "completion_len_mean": float(m["completion_len/mean"]),
                    "truncated_frac": float(m["truncated_frac"]),
                    "peak_memory_mb": float(m["peak_memory_mb"]),
                }
            )
        decode_engine = getattr(trainer.generator, "stats", {}).get("engine", engine)
        graphs_used = bool(getattr(getattr(trainer.generator, "engine", None), "use_graphs", False))
        peak_gib, peak_kind = _peak_memory_gib(dev)
        peak_reserved = torch.cuda.max_memory_reserved(dev) / 2**30 if cuda else None
        config = model.config
        n_params = sum(p.numel() for p in model.parameters())
        param_bytes = next(model.parameters()).element_size()
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        dtype_name = str(next(model.parameters()).dtype).replace("torch.", "")
        mode = trainer.precision
        device_name = _device_name(dev)
        roofline = decode_roofline(
            n_params,
            param_bytes,
            config.num_hidden_layers,
            config.num_key_value_heads,
            head_dim,
            shape.completions,
            shape.prompt_len,
            shape.completion_len,
            param_bytes,
        )
    finally:
        trainer = model = None  # noqa: F841  (free the GPU before a TRL run in this process's shadow)
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        if tmp is not None:
            tmp.cleanup()

    timed = per_step[1:] if steps > 1 else per_step
    median = {
        k: _median([s[k] for s in timed]) for k in ("step_s", *(f"{k}_s" for k in TIME_KEYS), "other_s")
    }
    median["tokens_per_s"] = _median([s["tokens_per_s"] for s in timed])
    median["generation_tokens_per_s"] = _median([s["generation_tokens_per_s"] for s in timed])
    import transformers

    import grpokit

    return {
        "system": "grpokit",
        "version": getattr(grpokit, "__version__", "?"),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "date": datetime.date.today().isoformat(),
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
        "cuda_graphs_used": graphs_used,
        "beta": beta,
        "gradient_checkpointing": gradient_checkpointing,
        "device": device_name,
        "steps": steps,
        "per_step": per_step,
        "step_s": [s["step_s"] for s in per_step],
        "median_step_s": median["step_s"],
        "median": median,
        "peak_memory_gib": peak_gib,
        "peak_memory_kind": peak_kind,
        "peak_reserved_gib": peak_reserved,
        "roofline_h100": {
            **roofline,
            "note": "decode-only lower bound for this shape on an H100 SXM (datasheet numbers), "
            f"{dtype_name} weights and KV cache; meaningful beside a measurement on an H100 only",
            "generation_over_bound": median["generation_s"] / roofline["seconds"],
        },
    }


# ---------------------------------------------------------------------------------------------
# TRL's side (a subprocess)

TRL_SCRIPT = r'''"""TRL GRPOTrainer on a bench shape (grpokit's copy of the side-by-side anchor script):
seconds per optimizer step and peak GPU memory; prints one RESULT {json} line."""
import argparse, json, random, time

import torch
from datasets import Dataset
from transformers import PreTrainedTokenizerFast, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

ap = argparse.ArgumentParser()
ap.add_argument("model")
ap.add_argument("--prompts", type=int, default=32)
ap.add_argument("--G", type=int, default=8)
ap.add_argument("--prompt-len", type=int, default=128)
ap.add_argument("--completion-len", type=int, default=256)
ap.add_argument("--steps", type=int, default=4)
ap.add_argument("--micro", type=int, default=32)
ap.add_argument("--beta", type=float, default=0.04)
ap.add_argument("--vocab-hi", type=int, default=150000)
a = ap.parse_args()
random.seed(0)
rows = [
    {"prompt": " ".join(f"w{random.randrange(5, a.vocab_hi)}" for _ in range(a.prompt_len))}
    for _ in range(a.prompts * (a.steps + 1))
]


def rand_reward(completions, **kw):
    return [float(random.random() < 0.5) for _ in completions]


class Timer(TrainerCallback):
    def __init__(self):
        self.t = [time.perf_counter()]

    def on_step_end(self, args, state, control, **kw):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.t.append(time.perf_counter())


cuda = torch.cuda.is_available()
gen_batch = a.prompts * a.G
cfg = GRPOConfig(
    output_dir="/tmp/trl_out", per_device_train_batch_size=a.micro, gradient_accumulation_steps=gen_batch // a.micro,
    num_generations=a.G, max_completion_length=a.completion_len, max_steps=a.steps, logging_steps=1,
    learning_rate=1e-6, beta=a.beta, report_to=[], save_strategy="no", bf16=cuda, use_cpu=not cuda,
    temperature=1.0, gradient_checkpointing=True, loss_type="grpo",
)
timer = Timer()
trainer = GRPOTrainer(
    model=a.model, reward_funcs=rand_reward, args=cfg, train_dataset=Dataset.from_list(rows), callbacks=[timer],
    processing_class=PreTrainedTokenizerFast.from_pretrained(a.model),
)
if cuda:
    torch.cuda.reset_peak_memory_stats()
trainer.train()
steps = [b - a_ for a_, b in zip(timer.t, timer.t[1:])]
later = sorted(steps[1:])
out = dict(
    system="trl", trl_version=__import__("trl").__version__, step_s=steps,
    median_step_s=later[len(later) // 2] if later else steps[0],
    peak_alloc_gib=torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
    peak_reserved_gib=torch.cuda.max_memory_reserved() / 2**30 if cuda else None,
    completions_per_step=gen_batch, completion_len=a.completion_len, prompt_len=a.prompt_len,
)
print("RESULT", json.dumps(out))
'''


class BenchError(RuntimeError):
    """The bench cannot run as asked; the message says why and what to do."""


def _module_missing(name: str) -> bool:
    if name in sys.modules:
        return sys.modules[name] is None  # None there means "import blocked"
    try:
        return importlib.util.find_spec(name) is None
    except (ImportError, ValueError):
        return True


def check_trl(python: str | None = None) -> None:
    """Raise BenchError naming the missing package when TRL's side cannot run."""
    needed = ("trl", "datasets")
    # compared without resolving links: a virtual environment's python links to the base interpreter
    if python is None or os.path.abspath(python) == os.path.abspath(sys.executable):
        missing = [n for n in needed if _module_missing(n)]
        where = "this Python"
    else:
        code = "import importlib.util as u, sys; print(' '.join(n for n in sys.argv[1:] if u.find_spec(n) is None))"
        try:
            out = subprocess.run(
                [python, "-c", code, *needed], capture_output=True, text=True, check=True
            ).stdout
        except (OSError, subprocess.CalledProcessError) as e:
            raise BenchError(f"--trl-python {python}: cannot run it ({e})") from e
        missing = out.split()
        where = python
    if missing:
        raise BenchError(
            f"--compare trl needs the {' and '.join(repr(m) for m in missing)} package"
            f"{'s' if len(missing) > 1 else ''}, not importable by {where}: "
            "pip install 'grpokit[trl]' (or pip install trl datasets), or point --trl-python at a "
            "Python that has them."
        )


def find_trl_script(path: str | Path | None = None) -> tuple[Path, str]:
    """The TRL script to run and where it came from: PATH, the shared anchor script
    (``../shared/bench/trl_bench.py`` beside the repository, or ``shared/bench/`` inside it), or
    grpokit's own equivalent (``TRL_SCRIPT``) written to a temporary file."""
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise BenchError(f"--trl-script {p}: no such file")
        return p, "given"
    repo = Path(__file__).resolve().parents[1]
    for candidate in (
        repo.parent / "shared" / "bench" / "trl_bench.py",
        repo / "shared" / "bench" / "trl_bench.py",
    ):
        if candidate.is_file():
            return candidate, "shared anchor"
    fd, name = tempfile.mkstemp(prefix="grpokit_trl_bench_", suffix=".py")
    with os.fdopen(fd, "w") as f:
        f.write(TRL_SCRIPT)
    return Path(name), "grpokit.bench.TRL_SCRIPT"


def parse_result_line(text: str) -> dict[str, Any]:
    """The JSON of the last ``RESULT {json}`` line in ``text``."""
    for line in reversed(text.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise BenchError("no 'RESULT {json}' line in the output")


OOM_MARKERS = re.compile(r"OutOfMemoryError|CUDA out of memory|out of memory", re.IGNORECASE)


def run_trl(
    model_dir: str | Path,
    shape: str | BenchShape,
    *,
    steps: int,
    beta: float = 0.04,
    script: str | Path | None = None,
    python: str | None = None,
    timeout_s: float | None = None,
) -> dict[str, Any]:
    """Run TRL's GRPOTrainer on the same model and shape in a subprocess; its RESULT dict.

    When the run dies of out-of-memory, the result says so (``out_of_memory: True``) instead of raising."""
    from grpokit.loading import load_tokenizer

    shape = BENCH_SHAPES[shape] if isinstance(shape, str) else shape
    check_trl(python)
    path, origin = find_trl_script(script)
    vocab_hi = min(MAX_WORD, _n_words(load_tokenizer(str(model_dir))))
    cmd = [
        python or sys.executable,
        str(path),
        str(model_dir),
        *("--prompts", str(shape.prompts), "--G", str(shape.group_size)),
        *("--prompt-len", str(shape.prompt_len), "--completion-len", str(shape.completion_len)),
        *("--steps", str(steps), "--micro", str(shape.micro_batch)),
        *("--beta", str(beta), "--vocab-hi", str(vocab_hi)),
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    finally:
        if origin == "grpokit.bench.TRL_SCRIPT":
            path.unlink(missing_ok=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).splitlines()[-25:])
        if OOM_MARKERS.search(proc.stderr or "") or OOM_MARKERS.search(proc.stdout or ""):
            # A result, not a failure: TRL does not fit this shape on this device.
            return {
                "system": "trl",
                "out_of_memory": True,
                "median_step_s": None,
                "peak_alloc_gib": None,
                "error_tail": tail,
                "trl_script": f"{path} ({origin})",
            }
        raise BenchError(f"the TRL run failed (exit {proc.returncode}): {' '.join(cmd)}\n{tail}")
    result = parse_result_line(proc.stdout)
    result["trl_script"] = f"{path} ({origin})"
    return result


def compare(ours: dict[str, Any], trl: dict[str, Any]) -> dict[str, Any]:
    """Ratios grpokit / TRL (below 1: grpokit is faster or smaller)."""
    ratio_step = ours["median_step_s"] / trl["median_step_s"] if trl.get("median_step_s") else None
    trl_peak = trl.get("peak_alloc_gib")
    ours_gpu = ours["peak_memory_kind"].startswith("cuda")
    ratio_mem = ours["peak_memory_gib"] / trl_peak if trl_peak and ours_gpu else None
    return {
        "trl": trl,
        "step_s_ratio": ratio_step,
        "speedup": 1 / ratio_step if ratio_step else None,
        "peak_memory_ratio": ratio_mem,
        "trl_out_of_memory": bool(trl.get("out_of_memory")),
    }


# ---------------------------------------------------------------------------------------------
# command line


def _fmt(value: float | None, unit: str = "", digits: int = 3) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}g}{unit}"


def print_table(result: dict[str, Any], file=None) -> None:
    from rich.console import Console
    from rich.table import Table

    med = result["median"]
    cmp = result.get("compare")
    trl = cmp["trl"] if cmp else None
    caption = (
        f"{result['completions_per_step']} completions/step, prompt {result['prompt_len']}, completion "
        f"{result['completion_len']} tokens; {result['n_params'] / 1e6:.1f}M params, "
        f"precision {result.get('precision', '?')} ({result['dtype']} weights, "
        f"{result.get('bytes_per_param', '?')} bytes/param for weights+grads+AdamW), "
        f"{result['device']}; decode: {result.get('decode_engine', '?')} KV cache"
        f"{' + CUDA graphs' if result.get('cuda_graphs_used') else ''}"
        f"; median of steps 2..{result['steps']}"
    )
    table = Table(title=f"grpokit bench: shape {result['shape']}", caption=caption)
    table.add_column("")
    table.add_column("grpokit", justify="right")
    if trl:
        table.add_column(f"TRL {trl.get('trl_version', '')}", justify="right")
        table.add_column("grpokit / TRL", justify="right")
    rows = [("s/step", med["step_s"], trl and trl.get("median_step_s"), cmp and cmp["step_s_ratio"])]
    for k in TIME_KEYS + ("other",):
        rows.append((f"  {k} s", med[f"{k}_s"], None, None))
    rows.append(("completion tokens/s", med["tokens_per_s"], None, None))
    rows.append(("  during generation", med["generation_tokens_per_s"], None, None))
    peak = result["peak_memory_gib"]
    rows.append(
        (
            f"peak memory GiB ({result['peak_memory_kind']})",
            peak,
            trl and trl.get("peak_alloc_gib"),
            cmp and cmp["peak_memory_ratio"],
        )
    )
    roof = result["roofline_h100"]
    rows.append(("H100 decode bound s", roof["seconds"], None, None))
    oom = bool(trl and trl.get("out_of_memory"))
    for name, ours, theirs, ratio in rows:
        cells = [name, _fmt(ours)]
        if trl:
            headline = name == "s/step" or name.startswith("peak")
            shown = "out of memory" if oom and headline else _fmt(theirs)
            cells += [shown, _fmt(ratio, "x")]
        table.add_row(*cells)
    Console(file=file or sys.stdout, width=max(100, shutil.get_terminal_size().columns)).print(table)


def cmd_bench(args: argparse.Namespace) -> int:
    def fail(message: str, code: int = 2) -> int:
        print(f"grpokit bench: {message}", file=sys.stderr)
        return code

    if args.steps < 1:
        return fail(f"--steps must be >= 1, got {args.steps}")
    try:
        if args.compare == "trl":
            check_trl(args.trl_python)  # before spending minutes on our side
            if args.trl_script is not None and not Path(args.trl_script).is_file():
                return fail(f"--trl-script {args.trl_script}: no such file")
        if args.model_dir:
            model_dir = Path(args.model_dir)
            if not (model_dir / "config.json").is_file():
                return fail(f"--model-dir {model_dir}: no config.json there")
        else:
            size = args.model_size or ("tiny" if args.shape == "tiny" else "0.5b")
            print(f"grpokit bench: random {size} model in {args.cache_dir or cache_root()}", file=sys.stderr)
            model_dir = build_random_model(size, args.cache_dir)
        result = run_bench(
            model_dir,
            args.shape,
            steps=args.steps,
            beta=args.beta,
            gradient_checkpointing=args.gradient_checkpointing,
            dtype=args.dtype,
            precision=args.precision,
            engine=args.engine,
            kv_cache=args.kv_cache,
            cuda_graphs=args.cuda_graphs,
            output_dir=args.output_dir,
            device=args.device,
        )
        if args.compare == "trl":
            print("grpokit bench: running TRL's GRPOTrainer on the same shape (subprocess)", file=sys.stderr)
            trl = run_trl(
                model_dir,
                args.shape,
                steps=args.steps,
                beta=args.beta,
                script=args.trl_script,
                python=args.trl_python,
            )
            result["compare"] = compare(result, trl)
    except BenchError as e:
        return fail(str(e))
    except ValueError as e:
        return fail(str(e))
    print_table(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    print("RESULT " + json.dumps(result), flush=True)
    return 0


def add_bench_parser(subparsers) -> None:
    """Register ``grpokit bench`` on an ``argparse`` subparsers object."""
    p = subparsers.add_parser(
        "bench",
        help="seconds per GRPO step and peak memory on a fixed shape (optionally beside TRL)",
        description=(
            "Time GRPO training steps of a randomly initialised Qwen2 model on a fixed shape "
            f"({', '.join(f'{k}: {v.prompts}x{v.group_size}, prompt {v.prompt_len}, completion {v.completion_len}' for k, v in BENCH_SHAPES.items())}). "
            "Completions always run to the full length. Prints a table and one 'RESULT {json}' line."
        ),
    )
    p.add_argument("--shape", choices=list(BENCH_SHAPES), default="standard")
    which = p.add_mutually_exclusive_group()
    which.add_argument(
        "--model-size",
        choices=list(MODEL_SHAPES),
        help="random model to build/reuse (default: tiny for --shape tiny, else 0.5b)",
    )
    which.add_argument(
        "--model-dir",
        help="a model directory with a word-level w0 w1 ... tokenizer (e.g. from make_model.py)",
    )
    p.add_argument(
        "--steps", type=int, default=4, help="steps to run; the median is over steps 2..N (default 4)"
    )
    p.add_argument(
        "--compare", choices=["trl"], help="also run TRL's GRPOTrainer on the same model and shape"
    )
    p.add_argument(
        "--trl-script",
        help="TRL script printing 'RESULT {json}' (default: shared/bench/trl_bench.py if found, else built in)",
    )
    p.add_argument("--trl-python", help="Python interpreter for the TRL run (default: this one)")
    p.add_argument("--json", help="also write the result to this JSON file")
    p.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], default="auto")
    p.add_argument(
        "--precision",
        choices=["auto", "fp32", "bf16_mixed", "fp16_mixed", "bf16_kahan", "bf16_pure"],
        default="auto",
        help="optim.precision (grpokit.precision); bf16_mixed is what TRL's bf16=True does",
    )
    p.add_argument("--engine", choices=["fast", "hf"], default="fast")
    p.add_argument("--kv-cache", choices=KV_CACHES, default="auto", help="fast engine's KV cache")
    p.add_argument("--no-cuda-graphs", dest="cuda_graphs", action="store_false")
    p.add_argument("--device", default="auto")
    p.add_argument("--beta", type=float, default=0.04)
    p.add_argument("--no-gradient-checkpointing", dest="gradient_checkpointing", action="store_false")
    p.add_argument(
        "--cache-dir", help="where random models are built and kept (default $GRPOKIT_CACHE/bench)"
    )
    p.add_argument("--output-dir", help="trainer output directory (default: a temporary one)")
    p.set_defaults(func=cmd_bench)


def main(argv: list[str] | None = None) -> int:
    """``python -m grpokit.bench ARGS`` is ``grpokit bench ARGS``."""
    parser = argparse.ArgumentParser(prog="grpokit")
    add_bench_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
