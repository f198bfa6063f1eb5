"""Masks that take tokens or whole sequences out of the policy-gradient term (not out of the normaliser, nor out of
the KL term): `policy_loss` multiplies its surrogate by them and logs each one's share as masked_frac/<reason>.

  off_policy   DeepSeek-V3.2 (arXiv 2512.02556, eq. 9; TRL off_policy_mask_threshold): drop a sequence whose
               advantage is negative and whose mean KL to the sampler, (1/|o_i|) sum_t m (log pi_sampler - log pi),
               exceeds delta. Such a sequence is a mistake the policy has already moved away from; pushing it
               further down is what destabilises off-policy updates.
  entropy      Beyond the 80/20 rule (arXiv 2506.01939; TRL top_entropy_quantile rho): keep only the tokens whose
               entropy is at or above the (1 - rho) quantile of the batch's, the "forking" tokens.
  clip_cov     The Entropy Mechanism of RL for Reasoning LMs (arXiv 2505.22617, eq. 11; verl clip_cov): the policy's
               entropy falls with the covariance Cov_{i,t} = (A_{i,t} - mean A)(logp_{i,t} - mean logp) of the
               tokens it trains on; Clip-Cov takes a random r * N of the tokens with Cov in (lb, ub) out of the
               gradient. KL-Cov (eq. 12; verl kl_cov) instead adds coef * |logp - old| to the top r * N tokens by Cov
               (the loss applies it; `covariance_selection` chooses the tokens for both).
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


def token_covariance(logprobs: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
    """(B, T) Cov_{i,t} = (A_{i,t} - mean A)(logp_{i,t} - mean logp), the means over the tokens of `mask`; 0 outside.

    Example: log-probs [-1, -3] with advantages [1, -1]: means -2 and 0, Cov = [(1)(1), (-1)(-1)] = [1, 1]: both
    tokens push the entropy down (a likely token rewarded, an unlikely one punished).

    Args:
        logprobs: (B, T) (no gradient taken); advantages: (B, T) (a (B,) advantage broadcast first); mask: (B, T) bool.
    """
    m = mask.to(torch.float64)  # (B, T)
    lp = torch.where(mask, logprobs.detach().to(torch.float64), 0.0)  # (B, T)
    adv = torch.where(mask, advantages.to(torch.float64), 0.0)  # (B, T)
    n = m.sum().clamp(min=1)  # ()
    cov = (adv - adv.sum() / n) * (lp - lp.sum() / n)  # (B, T)
    return torch.where(mask, cov, 0.0).to(logprobs.dtype)  # (B, T)


def covariance_selection(
    kind: str,
    cov: Tensor,
    mask: Tensor,
    ratio: float,
    *,
    bounds: tuple[float, float] = (1.0, 5.0),
    generator: torch.Generator | None = None,
) -> Tensor:
    """(B, T) bool: the tokens KL-Cov ("kl_cov": the k = max(1, int(ratio * N)) largest Cov) or Clip-Cov ("clip_cov":
    k drawn at random among those with lb < Cov < ub) act on, N the tokens of `mask` (module docstring).

    Args:
        cov: (B, T) from token_covariance; mask: (B, T) bool; ratio: r (verl's default 2e-4);
        bounds: Clip-Cov's (lb, ub) (verl's 1, 5); generator: Clip-Cov's random draw.
    """
    flat_mask = mask.reshape(-1)  # (B*T,)
    out = torch.zeros_like(flat_mask)  # (B*T,)
    n = int(flat_mask.sum())
    if n == 0:
        return out.reshape(mask.shape)
    k = max(1, int(ratio * n))
    flat = cov.reshape(-1)  # (B*T,)
    if kind == "kl_cov":
        scores = torch.where(flat_mask, flat, torch.tensor(-torch.inf, dtype=flat.dtype))  # (B*T,)
        out[torch.topk(scores, k).indices] = True
    elif kind == "clip_cov":
        lb, ub = bounds
        candidates = torch.nonzero(flat_mask & (flat > lb) & (flat < ub)).squeeze(-1)  # (c,)
        pick = torch.randperm(candidates.numel(), generator=generator)[:k]  # (<= k,)
        out[candidates[pick]] = True
    else:
        raise ValueError(f"kind={kind!r} is not valid; choose one of 'kl_cov', 'clip_cov'")
    return out.reshape(mask.shape)  # (B, T)
