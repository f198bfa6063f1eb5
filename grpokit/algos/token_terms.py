"""The clipped loss of `policy_loss` taken apart token by token, for showing and saving (no gradient).
Every term is `loss.loss_terms`', the function `policy_loss` aggregates (its masks included); this module only
keeps each token's terms instead of reducing them.

`policy_loss` returns one number and token-averaged fractions; the run explorer (`grpokit view`) and the
saved rollouts (`grpokit.rollout.record`) need each token's own terms:

  ratio  rho_{i,t}     the importance ratio at `ratio_level` (importance_ratio: exp(logp - old), ...)
  clip   c_{i,t}       -1 where A < 0 and rho < 1 - eps_low, +1 where A > 0 and rho > 1 + eps_high, else 0
                       (the tokens policy_loss counts in clip_frac_low / clip_frac_high; per surrogate)
  pg     l_{i,t}       -min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A), dual-clipped to min(l, -c A)
                       for A < 0 when dual_clip = c; or the chosen `surrogate`'s term (objectives.py)
  kl     kl_{i,t}      kl_estimate(logp, ref, kl_kind), NaN without a reference
  loss   l + beta kl   the per-token term that `policy_loss` aggregates
  masks  bits          the masks that acted on the token, MASK_BITS: trust_region 1, off_policy 2, entropy 4 and
                       clip_cov 8 took it out of pg; kl_cov 16 added its penalty

and `aggregate` reduces a per-token term the way `policy_loss` does (tests check both against it).
Masked positions hold 0 (clip 0, kl 0, masks 0).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .knobs import flat_keys
from .loss import MASK_REASONS, aggregate_terms, loss_terms
from .objectives import SURROGATES

MASK_BITS = {reason: 1 << i for i, reason in enumerate(MASK_REASONS)}
"""The bit of each mask reason in token_terms' "masks" (trust_region 1, off_policy 2, entropy 4, clip_cov 8,
kl_cov 16)."""


@torch.no_grad()
def token_terms(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    completion_mask: Tensor,
    **loss_kwargs: object,
) -> dict[str, Tensor]:
    """{ratio, clip, pg, kl, loss, masks}, each (B, T), from (B, T) log-probs and mask and (B,) or (B, T)
    advantages; formulas in the module docstring. Takes `policy_loss`'s keywords (`AlgoSettings.loss_kwargs()`
    and the masks' inputs: sample_logprobs, entropy_mask, cov_mask); the aggregation ones are ignored here (see
    `aggregate`). The terms are `loss.loss_terms`', the function policy_loss aggregates.

    Example, one token, A = 1, logp - old = 0.3: rho = e^0.3 = 1.3499 > 1.2, so clip = +1 and
    pg = -min(1.3499, 1.2) = -1.2."""
    kw = _from_before_params({k: v for k, v in loss_kwargs.items() if k not in _AGGREGATION})
    if kw.get("ref_logprobs") is not None:
        kw["ref_logprobs"] = kw["ref_logprobs"].float()
    if kw.get("sample_logprobs") is not None:
        kw["sample_logprobs"] = kw["sample_logprobs"].float()
    t = loss_terms(logprobs.float(), old_logprobs.float(), advantages.float(), completion_mask, **kw)
    zero = torch.zeros((), dtype=torch.float32)
    low, high = t.flags["low"] & t.mask, t.flags["high"] & t.mask  # (B, T) each
    masks = torch.zeros(t.mask.shape, dtype=torch.int64)  # (B, T)
    for reason, acted in t.masked.items():
        masks |= acted.long() * MASK_BITS[reason]
    return {
        "ratio": torch.where(t.mask, t.ratio, zero),
        "clip": high.float() - low.float(),
        "pg": t.pg,
        "kl": t.kl if t.kl is not None else torch.full_like(t.pg, float("nan")),
        "loss": t.loss,
        "masks": masks,
    }


_AGGREGATION = ("agg", "norm_len", "num_sequences", "num_tokens")
_BEFORE_PARAMS = ("sapo_tau_pos", "sapo_tau_neg", "is_cap", "vespo_k", "vespo_lambda")


def _from_before_params(kw: dict[str, object]) -> dict[str, object]:
    """Saved rollouts written before the surrogates had their own parameter types (issue 54) hold every surrogate's
    parameters among the loss's keywords (VESPO's as (A >= 0, A < 0) pairs): the chosen surrogate's become its
    surrogate_params, the others are dropped."""
    if not set(_BEFORE_PARAMS) & set(kw):
        return kw
    old = {k: kw.pop(k) for k in _BEFORE_PARAMS if k in kw}
    flat = {k: v for k, v in old.items() if not k.startswith("vespo")}
    for name in ("k", "lambda"):
        if f"vespo_{name}" in old:
            flat[f"vespo_{name}_pos"], flat[f"vespo_{name}_neg"] = old[f"vespo_{name}"]
    keys = flat_keys(SURROGATES[str(kw.get("surrogate", "clip"))].params)  # {flat name: field}
    kw["surrogate_params"] = {field: flat[key] for key, field in keys.items() if key in flat} or None
    return kw


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
    """() the loss `policy_loss` makes of the per-token terms (B, T) over these B rows (`loss.aggregate_terms`,
    the function policy_loss uses): seq-mean-token-mean, token-mean or seq-sum-norm. num_sequences / num_tokens
    default to these rows' own (B and sum m): the loss of a group alone."""
    m = completion_mask.float()  # (B, T)
    terms = per_token.float() * m  # (B, T)
    return aggregate_terms(
        terms, m, agg=agg, norm_len=norm_len, num_sequences=num_sequences, num_tokens=num_tokens
    )
