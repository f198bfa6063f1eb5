"""The clipped policy-gradient loss of the GRPO family, decomposed along independent axes:

  ratio level   "token"          rho_{i,t} = exp(logp_{i,t} - old_{i,t})                         (PPO, GRPO)
                "sequence"       s_i = exp( (1/|o_i|) sum_t m_{i,t} (logp_{i,t} - old_{i,t}) )  (GSPO, arXiv 2507.18071)
                "sequence_token" s_{i,t} = sg[s_i] * exp(logp_{i,t} - sg[logp_{i,t}])           (GSPO-token)
  clipping      l_{i,t} = -min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A)
                clip-higher eps_high > eps_low (DAPO, arXiv 2503.14476); dual clip for A < 0:
                l = min(l, -c A) (Ye et al. arXiv 1912.09729, as in verl)
  surrogate     "clip" above, or its second generation (objectives.py): cispo, sapo, gmpo, dppo_tv, dppo_kl, vespo
  masks         the off-policy sequence mask of DeepSeek-V3.2 and the high-entropy token mask (masks.py)
                multiply the surrogate (the normaliser still counts the tokens they drop, as TRL's)
  entropy bonus L -= alpha * (token mean of the entropy H over the loss tokens), H with its gradient (entropy_bonus.py:
                Skywork-OR1's bonus and its adaptive alpha; off unless entropy_coef != 0)
  KL            l += beta * kl_{i,t}, kl from `kl_estimate` (k3: DeepSeekMath arXiv 2402.03300 eq. 4); with
                kl_is_correction the KL is weighted by the ratio, rho * kl (DeepSeek-V3.2's unbiased estimate)
  aggregation   "seq-mean-token-mean"  (1/B) sum_i (1/|o_i|) sum_t m l      (DeepSeekMath GRPO)
                "token-mean"           sum_{i,t} m l / sum_{i,t} m          (DAPO)
                "seq-sum-norm"         sum_{i,t} m l / (B * norm_len)       (Dr. GRPO, arXiv 2503.20783)

B and sum m are the totals of the whole optimisation batch (`num_sequences`, `num_tokens`), so that
summing the losses of its micro-batches gives exactly the full-batch loss. `loss_terms` forms every per-token term
(the one place: `policy_loss` aggregates them, `token_terms` shows them). Both read their settings from one
`LossOptions` (every knob above, declared once).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ._checks import check_choice, lookup
from .kl import KL_KINDS, kl_estimate
from .knobs import flat_keys
from .masks import off_policy_mask as off_policy_keep
from .objectives import BUILT_IN, SURROGATES, SurrogateInputs, surrogate, surrogate_params, surrogate_terms

RATIO_LEVELS = ("token", "sequence", "sequence_token")
AGG_MODES = ("seq-mean-token-mean", "token-mean", "seq-sum-norm")
COV_PENALTIES = ("none", "kl_cov", "clip_cov")
LOG_RATIO_CLAMP = 20.0


@dataclass(frozen=True)
class LossOptions:
    """The settings of the loss: every number and choice `policy_loss` and `loss_terms` read, declared once
    (AlgoSettings.loss_options() fills them from a config; train/update.py builds them once per run). The surrogate's
    own settings are its parameter type's (objectives.SURROGATES), in ``surrogate_params``: a new surrogate adds no
    field here. Tensors are not options: they are the functions' own arguments."""

    eps_low: float = 0.2  # clip range [1 - eps_low, 1 + eps_high]
    eps_high: float | None = None  # None: eps_low
    ratio_level: str = "token"  # RATIO_LEVELS
    agg: str = "seq-mean-token-mean"  # AGG_MODES
    norm_len: float | None = None  # the constant L of seq-sum-norm (e.g. the max completion length)
    beta: float = 0.0  # the KL's coefficient
    kl_kind: str = "k3"  # "k1" | "k2" | "k3" (kl.py)
    kl_is_correction: bool = False  # the per-token KL weighted by the ratio (DeepSeek-V3.2)
    dual_clip: float | None = None  # None or c > 1 (the clip range's, read by the surrogates that say so)
    surrogate: str = "clip"  # a name of objectives.SURROGATES
    surrogate_params: Any = (
        None  # its parameter type's instance (a mapping of its fields is taken); None: defaults
    )
    off_policy_mask: float | None = None  # None or delta >= 0: DeepSeek-V3.2's sequence mask
    cov_penalty: str = "none"  # COV_PENALTIES (arXiv 2505.22617)
    kl_cov_coef: float = 1.0  # kl_cov's coefficient of |logp - old|
    entropy_coef: float | Tensor = 0.0  # alpha of the entropy bonus (a step's value when adaptive)

    def __post_init__(self) -> None:
        object.__setattr__(self, "surrogate_params", surrogate_params(self.surrogate, self.surrogate_params))

    def replace(self, **settings: object) -> LossOptions:
        """These options with ``settings`` changed: field names, or the surrogate's own settings by their flat
        names (sapo_tau_pos=0.5, applied to the surrogate these options end with). Another surrogate starts from
        its own defaults. An unknown name is a TypeError naming the known ones."""
        if not settings:
            return self
        fields = self.__dataclass_fields__
        own = {k: v for k, v in settings.items() if k in fields}
        if own.get("surrogate", self.surrogate) != self.surrogate and "surrogate_params" not in own:
            own["surrogate_params"] = None  # the new surrogate's defaults, not the old one's parameters
        out = dataclasses.replace(self, **own) if own else self
        rest = {k: v for k, v in settings.items() if k not in fields}
        if not rest:
            return out
        keys = flat_keys(SURROGATES[out.surrogate].params)  # {flat name: field}
        unknown = sorted(set(rest) - set(keys))
        if unknown:
            readers = [name for name, s in SURROGATES.items() if unknown[0] in flat_keys(s.params)]
            raise TypeError(
                f"unknown loss option {unknown[0]!r}; LossOptions has: {', '.join(fields)}"
                + (f"; surrogate {out.surrogate} reads {', '.join(keys)}" if keys else "")
                + (f" ({unknown[0]} is {' and '.join(readers)}'s, not {out.surrogate}'s)" if readers else "")
            )
        params = dataclasses.replace(out.surrogate_params, **{keys[k]: v for k, v in rest.items()})
        return dataclasses.replace(out, surrogate_params=params)


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    completion_mask: Tensor,
    options: LossOptions | None = None,
    *,
    ref_logprobs: Tensor | None = None,
    num_sequences: int | float | Tensor | None = None,
    num_tokens: int | float | Tensor | None = None,
    sample_logprobs: Tensor | None = None,
    entropy_mask: Tensor | None = None,
    cov_mask: Tensor | None = None,
    entropy: Tensor | None = None,
    entropy_tokens: int | float | Tensor | None = None,
    **settings: object,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped surrogate loss (+ optional KL) aggregated over one (micro-)batch; see module docstring.

    Per token:  l_{i,t} = -min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A) + beta * kl_{i,t}
    with rho chosen by `ratio_level`; with `dual_clip` = c > 1, for A < 0 the surrogate part is
    min(that, -c A) (= c |A|). The log-ratio is clamped to [-20, 20] before exp. Another `surrogate`
    replaces the first term (objectives.py); `off_policy_mask` = delta multiplies it by DeepSeek-V3.2's
    sequence mask (masks.py), from `sample_logprobs`; `kl_is_correction` weights the KL by rho.

    Normalisers (the whole optimisation batch's totals; default to this call's own):
      seq-mean-token-mean: sum_i (1/|o_i|) sum_t m l / num_sequences   (|o_i| from this call's mask)
      token-mean:          sum m l / num_tokens
      seq-sum-norm:        sum m l / (num_sequences * norm_len)
    A sequence with |o_i| = 0 contributes 0. Masked positions get exactly zero gradient and may hold
    any value (even inf / nan) in logprobs, old_logprobs, ref_logprobs and advantages.

    Args:
        logprobs: (B, T) log pi_theta of the completion tokens (carries the gradient).
        old_logprobs: (B, T) log pi_old of the same tokens (no gradient).
        advantages: (B,) per sequence (broadcast over tokens) or (B, T) per token.
        completion_mask: (B, T) 1 for every generated token up to and including the terminating EOS.
        options: the loss's settings (LossOptions; default LossOptions()):
            eps_low, eps_high: clip range [1 - eps_low, 1 + eps_high]; eps_high None -> eps_low.
            ratio_level: "token" | "sequence" | "sequence_token".
            agg: "seq-mean-token-mean" | "token-mean" | "seq-sum-norm".
            beta: KL coefficient; kl_kind: "k1" | "k2" | "k3".
            norm_len: the constant L of seq-sum-norm (e.g. the max completion length); required by it.
            dual_clip: None or c > 1.
            surrogate: a name of objectives.SURROGATES; surrogate_params: its own parameters (its registered
                type, e.g. objectives.SapoParams; None: the defaults), also given by their flat names
                (sapo_tau_pos=0.5).
            off_policy_mask: None or delta >= 0; needs sample_logprobs (B, T), the sampler's log-probs.
            kl_is_correction: multiply the per-token KL by the ratio (value 1 on-policy, its gradient is not 0).
            cov_penalty: "none" | "kl_cov" | "clip_cov" (arXiv 2505.22617) on the tokens of cov_mask (B, T) bool
                (masks.covariance_selection, chosen by the caller over the mini-batch): clip_cov takes them out of
                the surrogate, kl_cov adds kl_cov_coef * |logp - old| to theirs.
            entropy_coef: alpha of the entropy bonus (with ``entropy``).
        ref_logprobs: (B, T) log pi_ref, needed when beta > 0; when given, kl_mean is logged even if beta == 0.
        num_sequences, num_tokens: global B and sum m (python numbers or 0-d tensors).
        entropy_mask: None or (B, T) bool, the tokens top_entropy_quantile keeps (masks.high_entropy_mask, chosen
            by the caller over the whole mini-batch so that the split cannot change it).
        entropy: None or (B, T) the policy's entropy per position, with its gradient (completion_logprobs(entropy_grad=
            True)); with entropy_coef = alpha != 0 the loss gains -alpha * sum m' H / entropy_tokens, m' the mask less
            what entropy_mask leaves out and entropy_tokens the mini-batch's sum m' (entropy_bonus.py: Skywork-OR1's
            bonus, a token mean whatever agg; this call's own count by default).
        **settings: LossOptions fields by name, each replacing ``options``' (policy_loss(..., agg="token-mean")), or
            the surrogate's own settings by their flat names (LossOptions.replace).
    Returns:
        loss: () scalar to call backward on.
        metrics: detached 0-d tensors, averaged over this call's masked-in tokens: clip_frac_low
            (A < 0 and rho < 1 - eps_low), clip_frac_high (A > 0 and rho > 1 + eps_high), clip_frac, the smallest
            and largest share of a sequence's tokens clipped low / high (clip_frac_low/seq_min,
            clip_frac_high/seq_max: NaN without a sequence), ratio_mean, ratio_min, ratio_max, pg_loss (token mean of the surrogate part), kl_mean
            (if ref_logprobs), dual_clip_frac (if dual_clip), num_tokens (this call's sum m), and the share of
            tokens each mask took out: masked_frac/trust_region (dppo_*), masked_frac/off_policy (off_policy_mask),
            masked_frac/entropy (entropy_mask), masked_frac/clip_cov; cov_penalised_frac (kl_cov).
    Raises:
        ValueError: unknown ratio_level / agg / kl_kind, shape mismatch, beta > 0 without ref_logprobs,
            seq-sum-norm without norm_len, dual_clip <= 1, negative eps.
    """
    o = (options or LossOptions()).replace(**settings)
    check_choice("agg", o.agg, AGG_MODES)
    if o.agg == "seq-sum-norm" and o.norm_len is None:
        raise ValueError("agg='seq-sum-norm' needs norm_len (the constant L, e.g. the max completion length)")
    t = loss_terms(
        logprobs,
        old_logprobs,
        advantages,
        completion_mask,
        o,
        ref_logprobs=ref_logprobs,
        sample_logprobs=sample_logprobs,
        entropy_mask=entropy_mask,
        cov_mask=cov_mask,
        entropy=entropy,
    )
    mask, m, ratio, zero = t.mask, t.mask.to(t.loss.dtype), t.ratio, t.loss.new_zeros(())
    loss = aggregate_terms(
        t.loss, m, agg=o.agg, norm_len=o.norm_len, num_sequences=num_sequences, num_tokens=num_tokens
    )  # ()
    if t.entropy_bonus is not None:  # Skywork-OR1's bonus: a token mean over the mini-batch's m' tokens
        n_bonus = t.bonus_mask.sum() if entropy_tokens is None else entropy_tokens
        loss = loss - t.entropy_bonus.sum() / _at_least_one(n_bonus, t.entropy_bonus)  # ()

    with torch.no_grad():
        n_local = m.sum()  # ()
        denom = n_local.clamp(min=1)  # ()
        low, high = t.flags["low"] & mask, t.flags["high"] & mask  # (B, T) each
        metrics = {
            "clip_frac_low": low.sum() / denom,
            "clip_frac_high": high.sum() / denom,
            "clip_frac": (low | high).sum() / denom,
            "ratio_mean": torch.where(mask, ratio, zero).sum() / denom,
            "ratio_min": torch.where(n_local > 0, torch.where(mask, ratio, torch.inf).amin(), zero),
            "ratio_max": torch.where(mask, ratio, zero).amax(),
            "pg_loss": torch.where(mask, t.pg, zero).sum() / denom,
            "num_tokens": n_local,
        }
        # TRL's clip_ratio/low_min and high_max: the smallest / largest share of a sequence's tokens clipped
        per_row = m.sum(-1)  # (B,)
        rows = per_row > 0  # (B,) sequences with a token in the loss
        seq_low = low.to(m.dtype).sum(-1) / per_row.clamp(min=1)  # (B,)
        seq_high = high.to(m.dtype).sum(-1) / per_row.clamp(min=1)  # (B,)
        nan, any_row = torch.full_like(zero, float("nan")), rows.any()  # no row: NaN (no host sync)
        metrics["clip_frac_low/seq_min"] = torch.where(any_row, torch.where(rows, seq_low, torch.inf).amin(), nan)
        metrics["clip_frac_high/seq_max"] = torch.where(any_row, torch.where(rows, seq_high, -torch.inf).amax(), nan)
        if t.kl is not None:
            metrics["kl_mean"] = torch.where(mask, t.kl, zero).sum() / denom
        if o.dual_clip is not None:
            metrics["dual_clip_frac"] = (t.flags["dual"] & mask).sum() / denom
        for reason, out in t.masked.items():
            if reason != "kl_cov":
                metrics[f"masked_frac/{reason}"] = (out & mask).sum() / denom
        if "kl_cov" in t.masked:
            metrics["cov_penalised_frac"] = (t.masked["kl_cov"] & mask).sum() / denom
        metrics = {k: v.detach() for k, v in metrics.items()}
    return loss, metrics


@dataclass(frozen=True)
class LossTerms:
    """The per-token terms of `policy_loss` before aggregation, all (B, T) and 0 outside `mask` (see loss_terms)."""

    mask: Tensor  # bool, the completion mask
    ratio: Tensor  # rho at the loss's ratio level
    pg: Tensor  # the surrogate after the masks (and KL-Cov's penalty): the policy-gradient term
    kl: (
        Tensor | None
    )  # the KL estimate to the reference (rho-weighted with kl_is_correction); None without one
    loss: Tensor  # pg + beta * kl: what `aggregate_terms` reduces
    flags: dict[str, Tensor]  # bool: "low" / "high" / "dual" clipped (objectives.surrogate_terms)
    masked: dict[str, Tensor]  # reason -> bool, the tokens a mask acted on (MASK_REASONS)
    entropy_bonus: Tensor | None = None  # entropy_coef * H on bonus_mask, 0 elsewhere; None without the bonus
    bonus_mask: Tensor | None = (
        None  # bool, the tokens the bonus acts on: the mask less what entropy_mask drops
    )


MASK_REASONS = ("trust_region", "off_policy", "entropy", "clip_cov", "kl_cov")
"""Why a token's surrogate was changed: dppo_* left the trust region, DeepSeek-V3.2's off-policy sequence mask,
top_entropy_quantile, Clip-Cov (all four: taken out of the surrogate), KL-Cov (penalised, not taken out)."""


def loss_terms(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    completion_mask: Tensor,
    options: LossOptions | None = None,
    *,
    ref_logprobs: Tensor | None = None,
    sample_logprobs: Tensor | None = None,
    entropy_mask: Tensor | None = None,
    cov_mask: Tensor | None = None,
    entropy: Tensor | None = None,
    **settings: object,
) -> LossTerms:
    """Every per-token term of `policy_loss` (arguments and formulas there), before aggregation: the one place
    they are formed, so that the loss and the per-token view (token_terms.py: the run explorer, the saved
    rollouts) cannot differ. Carries the gradient of `logprobs`. The aggregation's options (agg, norm_len) are
    not read here.

    Raises:
        ValueError: unknown ratio_level / kl_kind / surrogate / cov_penalty, shape mismatch, beta > 0 without
            ref_logprobs, dual_clip <= 1, negative eps, a mask without its input.
    """
    o = (options or LossOptions()).replace(**settings)
    eps_low, eps_high, ratio_level, beta, kl_kind = o.eps_low, o.eps_high, o.ratio_level, o.beta, o.kl_kind
    surrogate_name, dual_clip, cov_penalty = o.surrogate, o.dual_clip, o.cov_penalty
    off_policy_mask = o.off_policy_mask
    check_choice("ratio_level", ratio_level, RATIO_LEVELS)
    check_choice("kl_kind", kl_kind, KL_KINDS)
    check_choice("cov_penalty", cov_penalty, COV_PENALTIES)
    if cov_penalty != "none" and cov_mask is None:
        raise ValueError(f"cov_penalty={cov_penalty!r} needs cov_mask (masks.covariance_selection's tokens)")
    if surrogate(surrogate_name).token_ratio and ratio_level != "token":
        raise ValueError(f"surrogate={surrogate_name!r} builds its own token ratio; set ratio_level='token'")
    if off_policy_mask is not None and sample_logprobs is None:
        raise ValueError(
            "off_policy_mask needs sample_logprobs (the sampler's log-probs of the completion tokens)"
        )
    eps_high = eps_low if eps_high is None else eps_high
    if eps_low < 0 or eps_high < 0:
        raise ValueError(f"clip ranges must be >= 0, got eps_low={eps_low}, eps_high={eps_high}")
    if beta > 0 and ref_logprobs is None:
        raise ValueError(f"beta={beta} > 0 needs ref_logprobs (or set beta=0 to drop the KL term)")
    if dual_clip is not None and not dual_clip > 1:
        raise ValueError(f"dual_clip must be None or a constant c > 1, got {dual_clip}")
    shape = logprobs.shape
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs must be (B, T), got shape {tuple(shape)}")
    for name, t in (
        ("old_logprobs", old_logprobs),
        ("completion_mask", completion_mask),
        ("ref_logprobs", ref_logprobs),
        ("sample_logprobs", sample_logprobs),
        ("entropy_mask", entropy_mask),
        ("cov_mask", cov_mask),
        ("entropy", entropy),
    ):
        if t is not None and t.shape != shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {tuple(shape)} like logprobs")
    if advantages.shape not in (shape[:1], shape):
        raise ValueError(
            f"advantages must be (B,)={tuple(shape[:1])} or (B, T)={tuple(shape)}, got {tuple(advantages.shape)}"
        )

    mask = completion_mask.to(torch.bool)  # (B, T)
    zero = logprobs.new_zeros(())  # ()
    # Sanitise masked positions first: torch.where passes exactly zero gradient to the unselected
    # branch, so garbage (even inf/nan) in padding cannot leak into the loss or its gradient.
    logp = torch.where(mask, logprobs, zero)  # (B, T)
    old = torch.where(mask, old_logprobs.to(logp.dtype), zero)  # (B, T)
    adv = advantages.to(logp.dtype)
    adv = adv.unsqueeze(-1).expand(shape) if adv.dim() == 1 else adv  # (B, T)
    adv = torch.where(mask, adv, zero)  # (B, T)
    m = mask.to(logp.dtype)  # (B, T)

    ratio = _ratio(logp, old, m, ratio_level)  # (B, T)

    inputs = SurrogateInputs(ratio, logp, old, adv, m, eps_low, eps_high, dual_clip)
    pg, flags = surrogate_terms(surrogate_name, inputs, o.surrogate_params)  # (B, T) each
    masked = {}  # reason -> (B, T) bool, the tokens a mask acted on
    if "trust_region" in flags:
        masked["trust_region"] = flags["trust_region"] & mask
    if off_policy_mask is not None:
        keep = off_policy_keep(adv, logp, sample_logprobs, mask, off_policy_mask)  # (B, T)
        masked["off_policy"] = ~keep & mask
        pg = pg * keep  # (B, T) the normaliser still counts the dropped tokens, as TRL's
    if entropy_mask is not None:
        masked["entropy"] = ~entropy_mask.to(torch.bool) & mask
        pg = pg * entropy_mask  # (B, T)
    if cov_penalty == "clip_cov":
        masked["clip_cov"] = cov_mask.to(torch.bool) & mask
        pg = pg * ~masked["clip_cov"]  # (B, T)
    elif cov_penalty == "kl_cov":  # |log rho| on the highest-covariance tokens keeps them near pi_old
        masked["kl_cov"] = cov_mask.to(torch.bool) & mask
        pg = pg + o.kl_cov_coef * (logp - old).abs() * cov_mask  # (B, T)
    pg = torch.where(mask, pg, zero)  # (B, T)
    per_token = pg  # (B, T)

    kl = None
    if ref_logprobs is not None:
        ref = torch.where(mask, ref_logprobs.to(logp.dtype), zero)  # (B, T)
        kl = kl_estimate(logp, ref, kl_kind)  # (B, T), 0 at masked positions
        if o.kl_is_correction:  # DeepSeek-V3.2: E_old[rho k3] is the KL of the current policy, not of pi_old
            kl = ratio * kl  # (B, T)
        kl = torch.where(mask, kl, zero)  # (B, T)
        if beta > 0:
            per_token = per_token + beta * kl  # (B, T)
    per_token = torch.where(mask, per_token, zero)  # (B, T)

    bonus = bonus_mask = None
    if o.entropy_coef != 0:
        if entropy is None:
            raise ValueError(
                f"entropy_coef={o.entropy_coef} needs entropy (B, T), the policy's, with its gradient"
            )
        bonus_mask = mask if entropy_mask is None else mask & entropy_mask.to(torch.bool)  # (B, T)
        bonus = o.entropy_coef * torch.where(bonus_mask, entropy.to(logp.dtype), zero)  # (B, T)
    ratio = torch.where(mask, ratio, ratio.new_ones(()))  # (B, T)
    return LossTerms(mask, ratio, pg, kl, per_token, flags, masked, bonus, bonus_mask)


def gradient_free_rows(advantages: Tensor, options: LossOptions) -> Tensor | None:
    """(B,) bool: the rows whose loss terms, and so gradient, are exactly 0 under `policy_loss` with ``options``:
    every advantage of the row is 0 (advantages (B,) or (B, T)), and no term acts without the advantage. None when
    one may: a KL term in the loss (beta > 0), the entropy bonus, KL-Cov's penalty, or a surrogate not built in
    (objectives.BUILT_IN). The normalisers (num_sequences, num_tokens) still count such rows: leaving them out of the
    forward and backward passes (train.update, optim.skip_flat_rows) changes the gradient only by float rounding."""
    if (
        options.beta > 0
        or not (isinstance(options.entropy_coef, (int, float)) and options.entropy_coef == 0)
        or options.cov_penalty == "kl_cov"
        or options.surrogate not in BUILT_IN
    ):
        return None
    zero = advantages == 0  # (B,) or (B, T)
    return zero if zero.dim() == 1 else zero.all(dim=-1)  # (B,)


def aggregate_terms(
    per_token: Tensor,
    completion_mask: Tensor,
    *,
    agg: str = "seq-mean-token-mean",
    norm_len: float | None = None,
    num_sequences: int | float | Tensor | None = None,
    num_tokens: int | float | Tensor | None = None,
) -> Tensor:
    """() the loss `policy_loss` makes of per-token terms (B, T) (0 outside the mask), module docstring:

      seq-mean-token-mean  sum_i (1/|o_i|) sum_t m l / num_sequences   (a row with |o_i| = 0 gives 0)
      token-mean           sum m l / num_tokens
      seq-sum-norm         sum m l / (num_sequences * norm_len)

    num_sequences / num_tokens default to these rows' own (B and sum m); token-mean floors num_tokens at 1."""
    check_choice("agg", agg, AGG_MODES)
    m = completion_mask.to(per_token.dtype)  # (B, T)
    terms = per_token * m  # (B, T)
    n_seq = per_token.shape[0] if num_sequences is None else num_sequences
    if agg == "seq-mean-token-mean":
        return (terms.sum(-1) / m.sum(-1).clamp(min=1)).sum() / n_seq  # ()
    if agg == "token-mean":
        n_tok = m.sum() if num_tokens is None else num_tokens
        return terms.sum() / _at_least_one(n_tok, terms)  # ()
    if norm_len is None:
        raise ValueError("agg='seq-sum-norm' needs norm_len (the constant L, e.g. the max completion length)")
    return terms.sum() / (n_seq * norm_len)  # ()


def importance_ratio(
    logprobs: Tensor, old_logprobs: Tensor, completion_mask: Tensor, level: str = "token"
) -> Tensor:
    """The importance ratio used by `policy_loss`, per token.

      "token":          rho_{i,t} = exp(logp_{i,t} - old_{i,t})
      "sequence":       s_i = exp((1/|o_i|) sum_t m_{i,t} (logp_{i,t} - old_{i,t})), the geometric mean
                        of the token ratios, repeated on every token (GSPO, arXiv 2507.18071 eq. 7)
      "sequence_token": sg[s_i] * exp(logp_{i,t} - sg[logp_{i,t}]): value s_i, gradient of each
                        token's own log-prob (GSPO-token, arXiv 2507.18071 eq. 13)
    The log-ratio is clamped to [-20, 20] before exp. Masked-out positions get ratio 1 (token level)
    and no gradient.

    Args:
        logprobs, old_logprobs, completion_mask: (B, T).
    Returns:
        (B, T) ratios.
    """
    check_choice("level", level, RATIO_LEVELS)
    mask = completion_mask.to(torch.bool)  # (B, T)
    zero = logprobs.new_zeros(())  # ()
    logp = torch.where(mask, logprobs, zero)  # (B, T)
    old = torch.where(mask, old_logprobs.to(logp.dtype), zero)  # (B, T)
    return _ratio(logp, old, mask.to(logp.dtype), level)


def _ratio(logp: Tensor, old: Tensor, m: Tensor, level: str) -> Tensor:
    """importance_ratio on already-sanitised inputs (0 at masked positions). All (B, T)."""
    log_ratio = logp - old  # (B, T), 0 at masked positions
    if level != "token":
        seq_log_ratio = log_ratio.sum(-1) / m.sum(-1).clamp(min=1)  # (B,) log of the geometric mean
        if level == "sequence":
            log_ratio = seq_log_ratio.unsqueeze(-1).expand_as(logp)  # (B, T) same value on every token
        else:  # GSPO-token: value sg[s_i], gradient of each token's own logp
            log_ratio = seq_log_ratio.detach().unsqueeze(-1) + logp - logp.detach()  # (B, T)
    log_ratio = log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # (B, T)
    return torch.exp(log_ratio)  # (B, T)


def _at_least_one(n: int | float | Tensor, like: Tensor) -> Tensor:
    """The normaliser as a tensor, floored at 1 so an all-masked batch gives loss 0, not nan."""
    return torch.as_tensor(n, dtype=like.dtype, device=like.device).clamp(min=1)


# Policy losses by name. A loss is called for each micro-batch as
#   fn(logprobs, old_logprobs, advantages, completion_mask, *, options, ref_logprobs, num_sequences, num_tokens,
#      sample_logprobs, entropy_mask / cov_mask when those masks are on, and entropy (with its gradient) /
#      entropy_tokens when the entropy bonus is on) -> (loss, metrics)
# where options is the run's LossOptions (AlgoSettings.loss_options(): eps_low, eps_high, ratio_level, dual_clip,
# agg, norm_len, beta, kl_kind, surrogate, ..., entropy_coef), with the shapes of `policy_loss` (advantages (B,)
# or (B, T)); it must normalise by the global num_sequences / num_tokens so micro-batches sum to the mini-batch
# loss. metrics: detached 0-d tensors, averaged over the call's tokens (they are logged under their own names).
# Take **kwargs to ignore the arguments you do not use. Add one with `register_loss`, or name it in YAML as
# "package.module:function".
LOSSES: dict[str, Callable[..., tuple[Tensor, dict[str, Tensor]]]] = {"clipped": policy_loss}


def register_loss(name: str, fn: Callable[..., tuple[Tensor, dict[str, Tensor]]]) -> None:
    """Make `fn` available as `algo.loss: <name>` (contract above LOSSES)."""
    LOSSES[name] = fn


def get_loss(name: str) -> Callable[..., tuple[Tensor, dict[str, Tensor]]]:
    """The loss registered as `name`, or "package.module:function" imported on demand."""
    return lookup("loss", name, LOSSES)
