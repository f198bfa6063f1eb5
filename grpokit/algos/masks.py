"""Masks that take tokens or whole sequences out of the policy-gradient term (not out of the normaliser, nor out of
the KL term): `policy_loss` multiplies its surrogate by them and logs each one's share as masked_frac/<reason>.

  off_policy   DeepSeek-V3.2 (arXiv 2512.02556, eq. 9; TRL off_policy_mask_threshold): drop a sequence whose
               advantage is negative and whose mean KL to the sampler, (1/|o_i|) sum_t m (log pi_sampler - log pi),
               exceeds delta. Such a sequence is a mistake the policy has already moved away from; pushing it
               further down is what destabilises off-policy updates.
  entropy      Beyond the 80/20 rule (arXiv 2506.01939; TRL top_entropy_quantile rho): keep only the tokens whose
               entropy is at or above the (1 - rho) quantile of the batch's, the "forking" tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor


def off_policy_mask(
    advantages: Tensor, logprobs: Tensor, sample_logprobs: Tensor, mask: Tensor, delta: float
) -> Tensor:
    """(B, T) bool, True = keep: A >= 0 or the sequence's mean KL to the sampler <= delta (module docstring).

    Example: a sequence of 2 tokens, A = -1, sampler log-probs [-1, -1], policy [-2, -3]: KL = (1 + 2) / 2 = 1.5;
    with delta 0.5 it is dropped, with delta 2 kept; with A = +1 it is kept whatever the KL.

    Args:
        advantages: (B, T) (per token; a (B,) advantage broadcast first); logprobs: (B, T) log pi (no gradient taken);
        sample_logprobs: (B, T) log pi of the sampler (NaN where it could not score: counted as 0);
        mask: (B, T) bool.
    """
    m = mask.to(logprobs.dtype)  # (B, T)
    kl = torch.nan_to_num(sample_logprobs.to(logprobs.dtype) - logprobs.detach(), nan=0.0)  # (B, T)
    kl = torch.where(mask, kl, torch.zeros((), dtype=kl.dtype))  # (B, T)
    seq_kl = (kl * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1)  # (B, 1)
    return (advantages >= 0) | (seq_kl <= delta)  # (B, T)


def high_entropy_mask(entropy: Tensor, mask: Tensor, quantile: float) -> Tensor:
    """(B, T) bool, True = keep: tokens of `mask` whose entropy is >= the (1 - quantile) quantile of the entropies
    under `mask` (torch.quantile, linear interpolation; TRL's get_high_entropy_mask). quantile 1 keeps every token,
    0 only the highest-entropy one(s).

    Example: entropies [0.1, 2.0, 0.5, 1.5] with quantile 0.5: the 0.5 quantile is (0.5 + 1.5) / 2 = 1.0, so the
    tokens with 2.0 and 1.5 are kept.

    Args:
        entropy: (B, T) per-token entropy (no gradient needed); mask: (B, T) bool; quantile: rho in [0, 1].
    """
    values = entropy[mask].float()  # (n,)
    if values.numel() == 0:
        return torch.zeros_like(mask)
    threshold = torch.quantile(values, 1.0 - quantile)  # ()
    return (entropy >= threshold.to(entropy.dtype)) & mask  # (B, T)
