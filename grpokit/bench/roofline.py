"""Each phase of a GRPO step held against its bound on the device it ran on: the bench prints the measured time,
the bound and their ratio for generation, the reference pass and the update (``phase_bounds``).

    generation   bytes moved over memory bandwidth (decode_roofline): each decode step reads every weight once and
                 every row's KV cache; the prefill's FLOP over peak is reported beside it, not added
    reference    FLOP over peak: one forward pass (forward_flops) over every row, prompt and completion, the LM
                 head over the completion tokens alone
    update       FLOP over peak: forward and backward (3x the forward; 2x with LoRA, whose frozen weights need no
                 weight gradient) per pass over the batch (optim.epochs); gradient checkpointing's recomputation
                 is not counted: a bound is the work the phase cannot avoid

The device's rates (``device_rates``): on an NVIDIA H200 or H100 the datasheet's (memory bandwidth, dense matmul
FLOP/s in the compute dtype: DATASHEETS); anywhere else, a CPU included, measured on the device itself
(``measured_rates``: the best of a few square matmuls, and of a large tensor copy counted as read + write), so a
ratio there is against what this device was seen to do, not against a datasheet.
"""

from __future__ import annotations

import functools
import time
from dataclasses import asdict, dataclass
from typing import Any

from grpokit.bench.plan import ModelDims
from grpokit.bench.shapes import H100_SXM_BF16_FLOPS, H100_SXM_MEM_BW


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


DATASHEETS: dict[str, dict[str, float]] = {
    # memory bandwidth (B/s) and dense (no sparsity) FLOP/s by compute dtype; NVIDIA's product pages
    "NVIDIA H200 NVL": {"mem_bw": 4.8e12, "bfloat16": 835e12, "float16": 835e12, "float32": 60e12},
    "NVIDIA H200 SXM": {"mem_bw": 4.8e12, "bfloat16": 989e12, "float16": 989e12, "float32": 67e12},
    "NVIDIA H100 NVL": {"mem_bw": 3.9e12, "bfloat16": 835e12, "float16": 835e12, "float32": 60e12},
    "NVIDIA H100 PCIe": {"mem_bw": 2.0e12, "bfloat16": 756e12, "float16": 756e12, "float32": 51e12},
    "NVIDIA H100 SXM": {"mem_bw": H100_SXM_MEM_BW, "bfloat16": H100_SXM_BF16_FLOPS, "float16": H100_SXM_BF16_FLOPS,
                        "float32": 67e12},
}  # fmt: skip
"""Datasheet rates of the cards the bench knows by name (float32: the CUDA cores, torch's default without TF32)."""


@dataclass(frozen=True)
class DeviceRates:
    """What a device can do at best: memory bandwidth (bytes/s) and matmul FLOP/s in one dtype, and whence."""

    device: str
    dtype: str
    mem_bw_bytes_s: float
    peak_flops: float
    source: str  # "datasheet: NVIDIA H200 SXM" or "measured: ..."


def datasheet_card(device_name: str) -> str | None:
    """The DATASHEETS entry of a CUDA device's name (torch.cuda.get_device_name), or None for another card."""
    name = device_name.upper()
    for chip in ("H200", "H100"):
        if chip in name:
            form = "NVL" if "NVL" in name else "PCIe" if "PCIE" in name else "SXM"
            if chip == "H200" and form == "PCIe":
                return None
            return f"NVIDIA {chip} {form}"
    return None


def measured_rates(device: Any, dtype: Any, *, matmul_n: int | None = None, copy_bytes: int | None = None,
                   reps: int = 5) -> DeviceRates:  # fmt: skip
    """The device's rates as measured now: the best of ``reps`` (n x n) @ (n x n) matmuls in ``dtype``
    (2 n^3 FLOP each; n 4096 on CUDA, 512 elsewhere) and of ``reps`` copies of a ``copy_bytes`` tensor (read and
    written: 2 x copy_bytes moved; 256 MiB on CUDA, 64 MiB elsewhere), each timed with the device synchronised."""
    import torch

    cuda = device.type == "cuda"
    n = matmul_n or (4096 if cuda else 512)
    size = copy_bytes or (256 if cuda else 64) * 2**20
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)

    def best(fn) -> float:
        fn()  # warm up: kernels chosen, pages touched
        times = []
        for _ in range(reps):
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            times.append(time.perf_counter() - t0)
        return min(times)

    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    matmul_s = best(lambda: torch.mm(a, b))
    src = torch.empty(size, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    copy_s = best(lambda: dst.copy_(src))
    name = torch.cuda.get_device_name(device) if cuda else f"cpu, {torch.get_num_threads()} threads"
    return DeviceRates(
        device=name, dtype=str(dtype).removeprefix("torch."), mem_bw_bytes_s=2 * size / copy_s,
        peak_flops=2 * n**3 / matmul_s,
        source=f"measured: best of {reps} {n}x{n} matmuls and {reps} copies of {size / 2**20:.0f} MiB",
    )  # fmt: skip


@functools.lru_cache(maxsize=8)
def _measured(device: str, dtype: str) -> DeviceRates:
    import torch

    return measured_rates(torch.device(device), getattr(torch, dtype))


def device_rates(device: Any, dtype: Any) -> DeviceRates:
    """The rates the bounds use on ``device`` for compute in ``dtype``: a known card's datasheet, else measured
    (once per device and dtype in a process)."""
    import torch

    dtype_name = str(dtype).removeprefix("torch.")
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        card = datasheet_card(name)
        if card is not None and dtype_name in DATASHEETS[card]:
            sheet = DATASHEETS[card]
            return DeviceRates(name, dtype_name, sheet["mem_bw"], sheet[dtype_name], f"datasheet: {card}")
    return _measured(str(device), dtype_name)


def linear_params_per_layer(dims: ModelDims) -> int:
    """Weights of one decoder layer's matmuls: q and o (hidden x heads x head_dim each), k and v (hidden x kv heads
    x head_dim each), the MLP's gate, up and down (hidden x intermediate each); norms and biases do no matmul."""
    attn = dims.heads * dims.head_dim
    return 2 * dims.hidden * attn + 2 * dims.hidden * dims.kv_heads * dims.head_dim + 3 * dims.hidden * dims.intermediate


def forward_flops(dims: ModelDims, rows: int, row_len: int, scored: int) -> float:
    """FLOP of one forward pass over ``rows`` rows of ``row_len`` tokens whose last ``scored`` go through the LM head:

        per row: layers x (2 x linear_params_per_layer x row_len            the matmuls, a multiply-add per weight
                           + 2 x heads x head_dim x row_len x (row_len + 1))  causal QK^T and AV: sum_i 2 x 2 x i x d
                 + 2 x vocab x hidden x scored                              the LM head
    """
    attn = dims.heads * dims.head_dim
    per_layer = 2 * linear_params_per_layer(dims) * row_len + 2 * attn * row_len * (row_len + 1)
    return float(rows * (dims.layers * per_layer + 2 * dims.vocab * dims.hidden * scored))


def phase_bounds(
    measured: dict[str, float],
    dims: ModelDims,
    rates: DeviceRates,
    *,
    rows: int,
    prompt_len: int,
    completion_len: int,
    weight_bytes: float,
    kv_bytes: float,
    reference: bool,
    lora: bool = False,
    epochs: int = 1,
) -> dict[str, Any]:
    """Each phase's measured seconds (``measured``: generation_s, reference_s, update_s), its bound on ``rates``
    (module docstring) and measured / bound. ``weight_bytes``: bytes per parameter as stored for decoding;
    ``kv_bytes``: per KV-cache element. A phase that did not run (no reference) has no bound."""
    decode = decode_roofline(dims.params, weight_bytes, dims.layers, dims.kv_heads, dims.head_dim, rows, prompt_len,
                             completion_len, kv_bytes, mem_bw_bytes_s=rates.mem_bw_bytes_s,
                             peak_flops=rates.peak_flops)  # fmt: skip
    prefill = forward_flops(dims, rows, prompt_len, 1)  # the prompt, and one head row for the first token
    forward = forward_flops(dims, rows, prompt_len + completion_len, completion_len)
    update = forward * (2 if lora else 3) * epochs
    phases: dict[str, dict[str, Any]] = {
        "generation": {"basis": "bytes / bandwidth (decode)", "bound_s": decode["seconds"],
                       "bytes": decode["weight_bytes_per_step"] * completion_len + decode["kv_bytes_total"],
                       "prefill_flops": prefill, "prefill_s_at_peak": prefill / rates.peak_flops},
        "reference": {"basis": "FLOP / peak (a forward pass)", "flops": forward,
                      "bound_s": forward / rates.peak_flops if reference else None},
        "update": {"basis": f"FLOP / peak (forward + backward{', LoRA' if lora else ''}, x{epochs} epochs)",
                   "flops": update, "bound_s": update / rates.peak_flops},
    }  # fmt: skip
    for name, phase in phases.items():
        seconds = measured.get(f"{name}_s")
        phase["measured_s"] = seconds
        bound = phase["bound_s"]
        phase["ratio"] = seconds / bound if seconds and bound else None
    return {"device": asdict(rates), "phases": phases}
