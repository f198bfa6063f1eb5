"""The per-token surrogate of the policy loss, by name: the hard clip of PPO/GRPO and its second generation.
`policy_loss` (loss.py) chooses one with `surrogate=` and aggregates it like any other; `token_terms` shows it.
Each is one function registered in SURROGATES with what it reads (its own parameter type, the shared clip range)
and needs (a token ratio); every list of who reads what (the settings' checks, the preset and docs tables) is
read from those entries.

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

A new surrogate is a function `fn(x: SurrogateInputs, params) -> (pg, flags)` and one `register_surrogate` call;
its settings are a frozen dataclass of `knob()` fields (their flat names become algo.<name> settings), given to
it as `params`. The config's algo section lists each flat name too (config/schema.py AlgoConfig, a line each:
the config imports no torch, so it cannot read this registry).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from .knobs import declare, knob

CLIP_RANGE = ("eps_low", "eps_high", "dual_clip")
"""The clip range, settings shared by the surrogates that read them (each entry's `reads`)."""


@dataclass(frozen=True)
class SurrogateInputs:
    """What every surrogate is given: (B, T) tensors, 0 at masked positions, and the shared clip range."""

    ratio: Tensor  # rho at the loss's ratio level (token for the token_ratio ones)
    logp: Tensor  # log pi, with its gradient
    old: Tensor  # log pi_old
    adv: Tensor  # the advantages, broadcast to tokens
    m: Tensor  # the float completion mask
    eps_low: float
    eps_high: float
    dual_clip: float | None = None


Flags = dict[str, Tensor]
"""bool (B, T) by name: "low" / "high" (the tokens whose weight was clipped: clip_frac_low / _high), "dual" (capped by
the dual clip), "trust_region" (masked for leaving the trust region: masked_frac/trust_region)."""


@dataclass(frozen=True)
class Surrogate:
    """A surrogate's entry: its function and what it reads and needs."""

    fn: Callable[[SurrogateInputs, Any], tuple[Tensor, Flags]]
    params: type | None = None  # its own settings (a frozen dataclass of knob() fields), None: it has none
    reads: tuple[str, ...] = ()  # which of CLIP_RANGE it reads
    token_ratio: bool = False  # builds its own token ratio: algo.ratio_level must stay "token"
    summary: str = (
        ""  # the preset table's words: format fields clip, level, lo, hi and the params' field names
    )


SURROGATES: dict[str, Surrogate] = {}


def register_surrogate(
    name: str,
    fn: Callable[[SurrogateInputs, Any], tuple[Tensor, Flags]],
    *,
    params: type | None = None,
    reads: tuple[str, ...] = (),
    token_ratio: bool = False,
    summary: str = "",
) -> None:
    """Make ``fn`` available as `algo.surrogate: <name>`. ``params``: its settings type, whose knob() fields become
    algo.* settings by their flat names (the same type may serve two surrogates); ``reads``: which of CLIP_RANGE it
    reads; ``token_ratio``: it builds its own token ratio (refused at a sequence ratio level)."""
    unknown = sorted(set(reads) - set(CLIP_RANGE))
    if unknown:
        raise ValueError(f"surrogate {name!r} reads {unknown}: not among the shared settings {CLIP_RANGE}")
    if params is not None:
        declare(params)
    SURROGATES[name] = Surrogate(fn, params, tuple(reads), token_ratio, summary or name)


def surrogate_params(name: str, given: Any = None) -> Any:
    """The parameters of surrogate ``name``: ``given`` (its type; a mapping of its fields, as saved rollouts hold
    them), or its type's defaults for None. None for a surrogate without parameters."""
    cls = surrogate(name).params
    if cls is None:
        if given:
            raise ValueError(f"surrogate={name!r} has no parameters; got {given!r}")
        return None
    if given is None:
        return cls()
    if isinstance(given, dict):
        return cls(**given)
    if not isinstance(given, cls):
        raise TypeError(f"surrogate={name!r} takes {cls.__name__} parameters, got {type(given).__name__}")
    return given


def surrogate(name: str) -> Surrogate:
    """The entry of ``name``; ValueError naming the choices."""
    if name not in SURROGATES:
        raise ValueError(f"surrogate={name!r} is not valid; choose one of {', '.join(map(repr, SURROGATES))}")
    return SURROGATES[name]


def surrogate_terms(name: str, x: SurrogateInputs, params: Any = None) -> tuple[Tensor, Flags]:
    """(pg, flags): the per-token loss l (B, T) of surrogate ``name`` (module docstring) on ``x`` with ``params``
    (its type; None: the defaults), and its bool (B, T) flags, every one of Flags present (False where unset)."""
    entry = surrogate(name)
    pg, flags = entry.fn(x, surrogate_params(name, params))
    none = torch.zeros_like(x.ratio, dtype=torch.bool)  # (B, T)
    return pg, {"low": none, "high": none, "dual": none} | flags


def clipped_surrogate(
    ratio: Tensor, adv: Tensor, eps_low: float, eps_high: float, dual_clip: float | None = None
) -> tuple[Tensor, Tensor]:
    """(pg, dual_active), each (B, T), from (B, T) ratios and advantages:

      pg = -min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A), then for A < 0 with dual_clip = c:
           min(pg, -c A) (= c |A|, Dual-clip PPO);
      dual_active: where that cap bites (all False without dual_clip).

    The one place the clipped surrogate is written: the "clip" surrogate uses it."""
    lo, hi = 1.0 - eps_low, 1.0 + eps_high
    pg = torch.maximum(-adv * ratio, -adv * ratio.clamp(lo, hi))  # (B, T)
    dual_active = torch.zeros_like(pg, dtype=torch.bool)  # (B, T)
    if dual_clip is not None:
        cap = -adv * dual_clip  # (B, T) = c |A| where A < 0
        dual_active = (adv < 0) & (cap < pg)  # (B, T)
        pg = torch.where(adv < 0, torch.minimum(pg, cap), pg)  # (B, T)
    return pg, dual_active


def clip(x: SurrogateInputs, _: None) -> tuple[Tensor, Flags]:
    """PPO / GRPO: -min(rho A, clip(rho) A), dual-clipped for A < 0."""
    pg, dual = clipped_surrogate(x.ratio, x.adv, x.eps_low, x.eps_high, x.dual_clip)  # (B, T) each
    low = (x.adv < 0) & (x.ratio < 1.0 - x.eps_low)  # (B, T)
    high = (x.adv > 0) & (x.ratio > 1.0 + x.eps_high)  # (B, T)
    return pg, {"low": low, "high": high, "dual": dual}


def cispo(x: SurrogateInputs, _: None) -> tuple[Tensor, Flags]:
    """CISPO: -sg(clip(rho)) A logp."""
    weight = x.ratio.clamp(1.0 - x.eps_low, 1.0 + x.eps_high).detach()  # (B, T) sg(clip(rho))
    flags = {"low": x.ratio < 1.0 - x.eps_low, "high": x.ratio > 1.0 + x.eps_high}
    return -weight * x.adv * x.logp, flags  # (B, T)


@dataclass(frozen=True)
class SapoParams:
    tau_pos: float = knob(
        1.0,
        "SAPO's gate temperature for tokens with A > 0 (TRL sapo_temperature_pos).",
        key="sapo_tau_pos",
        interval="(0, inf)",
        example=1.0,
    )
    tau_neg: float = knob(
        1.05,
        "SAPO's gate temperature for tokens with A <= 0 (TRL sapo_temperature_neg).",
        key="sapo_tau_neg",
        interval="(0, inf)",
        example=1.05,
    )


def sapo(x: SurrogateInputs, p: SapoParams) -> tuple[Tensor, Flags]:
    """SAPO: -(4 / tau) sigmoid(tau (rho - 1)) A."""
    tau = torch.where(x.adv > 0, x.ratio.new_tensor(p.tau_pos), x.ratio.new_tensor(p.tau_neg))  # (B, T)
    return -(4.0 / tau) * torch.sigmoid(tau * (x.ratio - 1.0)) * x.adv, {}  # (B, T)


def gmpo(x: SurrogateInputs, _: None) -> tuple[Tensor, Flags]:
    """GMPO: -A_i times the geometric mean of the log-clipped token ratios."""
    log_ratio = (x.logp - x.old).clamp(-20.0, 20.0)  # (B, T)
    sign = torch.sign(x.adv)  # (B, T)
    clipped = log_ratio.clamp(-x.eps_low, x.eps_high)  # (B, T)
    kept = sign * torch.minimum(sign * log_ratio, sign * clipped)  # (B, T) the pessimistic side
    n = x.m.sum(-1).clamp(min=1)  # (B,)
    seq_ratio = torch.exp((kept * x.m).sum(-1) / n)  # (B,) geometric mean of the clipped ratios
    seq_adv = (x.adv * x.m).sum(-1) / n  # (B,) the sequence's advantage (per-token A averaged)
    cut = clipped != log_ratio  # (B, T)
    flags = {"low": cut & (x.adv < 0), "high": cut & (x.adv > 0)}
    return (-seq_adv * seq_ratio).unsqueeze(-1).expand_as(x.logp), flags  # (B, T) same on every token


@dataclass(frozen=True)
class DppoParams:
    is_cap: float = knob(
        20.0,
        "DPPO: cap C of the stop-gradient IS weight min(ratio, C) (verl clip_ratio_c).",
        interval="[1, inf)",
        example=20.0,
    )


def _dppo(x: SurrogateInputs, p: DppoParams, kind: str) -> tuple[Tensor, Flags]:
    """DPPO: -A sg(min(rho, C)) logp v, v the trust-region mask from the token probabilities' TV or binary KL."""
    eps_low, eps_high = x.eps_low, x.eps_high
    with torch.no_grad():
        p_new, p_old = x.logp.exp(), x.old.exp()  # (B, T) token probabilities
        if kind == "tv":
            up, down = p_new - p_old <= eps_high, p_new - p_old >= -eps_low  # (B, T) each
        else:
            d = p_old * (x.old - x.logp) + (1 - p_old) * torch.log(
                (1.0 - p_old + 1e-8) / (1.0 - p_new + 1e-8)
            )  # (B, T)
            up, down = (d <= eps_high) | (p_new <= p_old), (d <= eps_low) | (p_new >= p_old)  # (B, T) each
        valid = torch.where(x.adv > 0, up, down)  # (B, T)
        weight = x.ratio.clamp(max=p.is_cap) * valid  # (B, T) sg(min(rho, C)) v
    flags = {"trust_region": ~valid, "high": valid & (x.ratio > p.is_cap)}
    return -x.adv * weight * x.logp, flags  # (B, T)


def dppo_tv(x: SurrogateInputs, p: DppoParams) -> tuple[Tensor, Flags]:
    """DPPO-Binary-TV: the mask from p - p_old."""
    return _dppo(x, p, "tv")


def dppo_kl(x: SurrogateInputs, p: DppoParams) -> tuple[Tensor, Flags]:
    """DPPO-Binary-KL: the mask from the binary KL of the token's probability."""
    return _dppo(x, p, "kl")


@dataclass(frozen=True)
class VespoParams:
    k_pos: float = knob(
        2.0,
        "VESPO: exponent k for A >= 0 (TRL vespo_k_pos).",
        key="vespo_k_pos",
        interval="[0, inf)",
        example=2.0,
    )
    lambda_pos: float = knob(
        3.0, "VESPO: decay lambda for A >= 0 (TRL vespo_lambda_pos).", key="vespo_lambda_pos", interval="[0, inf)",
        example=3.0,
    )  # fmt: skip
    k_neg: float = knob(
        3.0,
        "VESPO: exponent k for A < 0 (TRL vespo_k_neg).",
        key="vespo_k_neg",
        interval="[0, inf)",
        example=3.0,
    )
    lambda_neg: float = knob(
        2.0, "VESPO: decay lambda for A < 0 (TRL vespo_lambda_neg).", key="vespo_lambda_neg", interval="[0, inf)",
        example=2.0,
    )  # fmt: skip


def vespo(x: SurrogateInputs, p: VespoParams) -> tuple[Tensor, Flags]:
    """VESPO: -sg(phi(w_i)) A logp, phi the gamma shape of the sequence's IS weight."""
    logp, adv = x.logp, x.adv
    with torch.no_grad():
        log_w = ((logp - x.old).clamp(-20.0, 20.0) * x.m).sum(-1, keepdim=True)  # (B, 1) log of the product
        log_w = log_w.clamp(math.log(1e-8), 20.0)  # (B, 1)
        nonneg = adv >= 0  # (B, T)
        k = torch.where(nonneg, logp.new_tensor(p.k_pos), logp.new_tensor(p.k_neg))  # (B, T)
        lam = torch.where(nonneg, logp.new_tensor(p.lambda_pos), logp.new_tensor(p.lambda_neg))
        lam = lam.clamp(min=1e-4)  # (B, T)
        phi = torch.exp(lam + k * log_w - lam * log_w.exp())  # (B, T) phi(w) = e^lambda w^k e^(-lambda w)
        phi = phi.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)  # (B, T)
    return -phi * adv * logp, {}  # (B, T)


CLIPPED = ("eps_low", "eps_high")
register_surrogate("clip", clip, reads=CLIP_RANGE, summary="{level}, {clip}")
register_surrogate("cispo", cispo, reads=CLIPPED, summary="CISPO: sg(clip(rho, {lo:g}, {hi:g})) A logp")
register_surrogate("sapo", sapo, params=SapoParams, summary="SAPO gate, tau {tau_pos:g} / {tau_neg:g}")
register_surrogate(
    "gmpo",
    gmpo,
    reads=CLIPPED,
    token_ratio=True,
    summary="GMPO: geometric mean of token ratios, log-clip {clip}",
)
register_surrogate(
    "dppo_tv", dppo_tv, params=DppoParams, reads=CLIPPED, token_ratio=True,
    summary="DPPO-TV mask, p - p_old within {clip}, IS cap {is_cap:g}",
)  # fmt: skip
register_surrogate(
    "dppo_kl", dppo_kl, params=DppoParams, reads=CLIPPED, token_ratio=True,
    summary="DPPO-KL mask, binary KL <= {clip}, IS cap {is_cap:g}",
)  # fmt: skip
register_surrogate(
    "vespo", vespo, params=VespoParams, token_ratio=True,
    summary="VESPO gamma weight of the sequence ratio, k {k_pos:g} / {k_neg:g}, lambda {lambda_pos:g} / {lambda_neg:g}",
)  # fmt: skip

BUILT_IN = frozenset(SURROGATES)
"""The surrogates above: each is a multiple of the advantage A per token (gmpo: of the row's mean A), so a row whose
advantages are all 0 has loss 0 and gradient exactly 0 under it (loss.gradient_free_rows; a surrogate registered
later is not assumed to be)."""
