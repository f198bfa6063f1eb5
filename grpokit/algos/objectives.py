"""The per-token surrogate of the policy loss, by name: the hard clip of PPO/GRPO and its second generation.
`policy_loss` (loss.py) chooses one with `surrogate=` and aggregates it like any other; `token_terms` shows it.

With rho = pi / pi_old at the loss's ratio level, A the advantage, logp = log pi (with gradient), sg = stop-gradient:

  clip     l = -min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A)                  PPO / GRPO (clipped_surrogate)
  cispo    l = -sg(clip(rho, 1 - eps_low, 1 + eps_high)) A logp                      CISPO, MiniMax-M1 arXiv 2506.13585
           (no token is dropped: the clipped weight scales the REINFORCE gradient; eps_low = 1 leaves it
           unbounded below, as the paper and TRL: clamp(rho, max=epsilon_high) with TRL's epsilon_high = 1 + eps_high)
  sapo     l = -(4 / tau) sigmoid(tau (rho - 1)) A, tau = tau_pos if A > 0 else tau_neg   SAPO, arXiv 2511.20347
           (a soft gate: its gradient is A grad(rho) at rho = 1 and fades smoothly instead of stopping at a clip edge)
  gmpo     l = -A_i exp( (1/|o_i|) sum_t m c_{i,t} ),  c = log rho clipped to [-eps_low, eps_high] on the side
           that would help the objective (min for A > 0, max for A < 0)        GMPO, arXiv 2507.20673 (verl geo_mean)
           (the geometric mean of the clipped token ratios times the sequence's advantage, the same on each token)
  dppo_tv  l = -A sg(min(rho, C)) logp v,  v = [p - p_old <= eps_high] for A > 0, [p - p_old >= -eps_low] else
  dppo_kl  the same with v from the binary KL  D = p_old log(p_old / p) + (1 - p_old) log((1 - p_old) / (1 - p)):
           v = [D <= eps_high or p <= p_old] for A > 0, [D <= eps_low or p >= p_old] else
           DPPO, arXiv 2602.04879 (verl dppo_tv / dppo_kl): p = exp(logp) is the token's probability; a token that
           left the trust region is masked (v = 0: no gradient), not clipped; eps_low / eps_high are the divergence
           bounds delta, C the cap of the truncated IS weight (verl clip_ratio_c, 20).
  vespo    l = -sg(phi(w_i)) A logp,  w_i = exp(sum_t m log rho_{i,t}) the sequence's IS weight (a product, not a
           geometric mean), phi(w) = e^lambda w^k e^(-lambda w) (a gamma shape, phi(1) = 1), k / lambda by the
           sign of A (A >= 0: k_pos, lambda_pos)            VESPO, arXiv 2602.10693, as TRL 1.16 defines it
           (log w clamped to [log 1e-8, 20], a non-finite phi set to 0, as TRL's get_gamma_weights)

Masked positions are handled by the caller (inputs already 0 there); every function returns (B, T) tensors.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

SURROGATES = ("clip", "cispo", "sapo", "gmpo", "dppo_tv", "dppo_kl", "vespo")
TOKEN_ONLY = ("gmpo", "dppo_tv", "dppo_kl", "vespo")
"""Surrogates that build their own (token) ratio: ratio_level must stay "token"."""


def surrogate_terms(
    name: str,
    ratio: Tensor,
    logp: Tensor,
    old: Tensor,
    adv: Tensor,
    m: Tensor,
    *,
    eps_low: float,
    eps_high: float,
    dual_clip: float | None = None,
    sapo_tau_pos: float = 1.0,
    sapo_tau_neg: float = 1.05,
    is_cap: float = 20.0,
    vespo_k: tuple[float, float] = (2.0, 3.0),
    vespo_lambda: tuple[float, float] = (3.0, 2.0),
) -> tuple[Tensor, dict[str, Tensor]]:
    """(pg, flags): the per-token loss l (B, T) of surrogate `name` (module docstring) and bool (B, T) flags:
    "low" / "high" (the tokens whose weight was clipped, for clip_frac_low / clip_frac_high), "dual" (capped by
    the dual clip) and, for DPPO, "trust_region" (masked for leaving the region).

    Args:
        ratio: (B, T) rho at the loss's ratio level (token for gmpo / dppo_*).
        logp, old: (B, T) log pi (with gradient) and log pi_old, 0 at masked positions.
        adv: (B, T) advantages, 0 at masked positions; m: (B, T) float mask.
        vespo_k, vespo_lambda: VESPO's (A >= 0, A < 0) exponents k and decays lambda.
    """
    none = torch.zeros_like(ratio, dtype=torch.bool)  # (B, T)
    flags = {"low": none, "high": none, "dual": none}
    if name == "clip":
        pg, dual = clipped_surrogate(ratio, adv, eps_low, eps_high, dual_clip)  # (B, T) each
        flags |= {
            "low": (adv < 0) & (ratio < 1.0 - eps_low),
            "high": (adv > 0) & (ratio > 1.0 + eps_high),
            "dual": dual,
        }
        return pg, flags
    if name == "cispo":
        weight = ratio.clamp(1.0 - eps_low, 1.0 + eps_high).detach()  # (B, T) sg(clip(rho))
        flags |= {"low": ratio < 1.0 - eps_low, "high": ratio > 1.0 + eps_high}
        return -weight * adv * logp, flags  # (B, T)
    if name == "sapo":
        tau = torch.where(adv > 0, ratio.new_tensor(sapo_tau_pos), ratio.new_tensor(sapo_tau_neg))  # (B, T)
        return -(4.0 / tau) * torch.sigmoid(tau * (ratio - 1.0)) * adv, flags  # (B, T)
    if name == "gmpo":
        log_ratio = (logp - old).clamp(-20.0, 20.0)  # (B, T)
        sign = torch.sign(adv)  # (B, T)
        clipped = log_ratio.clamp(-eps_low, eps_high)  # (B, T)
        kept = sign * torch.minimum(sign * log_ratio, sign * clipped)  # (B, T) the pessimistic side
        n = m.sum(-1).clamp(min=1)  # (B,)
        seq_ratio = torch.exp((kept * m).sum(-1) / n)  # (B,) geometric mean of the clipped ratios
        seq_adv = (adv * m).sum(-1) / n  # (B,) the sequence's advantage (per-token A averaged)
        cut = clipped != log_ratio  # (B, T)
        flags |= {"low": cut & (adv < 0), "high": cut & (adv > 0)}
        return (-seq_adv * seq_ratio).unsqueeze(-1).expand_as(logp), flags  # (B, T) same on every token
    if name in ("dppo_tv", "dppo_kl"):
        with torch.no_grad():
            p, p_old = logp.exp(), old.exp()  # (B, T) token probabilities
            if name == "dppo_tv":
                up, down = p - p_old <= eps_high, p - p_old >= -eps_low  # (B, T) each
            else:
                d = p_old * (old - logp) + (1 - p_old) * torch.log(
                    (1.0 - p_old + 1e-8) / (1.0 - p + 1e-8)
                )  # (B, T)
                up, down = (d <= eps_high) | (p <= p_old), (d <= eps_low) | (p >= p_old)  # (B, T) each
            valid = torch.where(adv > 0, up, down)  # (B, T)
            weight = ratio.clamp(max=is_cap) * valid  # (B, T) sg(min(rho, C)) v
        flags |= {"trust_region": ~valid, "high": valid & (ratio > is_cap)}
        return -adv * weight * logp, flags  # (B, T)
    if name == "vespo":
        with torch.no_grad():
            log_w = ((logp - old).clamp(-20.0, 20.0) * m).sum(-1, keepdim=True)  # (B, 1) log of the product
            log_w = log_w.clamp(math.log(1e-8), 20.0)  # (B, 1)
            nonneg = adv >= 0  # (B, T)
            k = torch.where(nonneg, logp.new_tensor(vespo_k[0]), logp.new_tensor(vespo_k[1]))  # (B, T)
            lam = torch.where(nonneg, logp.new_tensor(vespo_lambda[0]), logp.new_tensor(vespo_lambda[1]))
            lam = lam.clamp(min=1e-4)  # (B, T)
            phi = torch.exp(lam + k * log_w - lam * log_w.exp())  # (B, T) phi(w) = e^lambda w^k e^(-lambda w)
            phi = phi.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)  # (B, T)
        return -phi * adv * logp, flags  # (B, T)
    raise ValueError(f"surrogate={name!r} is not valid; choose one of {', '.join(map(repr, SURROGATES))}")


def clipped_surrogate(
    ratio: Tensor, adv: Tensor, eps_low: float, eps_high: float, dual_clip: float | None = None
) -> tuple[Tensor, Tensor]:
    """(pg, dual_active), each (B, T), from (B, T) ratios and advantages:

      pg = -min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A), then for A < 0 with dual_clip = c:
           min(pg, -c A) (= c |A|, Dual-clip PPO);
      dual_active: where that cap bites (all False without dual_clip).

    The one place the clipped surrogate is written: `surrogate_terms` uses it for "clip"."""
    lo, hi = 1.0 - eps_low, 1.0 + eps_high
    pg = torch.maximum(-adv * ratio, -adv * ratio.clamp(lo, hi))  # (B, T)
    dual_active = torch.zeros_like(pg, dtype=torch.bool)  # (B, T)
    if dual_clip is not None:
        cap = -adv * dual_clip  # (B, T) = c |A| where A < 0
        dual_active = (adv < 0) & (cap < pg)  # (B, T)
        pg = torch.where(adv < 0, torch.minimum(pg, cap), pg)  # (B, T)
    return pg, dual_active
