"""The train/inference mismatch: how far the sampler's log-probs are from the trainer's, and the importance
weights that correct the policy gradient for it.

An inference engine (vLLM above all: other kernels, other reduction orders, bf16 KV caches) samples from
pi_sampler, not exactly from the trainer's pi_old, so the policy gradient, an expectation under pi_old, is
estimated from samples of another distribution. Per sampled token t of completion i,

    delta_{i,t} = old_{i,t} - sampler_{i,t}                 (trainer's log-prob minus the sampler's)

  mismatch      mean |delta| and max |delta| (sampler_logprob_diff/*), and two estimates of
                KL(pi_sampler || pi_old) from the sampler's own samples (Schulman, "Approximating KL
                divergence", 2020): k1 = E[-delta] (unbiased, noisy, can be < 0) and
                k3 = E[exp(delta) - 1 - delta] (unbiased, >= 0 token by token).
  IS weight     token:    rho_{i,t} = exp(delta_{i,t})
                sequence: rho_i = exp(sum_t m_{i,t} delta_{i,t}) on every token of the completion
  bounding      truncate: w = clamp(rho, floor, cap)                  (truncated IS, Ionides 2008; TRL's
                          token_truncate / sequence_truncate, verl's rollout_is "truncate")
                mask:     w = rho where floor <= rho <= cap, else 0   (TRL's token_mask / sequence_mask)

The weight multiplies each token's policy-gradient term (not the KL to the reference), as TRL does
(``per_token_loss * importance_sampling_ratio``): grpokit forms it in grpokit.train.update, where the
per-token advantages of a micro-batch are formed (``A_{i,t} * w_{i,t}``; for w >= 0 the clipped surrogate
-min(rho A w, clip(rho) A w) is exactly w times the unweighted one, the dual clip's cap too).
Yao et al., "Your efficient RL framework secretly brings you off-policy RL training" (2025) is the
reference for the truncated token-level form.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

IS_MODES = ("none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
"""rollout.is_correction's values but auto: off, or TRL's four vllm_importance_sampling_mode names."""
LOG_WEIGHT_CLAMP = 30.0  # exp(30) ~ 1e13: a sequence sum beyond it is masked or capped anyway


def is_weights(
    old_logprobs: Tensor,
    sampler_logprobs: Tensor,
    mask: Tensor,
    mode: str,
    cap: float | None = 2.0,
    floor: float | None = None,
) -> Tensor:
    """(B, T) importance weights pi_old / pi_sampler of the sampled tokens, bounded as ``mode`` says.

    Args:
        old_logprobs: (B, T) the trainer's log-probs of the sampled tokens under the policy that sampled them.
        sampler_logprobs: (B, T) the inference engine's log-probs of the same tokens.
        mask: (B, T) 1 for the sampled tokens; masked positions may hold anything and get weight 0.
        mode: one of IS_MODES ("none": every weight 1 inside the mask).
        cap: the upper bound C_max (None: no upper bound); floor: the lower bound C_min (None: none).
    Returns:
        (B, T) weights, no gradient, 0 outside the mask.

    Example, one completion of two tokens with delta = (ln 3, ln 0.5), cap 2:
        token_truncate  -> (2, 0.5)      token_mask -> (0, 0.5)
        sequence_*      -> rho = 3 * 0.5 = 1.5 on both tokens (under the cap: kept as it is)
    """
    if mode not in IS_MODES:
        raise ValueError(f"unknown importance-sampling mode {mode!r}; choose one of {IS_MODES}")
    if cap is not None and not cap > 0:
        raise ValueError(f"the cap must be > 0 (or None for none), got {cap}")
    if floor is not None and not floor >= 0:
        raise ValueError(f"the floor must be >= 0 (or None for none), got {floor}")
    if cap is not None and floor is not None and floor > cap:
        raise ValueError(f"the floor {floor} is above the cap {cap}")
    m = mask.to(torch.bool)  # (B, T)
    zero = old_logprobs.new_zeros(())
    if mode == "none":
        return m.to(old_logprobs.dtype)
    with torch.no_grad():
        delta = torch.where(m, old_logprobs.float() - sampler_logprobs.float(), zero.float())  # (B, T)
        if mode.startswith("sequence"):
            delta = delta.sum(-1, keepdim=True).expand_as(delta)  # (B, T) the sequence's log-ratio on every token
        rho = delta.clamp(-LOG_WEIGHT_CLAMP, LOG_WEIGHT_CLAMP).exp()  # (B, T)
        lo = -math.inf if floor is None else floor
        hi = math.inf if cap is None else cap
        if mode.endswith("truncate"):
            w = rho.clamp(min=lo, max=hi)  # (B, T)
        else:
            w = torch.where((rho >= lo) & (rho <= hi), rho, torch.zeros_like(rho))  # (B, T)
        return torch.where(m, w, torch.zeros_like(w)).to(old_logprobs.dtype)


def mismatch_sums(old_logprobs: Tensor, sampler_logprobs: Tensor, mask: Tensor) -> dict[str, float]:
    """Sums over the sampled tokens ``mask`` (B, T) that make the mismatch metrics once divided by ``tokens``:
    ``abs_diff`` (sum |delta|), ``max_abs_diff``, ``kl_k1`` (sum -delta), ``kl_k3`` (sum exp(delta) - 1 - delta),
    ``tokens``. delta = old - sampler, both (B, T); see the module docstring for what k1 and k3 estimate.

    Example: delta = (ln 2, 0) -> abs_diff = ln 2, kl_k1 = -ln 2, kl_k3 = (2 - 1 - ln 2) + 0 = 0.3069.
    """
    m = mask.to(torch.bool)
    delta = (old_logprobs.detach().double() - sampler_logprobs.double())[m]  # (tokens,) float64: k3 ~ delta^2 / 2
    if not delta.numel():
        return {"abs_diff": 0.0, "max_abs_diff": 0.0, "kl_k1": 0.0, "kl_k3": 0.0, "tokens": 0.0}
    clamped = delta.clamp(-LOG_WEIGHT_CLAMP, LOG_WEIGHT_CLAMP)
    return {
        "abs_diff": float(delta.abs().sum()),
        "max_abs_diff": float(delta.abs().max()),
        "kl_k1": float((-delta).sum()),
        "kl_k3": float((torch.expm1(clamped) - clamped).sum()),
        "tokens": float(delta.numel()),
    }
