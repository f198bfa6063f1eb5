"""An LM-head chunk's log-softmax at its targets, with the entropy, in few fused kernels (``optim.fused_logprobs``).

The plain path (grpokit.model.logprobs._chunk_logprobs with grpokit.algos.entropy's helpers) upcasts the chunk's
(C, V) logits to a float32 copy, then walks it 128 rows at a time: a max, a subtraction, an exp, a sum and a log
for the log-sum-exp, a gather, three more passes for the entropy, and in the backward a subtraction, an exp, a
product and a scatter. On an H200 these vocabulary-wide float32 kernels were about a quarter of the update's device
time (docs/benchmarks.md, 2026-11-29). Here, per chunk, with x = logits / T read once in its own dtype:

    lse_i  = log sum_v exp(x_iv)                      logp_i = x_{i, t_i} - lse_i
    H_i    = lse_i - sum_v softmax(x_i)_v x_iv        (the entropy, no gradient)
    dL/dlogits_iv = g_i (1[v = t_i] - softmax(x_i)_v) / T     (the backward, from the logits and lse: nothing else saved)

each a function :func:`torch.compile` turns into one or two reduction kernels over the vocabulary (compiled=True),
or runs eagerly (the tests' reference, the same formulas). The same values as the plain path up to float rounding
(tests/unit/model/test_fused_logprobs.py: log-probs, entropies and gradients, against the full logits too).
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor


def chunk_forward(logits: Tensor, targets: Tensor, temperature: float) -> tuple[Tensor, Tensor, Tensor]:
    """(log-probs (C,), log-sum-exp (C,), entropy (C,)) of logits (C, V) / temperature at targets (C,), float32."""
    x = logits.float()
    if temperature != 1.0:
        x = x / temperature
    lse = torch.logsumexp(x, dim=-1)  # (C,)
    chosen = torch.gather(x, -1, targets[:, None]).squeeze(-1)  # (C,)
    p = torch.exp(x - lse[:, None])  # (C, V), fused into the reduction below when compiled
    entropy = lse - (p * x).sum(-1)  # (C,)
    return chosen - lse, lse, entropy


def chunk_backward(logits: Tensor, targets: Tensor, lse: Tensor, grad: Tensor, temperature: float) -> Tensor:
    """d(sum_i grad_i logp_i)/d logits: (C, V) in the logits' dtype."""
    x = logits.float()
    if temperature != 1.0:
        x = x / temperature
    p = torch.exp(x - lse[:, None])  # (C, V) softmax
    vocab = torch.arange(x.shape[-1], device=x.device)  # (V,)
    onehot = (vocab[None, :] == targets[:, None]).to(x.dtype)  # (C, V), never materialised when compiled
    g = grad.float()[:, None] * (onehot - p)
    if temperature != 1.0:
        g = g / temperature
    return g.to(logits.dtype)


class ChunkOps:
    """chunk_forward and chunk_backward, compiled (dynamic shapes, one graph each) or eager."""

    def __init__(self, compiled: bool):
        self.compiled = bool(compiled)
        if compiled:
            from grpokit.model.fused_layers import compiled_function

            self.forward, self.backward = compiled_function(chunk_forward), compiled_function(chunk_backward)
        else:
            self.forward, self.backward = chunk_forward, chunk_backward


@functools.cache
def chunk_ops(compiled: bool) -> ChunkOps:
    """The process's ChunkOps (compiled or eager), made once."""
    return ChunkOps(compiled)


class _FusedSelectiveLogSoftmax(torch.autograd.Function):
    """(log-probs (C,), entropy (C,), no gradient) of a chunk; saves the logits (their own dtype), targets and lse."""

    @staticmethod
    def forward(ctx, logits: Tensor, targets: Tensor, temperature: float, ops: ChunkOps):
        logprobs, lse, entropy = ops.forward(logits, targets, temperature)
        ctx.save_for_backward(logits, targets, lse)
        ctx.temperature, ctx.ops = temperature, ops
        ctx.mark_non_differentiable(entropy)
        return logprobs, entropy

    @staticmethod
    def backward(ctx, grad_logprobs: Tensor, grad_entropy: Tensor | None):
        logits, targets, lse = ctx.saved_tensors
        return ctx.ops.backward(logits, targets, lse, grad_logprobs, ctx.temperature), None, None, None


def fused_chunk_logprobs(
    logits: Tensor, targets: Tensor, temperature: float, compiled: bool = True
) -> tuple[Tensor, Tensor]:
    """(log-probs (C,) with gradient to ``logits``, entropy (C,) without) of logits (C, V) / temperature at
    targets (C,), both float32 (module docstring)."""
    return _FusedSelectiveLogSoftmax.apply(logits, targets.long(), float(temperature), chunk_ops(compiled))
