"""A lower bound on decode time from the datasheet: the bench prints it beside the measured generation."""

from __future__ import annotations

from typing import Any

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
