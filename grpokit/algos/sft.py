"""The supervised fine-tuning loss: mean negative log-likelihood of the trained tokens of a whole batch.

    L = -(1 / N) * sum_{i,t} m_{i,t} * log p(x_{i,t} | x_{i,<t}),   N = sum over the WHOLE step's batch of m

m is the loss mask (grpokit.data.sft: completion / assistant tokens, or every token). N is the step's
token count, not a micro-batch's, so the micro-batches' parts  nll_sum(micro) / N  add up to exactly the
whole batch's loss, and so do their gradients: micro-batching, packing and the number of ranks never
change the objective. This is TRL SFTTrainer's loss (token-mean cross-entropy over the batch, with
``average_tokens_across_devices``).
"""

from __future__ import annotations

from torch import Tensor


def nll_sum(logprobs: Tensor, loss_mask: Tensor | None = None) -> Tensor:
    """-sum(m * logprobs), a 0-d tensor. logprobs: any shape, e.g. (N, L), or (K,) the trained tokens
    only (then no mask); loss_mask: the same shape, 1 where a token counts."""
    if loss_mask is None:
        return -logprobs.sum()
    return -(logprobs * loss_mask.to(logprobs.dtype)).sum()


def sft_loss(logprobs: Tensor, loss_mask: Tensor | None, num_tokens: Tensor | float) -> Tensor:
    """A micro-batch's part of the batch's mean NLL: nll_sum / num_tokens, num_tokens the WHOLE batch's
    count of trained tokens. Worked example: logprobs [-1, -2, -3], mask [0, 1, 1], and the other
    micro-batch holds 2 more trained tokens, so num_tokens = 4: (2 + 3) / 4 = 1.25."""
    return nll_sum(logprobs, loss_mask) / num_tokens


__all__ = ["nll_sum", "sft_loss"]
