"""The clipped loss of `policy_loss` taken apart token by token, for showing and saving (no gradient).
The surrogate itself is `objectives.surrogate_terms`, shared with `policy_loss`; this module only keeps
each token's terms instead of reducing them.

`policy_loss` returns one number and token-averaged fractions; the run explorer (`grpokit view`) and the
saved rollouts (`grpokit.rollout.record`) need each token's own terms:

  ratio  rho_{i,t}     the importance ratio at `ratio_level` (importance_ratio: exp(logp - old), ...)
  clip   c_{i,t}       -1 where A < 0 and rho < 1 - eps_low, +1 where A > 0 and rho > 1 + eps_high, else 0
                       (the tokens policy_loss counts in clip_frac_low / clip_frac_high; per surrogate)
  pg     l_{i,t}       -min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A), dual-clipped to min(l, -c A)
                       for A < 0 when dual_clip = c; or the chosen `surrogate`'s term (objectives.py)
  kl     kl_{i,t}      kl_estimate(logp, ref, kl_kind), NaN without a reference
  loss   l + beta kl   the per-token term that `policy_loss` aggregates

and `aggregate` reduces a per-token term the way `policy_loss` does (tests check both against it).
Masked positions hold 0 (clip 0, kl 0).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._checks import check_choice
from .kl import kl_estimate
from .loss import AGG_MODES, importance_ratio
from .objectives import surrogate_terms


@torch.no_grad()
def token_terms(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    completion_mask: Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float | None = None,
    ratio_level: str = "token",
    ref_logprobs: Tensor | None = None,
    beta: float = 0.0,
    kl_kind: str = "k3",
    dual_clip: float | None = None,
    surrogate: str = "clip",
    sapo_tau_pos: float = 1.0,
    sapo_tau_neg: float = 1.05,
    is_cap: float = 20.0,
    vespo_k: tuple[float, float] = (2.0, 3.0),
    vespo_lambda: tuple[float, float] = (3.0, 2.0),
    **_: object,
) -> dict[str, Tensor]:
    """{ratio, clip, pg, kl, loss}, each (B, T) float32, from (B, T) log-probs and mask and (B,) or (B, T)
    advantages; formulas in the module docstring. Takes `AlgoSettings.loss_kwargs()` as keywords (the
    aggregation ones are ignored here: see `aggregate`).

    Example, one token, A = 1, logp - old = 0.3: rho = e^0.3 = 1.3499 > 1.2, so clip = +1 and
    pg = -min(1.3499, 1.2) = -1.2."""
    eps_high = eps_low if eps_high is None else eps_high
    mask = completion_mask.bool()  # (B, T)
    zero = torch.zeros((), dtype=torch.float32)
    logp = torch.where(mask, logprobs.float(), zero)  # (B, T)
    adv = advantages.float()
    adv = adv.unsqueeze(-1).expand(logp.shape) if adv.dim() == 1 else adv  # (B, T)
    adv = torch.where(mask, adv, zero)  # (B, T)
    ratio = importance_ratio(logp, old_logprobs.float(), mask, ratio_level)  # (B, T)
    old = torch.where(mask, old_logprobs.float(), zero)  # (B, T)
    pg, flags = surrogate_terms(
        surrogate,
        ratio,
        logp,
        old,
        adv,
        mask.float(),
        eps_low=eps_low,
        eps_high=eps_high,
        dual_clip=dual_clip,
        sapo_tau_pos=sapo_tau_pos,
        sapo_tau_neg=sapo_tau_neg,
        is_cap=is_cap,
        vespo_k=vespo_k,
        vespo_lambda=vespo_lambda,
    )  # (B, T)
    low, high = flags["low"] & mask, flags["high"] & mask  # (B, T) each
    clip = high.float() - low.float()  # (B, T)
    if ref_logprobs is not None:
        ref = torch.where(mask, ref_logprobs.float(), zero)  # (B, T)
        kl = torch.where(mask, kl_estimate(logp, ref, kl_kind), zero)  # (B, T)
        loss = pg + beta * kl  # (B, T)
    else:
        kl = torch.full_like(logp, float("nan"))  # (B, T)
        loss = pg  # (B, T)
    return {
        "ratio": torch.where(mask, ratio, zero),
        "clip": clip,
        "pg": torch.where(mask, pg, zero),
        "kl": kl,
        "loss": torch.where(mask, loss, zero),
    }


def aggregate(
    per_token: Tensor,
    completion_mask: Tensor,
    *,
    agg: str = "seq-mean-token-mean",
    norm_len: float | None = None,
    num_sequences: float | None = None,
    num_tokens: float | None = None,
    **_: object,
) -> Tensor:
    """() the loss `policy_loss` makes of the per-token terms (B, T) over these B rows:

      seq-mean-token-mean  sum_i (1/|o_i|) sum_t m l / num_sequences
      token-mean           sum m l / num_tokens
      seq-sum-norm         sum m l / (num_sequences * norm_len)

    num_sequences / num_tokens default to these rows' own (B and sum m): the loss of a group alone."""
    check_choice("agg", agg, AGG_MODES)
    m = completion_mask.float()  # (B, T)
    terms = per_token.float() * m  # (B, T)
    n_seq = per_token.shape[0] if num_sequences is None else num_sequences
    if agg == "seq-mean-token-mean":
        return (terms.sum(-1) / m.sum(-1).clamp(min=1)).sum() / n_seq
    if agg == "token-mean":
        return terms.sum() / max(float(m.sum() if num_tokens is None else num_tokens), 1.0)
    if norm_len is None:
        raise ValueError("agg='seq-sum-norm' needs norm_len (the constant L, e.g. the max completion length)")
    return terms.sum() / (n_seq * norm_len)
