"""Chunked log-softmax helpers over the vocabulary.

Full-vocabulary logits dominate activation memory (B*T*V values), so both helpers walk over rows
(positions) `chunk_size` at a time and upcast only one chunk to float32, never the whole tensor.
grpokit.model.logprobs.completion_logprobs calls them on each LM-head chunk it builds from hidden states.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for half types, float64 stays float64."""
    return torch.promote_types(dtype, torch.float32)


@torch.no_grad()
def entropy_from_logits(logits: Tensor, *, chunk_size: int = 512) -> Tensor:
    """Per-position entropy of softmax(logits), computed chunk by chunk over rows. A metric: no gradient.

    H = -sum_v p_v log p_v = logsumexp(x) - sum_v p_v x_v,  p = softmax(x).

    Runs under torch.no_grad (it is logged, not optimised). Each chunk of `chunk_size` rows is upcast
    to float32 on its own, so the extra memory is chunk_size * V floats, not a copy of all logits.

    Args:
        logits: (..., T, V) e.g. (B, T, V), any float dtype.
    Returns:
        (..., T) entropy in nats, float32 (float64 for float64 logits).
    """
    vocab = logits.shape[-1]
    rows = logits.reshape(-1, vocab)  # (R, V)
    out = torch.empty(rows.shape[0], dtype=_compute_dtype(logits.dtype), device=logits.device)  # (R,)
    for start in range(0, rows.shape[0], chunk_size):
        x = rows[start : start + chunk_size].to(out.dtype)  # (C, V) one upcast chunk
        lse = torch.logsumexp(x, dim=-1, keepdim=True)  # (C, 1)
        p = torch.exp(x - lse)  # (C, V)
        out[start : start + chunk_size] = lse.squeeze(-1) - (p * x).sum(-1)  # (C,)
    return out.reshape(logits.shape[:-1])  # (..., T)


def entropy_with_grad(logits: Tensor) -> Tensor:
    """(R,) entropy of softmax(logits) per row, with its gradient (the entropy bonus), from (R, V) logits.

    H = -sum_v p_v log p_v;  dH/dx_v = -p_v (log p_v + H).

    Plain autograd over the whole (R, V) block: call it on one LM-head chunk (grpokit.model.logprobs does, inside
    the chunk's checkpoint, so the (R, V) intermediates live only while that chunk's backward runs)."""
    logp = torch.log_softmax(logits.to(_compute_dtype(logits.dtype)), dim=-1)  # (R, V)
    return -(logp.exp() * logp).sum(-1)  # (R,)


class _SelectiveLogSoftmax(torch.autograd.Function):
    """log_softmax(x)[index] with a chunked forward and a chunked, recomputing backward.

    Only the (R,) log-sum-exp is saved besides the inputs, so no float32 copy of the logits outlives
    one chunk. Backward: d/dx_v = g * (1[v = index] - softmax(x)_v).
    """

    @staticmethod
    def forward(ctx, rows: Tensor, index: Tensor, chunk_size: int) -> Tensor:  # rows (R, V), index (R,)
        dtype = _compute_dtype(rows.dtype)
        out = torch.empty(rows.shape[0], dtype=dtype, device=rows.device)  # (R,)
        lse_all = torch.empty_like(out)  # (R,)
        for start in range(0, rows.shape[0], chunk_size):
            x = rows[start : start + chunk_size].to(dtype)  # (C, V)
            lse = torch.logsumexp(x, dim=-1)  # (C,)
            idx = index[start : start + chunk_size]  # (C,)
            out[start : start + chunk_size] = x.gather(-1, idx.unsqueeze(-1)).squeeze(-1) - lse  # (C,)
            lse_all[start : start + chunk_size] = lse
        ctx.save_for_backward(rows, index, lse_all)
        ctx.chunk_size = chunk_size
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):  # grad_out (R,)
        rows, index, lse_all = ctx.saved_tensors
        grad = torch.empty_like(rows)  # (R, V) in the logits dtype
        for start in range(0, rows.shape[0], ctx.chunk_size):
            sl = slice(start, start + ctx.chunk_size)
            x = rows[sl].to(lse_all.dtype)  # (C, V)
            g = grad_out[sl].to(lse_all.dtype).unsqueeze(-1)  # (C, 1)
            # formed in place, in grad itself when the logits are in the compute dtype: the backward then holds
            # the logits and their gradient and no third (C, V) block (exp(.) * -g is -exp(.) * g, bit for bit)
            chunk = grad[sl] if grad.dtype == x.dtype else torch.empty_like(x)  # (C, V)
            torch.sub(x, lse_all[sl].unsqueeze(-1), out=chunk)
            chunk.exp_().mul_(-g)  # -softmax(x) * g
            chunk.scatter_add_(-1, index[sl].unsqueeze(-1), g)  # (C, V) + g at the chosen token
            if chunk.dtype != grad.dtype:
                grad[sl] = chunk.to(rows.dtype)
        return grad, None, None


def selective_log_softmax(logits: Tensor, index: Tensor, *, chunk_size: int = 512) -> Tensor:
    """log_softmax(logits, -1).gather(-1, index), chunked over rows, with gradient to logits.

    logp_t = x_{t, index_t} - logsumexp_v x_{t, v}.

    Memory: forward and backward each upcast one chunk of `chunk_size` rows at a time; the backward
    recomputes the softmax instead of saving it (custom autograd Function; first derivatives only).

    Args:
        logits: (..., T, V), any float dtype (divide by the sampling temperature first).
        index: (..., T) integer token ids.
    Returns:
        (..., T) log-probs, float32 for half logits (float64 for float64 logits).
    """
    if logits.shape[:-1] != index.shape:
        raise ValueError(
            f"index shape {tuple(index.shape)} must equal logits.shape[:-1] = {tuple(logits.shape[:-1])}"
        )
    rows = logits.reshape(-1, logits.shape[-1])  # (R, V)
    out = _SelectiveLogSoftmax.apply(rows, index.reshape(-1).long(), chunk_size)  # (R,)
    return out.reshape(index.shape)  # (..., T)
