"""Per-token estimators of KL(pi_theta || pi_ref) from sampled tokens (Schulman, "Approximating KL
divergence", 2020; k3 is DeepSeekMath arXiv 2402.03300 eq. 4).

With d = ref_logprobs - logprobs (log of pi_ref / pi_theta at the sampled token):
  k1 = -d = logp - ref                 unbiased, high variance, can be negative
  k2 = 0.5 * d^2                       biased, low variance (REINFORCE++-baseline's KL loss)
  k3 = exp(d) - d - 1                  unbiased, >= 0 (GRPO's KL loss)
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._checks import check_choice

KL_KINDS = ("k1", "k2", "k3")
LOG_RATIO_CLAMP = 20.0


def kl_estimate(logprobs: Tensor, ref_logprobs: Tensor, kind: str = "k3") -> Tensor:
    """Per-token KL estimate k1 | k2 | k3 (formulas in the module docstring).

    Safety clamp: for k3 the log-ratio d is clamped to [-20, 20] before exp (exp(20) ~ 4.9e8), so a
    token whose reference log-prob collapsed cannot produce inf; inside the clamp the value and the
    gradient are exact, outside it the gradient is 0. k1 and k2 take no exp and are not clamped.
    Gradient of k3 w.r.t. logprobs: 1 - exp(ref - logp).

    Args:
        logprobs: (...) log pi_theta of the sampled tokens, e.g. (B, T).
        ref_logprobs: (...) same shape, log pi_ref of the same tokens.
        kind: "k1" | "k2" | "k3".
    Returns:
        (...) per-token estimate, same shape as logprobs (mask it yourself).
    """
    check_choice("kind", kind, KL_KINDS)
    d = ref_logprobs - logprobs  # (B, T)
    if kind == "k1":
        return -d  # (B, T)
    if kind == "k2":
        return 0.5 * d.square()  # (B, T)
    d = d.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # (B, T)
    return torch.exp(d) - d - 1.0  # (B, T)
