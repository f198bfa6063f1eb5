"""``grpokit bench --plan MODEL_CONFIG --memory-gib N``: which settings fit a GPU of N GiB, by role.

A prediction, not a measurement: the bytes of each role from the model's config.json and the settings,
with the activations' per-token constant calibrated on the CPU measurements of ``grpokit bench --memory``
(grpokit.bench.update_memory; tests/unit/bench/test_plan.py holds the prediction within 15% of them).

Roles of the update's peak (the backward pass of its largest micro-batch):

    weights       parameters x bytes of the precision mode's weight dtype (grpokit.model.precision)
    gradients     trainable parameters x the same bytes
    optimizer     AdamW's states (fp32: 8 B/param; bf16_kahan: 6, with the Kahan buffer; bf16_pure: 4);
                  0 on the GPU with optim.offload_optimizer (they live in CPU memory)
    reference     a frozen copy of the weights when algo.beta > 0 without LoRA; 0 with offload_reference
                  (it is on the GPU only during its own pass, when no gradient exists)
    activations   the largest micro-batch: with gradient checkpointing each layer's input
                  (positions x hidden x layers) plus one layer recomputed (positions x ACT_PER_POSITION);
                  positions = rows x the longest row padded, the real tokens packed; plus the LM head's
                  chunk (logprob_chunk_size x vocabulary x LOGITS_COPIES x 4 B)
    teacher       on-policy distillation's frozen teacher (grpokit.train.teacher), resident the whole run: its
                  parameters x the bytes of its dtype (teacher.dtype; auto: the policy's weight dtype)
    kv cache      the sampler's, during generation: rows x (prompt + completion) x layers x 2 x kv heads x
                  head dim x bytes; freed before the update when the update would not fit beside it

The peak is the larger of generation (weights, optimizer, reference, teacher, KV cache) and the update (weights,
gradients, optimizer, reference, teacher, activations).

On the CPU (device "cpu", the bench's own measurement) the activations are the layers' saved inputs plus the
larger of one recomputed layer (CPU_LAYER_SCALE of the GPU model's) and the LM-head chunk's two logits blocks (the
head's backward is over before the first layer is recomputed), plus CPU_REST_BYTES: fitted on the long-tail
batch's padded and packed runs, within 3% of short-8's. The GPU keeps the additive model above (within 11%
of the H200's 1.5B run, 7-15% of the H100's); one model for both is not found yet. On the CPU (the bench's measurement) the update's optimizer
step can be larger still: torch's for-loop AdamW (fused on CUDA only) makes two out-of-place copies of
each parameter in turn while the gradients are alive, the largest (the embedding) setting that phase.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

ACT_HIDDEN = 26.0
"""Values saved per position and hidden unit by one recomputed decoder layer during its backward pass
(norms, q/k/v/o, residuals, their gradients); calibrated on the CPU (module docstring)."""
ACT_INTERMEDIATE = 7.0
"""The same per unit of the MLP's intermediate size (gate, up, their product, the gradients)."""
LOGITS_COPIES = 3.0
"""float32 copies of a (chunk, vocabulary) logits block alive at once in the LM head's backward."""

CPU_LAYER_SCALE = 0.6194
"""On the CPU: one recomputed decoder layer's bytes per token position over the GPU model's (ACT_HIDDEN,
ACT_INTERMEDIATE): 142,066 of 229,376 bytes in float32 at Qwen2.5-0.5B's widths, fitted on grpokit bench
--memory --batch long-tail-16's padded run (2026-11-28, 15,040 positions)."""
CPU_LOGITS_BLOCKS = 2
"""On the CPU: (chunk, vocabulary) float32 blocks alive in an LM-head chunk's backward (its logits and their
gradient; tests/unit/model/test_logits_memory.py counts them)."""
CPU_REST_BYTES = int(0.29 * 2**30)
"""On the CPU: what a process holds beyond the roles and activations (modules, Python objects, allocator
slack), fitted on the same run's packed variant."""

WEIGHT_BYTES = {"fp32": 4, "bf16_mixed": 4, "fp16_mixed": 4, "bf16_kahan": 2, "bf16_pure": 2}
COMPUTE_BYTES = {"fp32": 4, "bf16_mixed": 2, "fp16_mixed": 2, "bf16_kahan": 2, "bf16_pure": 2}
OPTIMIZER_BYTES = {"fp32": 8, "bf16_mixed": 8, "fp16_mixed": 8, "bf16_kahan": 6, "bf16_pure": 4}


DIM_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
"""The config.json fields the plan reads; each a whole number >= 1 (num_key_value_heads and head_dim too, when given)."""


def _whole(c: dict[str, Any], key: str) -> int:
    """``c[key]`` as a whole number >= 1, else ValueError naming the field and its value."""
    value = c[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{key} is {value!r}, not a whole number >= 1")
    return value


@dataclass(frozen=True)
class ModelDims:
    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    tied: bool

    @classmethod
    def from_dict(cls, c: dict[str, Any]) -> ModelDims:
        """The dimensions of a transformers config.json; ValueError naming the field for one that is missing,
        not a whole number >= 1 (a string, a bool, 0, a negative) or inconsistent (hidden_size not a multiple
        of num_attention_heads without a head_dim; num_key_value_heads not dividing num_attention_heads)."""
        if not isinstance(c, dict):
            raise ValueError(f"expected a mapping of fields, got {type(c).__name__}")
        dims = {}
        for key in DIM_FIELDS:
            if key not in c:
                raise ValueError(f"no field {key!r}")
            dims[key] = _whole(c, key)
        heads = dims["num_attention_heads"]
        kv_heads = _whole(c, "num_key_value_heads") if c.get("num_key_value_heads") is not None else heads
        if c.get("head_dim") is not None:
            head_dim = _whole(c, "head_dim")
        elif dims["hidden_size"] % heads:
            raise ValueError(
                f"hidden_size {dims['hidden_size']} is not a multiple of num_attention_heads {heads} and no "
                "head_dim is given"
            )
        else:
            head_dim = dims["hidden_size"] // heads
        if heads % kv_heads:
            raise ValueError(f"num_key_value_heads {kv_heads} does not divide num_attention_heads {heads}")
        return cls(
            vocab=dims["vocab_size"],
            hidden=dims["hidden_size"],
            intermediate=dims["intermediate_size"],
            layers=dims["num_hidden_layers"],
            heads=heads,
            kv_heads=kv_heads,
            head_dim=head_dim,
            tied=bool(c.get("tie_word_embeddings", False)),
        )

    @classmethod
    def from_file(cls, path: str | Path) -> ModelDims:
        p = Path(path)
        p = p / "config.json" if p.is_dir() else p
        try:
            return cls.from_dict(json.loads(p.read_text()))
        except (OSError, ValueError) as e:
            raise ValueError(
                f"--plan {path}: not a transformers config.json of a decoder ({e}); give the config.json of the "
                "model to plan for (or its folder)"
            ) from None

    @property
    def params(self) -> int:
        """Qwen2/Llama-style decoder: embeddings, attention (q, o: H x H; k, v: H x kv), MLP (3 x H x I),
        two norms a layer, q/k/v biases (Qwen2), the final norm and, untied, the LM head."""
        h, kv = self.hidden, self.kv_heads * self.head_dim
        attn = h * self.heads * self.head_dim * 2 + h * kv * 2 + self.heads * self.head_dim + 2 * kv
        layer = attn + 3 * h * self.intermediate + 2 * h
        return self.vocab * h * (1 if self.tied else 2) + self.layers * layer + h


@dataclass(frozen=True)
class Settings:
    precision: str = "bf16_kahan"
    lora: bool = False
    lora_params: int = 0
    beta: float = 0.0
    packing: bool = False
    micro_batch_rows: int | None = None  # padded: rows per micro-batch (None: every row at once)
    micro_batch_tokens: int | None = None  # packed: token budget (None: every row at once)
    gradient_checkpointing: bool = True
    offload_optimizer: bool = False
    offload_reference: bool = False
    logprob_chunk_size: int = 1024
    teacher_params: int = 0  # on-policy distillation's teacher (algo.teacher_kl_coef > 0); 0: none
    teacher_bytes: int | None = None  # bytes a teacher parameter (teacher.dtype); None: the policy's

    @classmethod
    def from_config(cls, cfg, *, beta: float) -> Settings:
        """The settings of a resolved grpokit config (precision auto read as fp32 on the CPU)."""
        o = cfg.optim
        precision = o.precision if o.precision != "auto" else "fp32"
        return cls(
            precision=precision,
            lora=cfg.lora.enabled,
            beta=beta,
            packing=o.packing,
            micro_batch_rows=o.micro_batch_size if isinstance(o.micro_batch_size, int) else None,
            micro_batch_tokens=o.micro_batch_tokens if isinstance(o.micro_batch_tokens, int) else None,
            gradient_checkpointing=cfg.model.gradient_checkpointing,
            offload_optimizer=o.offload_optimizer,
            offload_reference=o.offload_reference,
            logprob_chunk_size=o.logprob_chunk_size,
        )


def largest_micro_batch(lengths: list[int], s: Settings, prompt_lengths: list[int] | None = None) -> int:
    """Token positions of the largest micro-batch the update runs: rows sorted by length, then cut as
    learner.MicroBatchSize cuts them (packed: the real tokens; padded: rows x the longest row, or with
    ``prompt_lengths`` (row by row, the prompts within ``lengths``) rows x (the longest prompt + the longest
    completion), since prompts are left-padded and completions right-padded each to their own longest)."""
    if prompt_lengths is not None and not s.packing:
        rows = sorted(zip(lengths, prompt_lengths), key=lambda row: row[0])  # stable, as length_sorted
        size = s.micro_batch_rows or len(rows)
        return max(
            len(part) * (max(p for _, p in part) + max(n - p for n, p in part))
            for part in (rows[i : i + size] for i in range(0, len(rows), size))
        )
    order = sorted(lengths)
    if s.packing:
        budget = s.micro_batch_tokens or sum(order)
        best = used = 0
        for n in order:
            used = used + n if used and used + n <= budget else n
            best = max(best, used)
        return best
    rows = s.micro_batch_rows or len(order)
    return max(len(order[i : i + rows]) * max(order[i : i + rows]) for i in range(0, len(order), rows))


def predict(
    dims: ModelDims,
    s: Settings,
    lengths: list[int],
    *,
    device: str = "cuda",
    scored: int | None = None,
    prompt_lengths: list[int] | None = None,
) -> dict[str, Any]:
    """Bytes by role and the peak for rows of ``lengths`` real tokens (prompt + completion) each.
    ``scored``: the completion tokens of the largest micro-batch, when fewer than a logits chunk.
    ``prompt_lengths``: each row's prompt, when prompts differ in length (largest_micro_batch).
    device "cpu": the bench's CPU measurement (no KV cache: the update alone)."""
    p = dims.params
    wb, cb = WEIGHT_BYTES[s.precision], COMPUTE_BYTES[s.precision]
    trainable = s.lora_params if s.lora else p
    positions = largest_micro_batch(lengths, s, prompt_lengths)
    per_position = cb * (ACT_HIDDEN * dims.hidden + ACT_INTERMEDIATE * dims.intermediate)  # one layer
    saved_inputs = cb * dims.hidden * dims.layers if s.gradient_checkpointing else 0
    layers_live = 1 if s.gradient_checkpointing else dims.layers
    chunk = s.logprob_chunk_size if scored is None else min(scored, s.logprob_chunk_size)
    logits = chunk * dims.vocab * 4 * LOGITS_COPIES
    activations = positions * (per_position * layers_live + saved_inputs) + logits
    rest = 0
    if device == "cpu":  # the CPU model (module docstring): the LM head's backward ends before a layer is recomputed
        rest = CPU_REST_BYTES
        layer = positions * per_position * CPU_LAYER_SCALE * layers_live
        activations = positions * saved_inputs + max(layer, chunk * dims.vocab * 4 * CPU_LOGITS_BLOCKS) + rest
    roles = {
        "policy_weights": p * wb,
        "policy_gradients": trainable * wb,
        "policy_optimizer": 0 if s.offload_optimizer else trainable * OPTIMIZER_BYTES[s.precision],
        "reference_model": p * wb if s.beta > 0 and not s.lora and not s.offload_reference else 0,
        "teacher_model": s.teacher_params * (s.teacher_bytes or wb),
        "activations": int(activations),
    }
    update_peak = sum(roles.values())
    # the optimizer step, gradients alive and activations gone: off CUDA torch's AdamW runs its for-loop
    # form, whose sqrt(v) and division by the bias correction are two out-of-place copies of each parameter
    # in turn, the largest one's at the peak (measured: 1.01 GiB on the 151,936 x 896 embedding, 0 fused)
    step_copies = 2 * largest_trainable(dims, s) * wb if device == "cpu" and s.precision in CPU_FOR_LOOP_ADAMW else 0
    step_peak = sum(v for k, v in roles.items() if k != "activations") + step_copies + rest
    update_peak = max(update_peak, step_peak)
    kv = 0
    if device != "cpu":
        kv = sum(lengths) * dims.layers * 2 * dims.kv_heads * dims.head_dim * cb
        roles["kv_cache"] = kv
    gen_peak = roles["policy_weights"] + roles["policy_optimizer"] + roles["reference_model"] + kv
    gen_peak += roles["teacher_model"]
    return {
        "roles": roles,
        "largest_micro_batch_positions": positions,
        "optimizer_step_peak_bytes": step_peak,
        "update_peak_bytes": update_peak,
        "generation_peak_bytes": gen_peak,
        "peak_bytes": update_peak if device == "cpu" else max(update_peak, gen_peak),
    }


CPU_FOR_LOOP_ADAMW = ("fp32", "bf16_mixed", "fp16_mixed", "bf16_pure")
"""Precision modes stepped by torch's AdamW (fused on CUDA only); bf16_kahan's torch-optimi is not modelled."""


def largest_trainable(dims: ModelDims, s: Settings) -> int:
    """Elements of the largest trainable parameter: the embedding (vocabulary x hidden) or the MLP's matrix;
    under LoRA an adapter's (taken as nothing beside the others)."""
    if s.lora:
        return 0
    return max(dims.vocab * dims.hidden, dims.hidden * dims.intermediate)


CANDIDATES: dict[str, dict[str, Any]] = {
    "full bf16_kahan, padded (32 rows a micro-batch)": dict(precision="bf16_kahan", micro_batch_rows=32),
    "full bf16_kahan, packed": dict(precision="bf16_kahan", packing=True, micro_batch_tokens=16384),
    "full bf16_kahan, packed, optimizer offloaded": dict(
        precision="bf16_kahan", packing=True, micro_batch_tokens=16384, offload_optimizer=True
    ),
    "full bf16_kahan, packed, optimizer + reference offloaded (beta 0.04)": dict(
        precision="bf16_kahan",
        packing=True,
        micro_batch_tokens=16384,
        offload_optimizer=True,
        offload_reference=True,
        beta=0.04,
    ),
    "full bf16_mixed (TRL's bf16=True), packed": dict(
        precision="bf16_mixed", packing=True, micro_batch_tokens=16384
    ),
    "LoRA r=16 all linear, packed (beta 0.04: the adapter off is the reference)": dict(
        precision="bf16_kahan", lora=True, packing=True, micro_batch_tokens=16384, beta=0.04
    ),
}
"""The settings ``--plan`` tries, each over the bench's standard shape."""


def lora_params(dims: ModelDims, r: int = 16) -> int:
    """LoRA on every linear layer of every decoder layer: r x (in + out) per matrix."""
    h, kv, i = dims.hidden, dims.kv_heads * dims.head_dim, dims.intermediate
    per_layer = r * ((h + h) * 2 + (h + kv) * 2 + (h + i) * 3)
    return dims.layers * per_layer


def plan(
    dims: ModelDims, memory_gib: float, lengths: list[int], teacher: ModelDims | None = None
) -> list[dict[str, Any]]:
    """Each candidate's prediction and whether its peak fits ``memory_gib`` GiB; ``teacher``: on-policy
    distillation's, held beside each (in the policy's weight dtype)."""
    rows = []
    for name, kw in CANDIDATES.items():
        s = Settings(**kw, teacher_params=teacher.params if teacher is not None else 0)
        if s.lora:
            s = replace(s, lora_params=lora_params(dims))
        pred = predict(dims, s, lengths)
        rows.append({"settings": name, **pred, "fits": pred["peak_bytes"] <= memory_gib * 2**30})
    return rows


def print_plan(dims: ModelDims, memory_gib: float, rows: list[dict[str, Any]], shape: str) -> None:
    gib = 2**30
    print(
        f"plan for {dims.params / 1e9:.2f}B parameters (vocabulary {dims.vocab:,}, {dims.layers} layers) in "
        f"{memory_gib:g} GiB, shape {shape}; predicted GiB by role:"
    )
    keys = [
        "policy_weights",
        "policy_gradients",
        "policy_optimizer",
        "reference_model",
        "activations",
        "kv_cache",
    ]
    head = ["weights", "grads", "optim", "ref", "activ", "kv", "peak", "fits"]
    if any(r["roles"].get("teacher_model") for r in rows):  # on-policy distillation's teacher beside them
        keys.insert(4, "teacher_model")
        head.insert(4, "teacher")
    print(f"{'':<72}" + "".join(f"{h:>8}" for h in head))
    for r in rows:
        cells = "".join(f"{r['roles'].get(k, 0) / gib:>8.2f}" for k in keys)
        print(f"{r['settings']:<72}{cells}{r['peak_bytes'] / gib:>8.2f}{'yes' if r['fits'] else 'no':>8}")
