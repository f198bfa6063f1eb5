"""The algorithm's settings: one frozen, typed object with a part per independent axis.

    AlgoSettings
      advantage  AdvantageSettings  which estimator, its std convention
      ratio      RatioSettings      token / sequence ratio, the surrogate (clip, cispo, sapo, ...), its range
      kl         KLSettings         KL in the loss (beta, estimator), KL in the reward (k1 coefficient)
      loss       LossSettings       aggregation of the per-token loss into one scalar, its constant
      masks      MaskSettings       masks on the surrogate: DeepSeek-V3.2's off-policy sequence mask, top entropy
      entropy    EntropySettings    the entropy bonus and its adaptive coefficient (Skywork-OR1)
      batch      BatchSettings      DAPO's batch-level pieces: dynamic sampling, overlong shaping/filtering
      gae        GAESettings        PPO's GAE discount and lambda (estimators that read a critic's values)

Presets (presets.py) are AlgoSettings instances. Every leaf has one flat name, the one used in YAML and
on the command line (`algo.eps_high=0.28`), given by `knob(key=...)` or else the field name; the config's
`algo` section, its choices and its ranges are read from here (`KNOBS`), not typed out again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from grpokit.core.intervals import in_interval

from .advantages import ADVANTAGE_ALIASES, ADVANTAGES, CRITIC_ADVANTAGES
from .kl import KL_KINDS
from .loss import AGG_MODES, COV_PENALTIES, LOSSES, RATIO_LEVELS, LossOptions
from .multi_reward import REWARD_AGGREGATIONS
from .objectives import SURROGATES, TOKEN_ONLY


def knob(
    default: Any,
    doc: str,
    *,
    key: str | None = None,
    choices: Callable[[], tuple[str, ...]] | None = None,
    interval: str | None = None,
    example: Any = None,
    meaning: str = "",
    user_defined: bool = False,
) -> Any:
    """A settings field with its one-line doc, its flat name, and what values it allows: `choices()`
    (names; with `user_defined` a registry's, where "package.module:function" names your own) or a
    numeric `interval` ("[0, inf)"), with an example value and a note on what the edge value means."""
    meta = {"doc": doc, "key": key, "choices": choices, "interval": interval, "example": example}
    return field(default=default, metadata={**meta, "meaning": meaning, "user_defined": user_defined})


def _advantage_names() -> tuple[str, ...]:
    return (*ADVANTAGES, *ADVANTAGE_ALIASES)  # read now: register_advantage may have added some


def _ratio_levels() -> tuple[str, ...]:
    return RATIO_LEVELS


def _surrogates() -> tuple[str, ...]:
    return SURROGATES


def _reward_aggregations() -> tuple[str, ...]:
    return REWARD_AGGREGATIONS


def _cov_penalties() -> tuple[str, ...]:
    return COV_PENALTIES


def _agg_modes() -> tuple[str, ...]:
    return AGG_MODES


def _loss_names() -> tuple[str, ...]:
    return tuple(LOSSES)  # read now: register_loss may have added some


def _kl_kinds() -> tuple[str, ...]:
    return KL_KINDS


@dataclass(frozen=True)
class AdvantageSettings:
    estimator: str = knob(
        "group_std",
        "Advantage estimator of grpokit.algos.ADVANTAGES (group_std, group_centre, leave_one_out, token_whiten, ...) "
        "or your own as package.module:function.",
        key="advantage",
        choices=_advantage_names,
        user_defined=True,
    )
    std_ddof: int = knob(
        1,
        "Degrees of freedom of the group std of the std-scaled estimators (1 = unbiased, as TRL/verl).",
        interval="[0, 1]",
        example=1,
    )
    std_eps: float = knob(
        1e-6, "Added to the std before dividing (TRL: 1e-4).", interval="[0, inf)", example=1e-4
    )
    reward_aggregation: str = knob(
        "sum_then_normalize",
        "Several rewards: sum_then_normalize (the weighted sum goes to the estimator) | normalize_then_sum (GDPO: "
        "each reward normalised within its group first, std_eps 1e-4; TRL multi_objective_aggregation).",
        choices=_reward_aggregations,
    )


@dataclass(frozen=True)
class RatioSettings:
    level: str = knob(
        "token",
        "Level of the importance ratio: token | sequence (GSPO) | sequence_token (GSPO-token).",
        key="ratio_level",
        choices=_ratio_levels,
    )
    surrogate: str = knob(
        "clip",
        "Per-token surrogate: clip (PPO/GRPO) | cispo | sapo | gmpo | dppo_tv | dppo_kl | vespo (grpokit.algos.objectives); "
        "gmpo reads eps_low / eps_high as log-ratio bounds, dppo_* as divergence bounds.",
        choices=_surrogates,
    )
    eps_low: float = knob(
        0.2,
        "Lower clip range: ratio >= 1 - eps_low.",
        interval="[0, 1]",
        example=0.2,
        meaning="1 = no lower clip (cispo)",
    )
    eps_high: float = knob(
        0.2,
        "Upper clip range: ratio <= 1 + eps_high (DAPO clip-higher).",
        interval="[0, inf)",
        example=0.28,
    )
    sapo_tau_pos: float = knob(
        1.0,
        "SAPO's gate temperature for tokens with A > 0 (TRL sapo_temperature_pos).",
        interval="(0, inf)",
        example=1.0,
    )
    sapo_tau_neg: float = knob(
        1.05,
        "SAPO's gate temperature for tokens with A <= 0 (TRL sapo_temperature_neg).",
        interval="(0, inf)",
        example=1.05,
    )
    vespo_k_pos: float = knob(
        2.0, "VESPO: exponent k for A >= 0 (TRL vespo_k_pos).", interval="[0, inf)", example=2.0
    )
    vespo_lambda_pos: float = knob(
        3.0, "VESPO: decay lambda for A >= 0 (TRL vespo_lambda_pos).", interval="[0, inf)", example=3.0
    )
    vespo_k_neg: float = knob(
        3.0, "VESPO: exponent k for A < 0 (TRL vespo_k_neg).", interval="[0, inf)", example=3.0
    )
    vespo_lambda_neg: float = knob(
        2.0, "VESPO: decay lambda for A < 0 (TRL vespo_lambda_neg).", interval="[0, inf)", example=2.0
    )
    is_cap: float = knob(
        20.0,
        "DPPO: cap C of the stop-gradient IS weight min(ratio, C) (verl clip_ratio_c).",
        interval="[1, inf)",
        example=20.0,
    )
    dual_clip: float | None = knob(
        None,
        "Dual-clip constant c > 1 for negative advantages (None = off).",
        interval="(1, inf)",
        example=3.0,
    )


@dataclass(frozen=True)
class KLSettings:
    beta: float = knob(
        0.0,
        "KL coefficient to the frozen reference in the loss (0, with no KL in the reward: no reference model).",
        interval="[0, inf)",
        example=0.04,
        meaning="0 = no KL in the loss",
    )
    kind: str = knob(
        "k3",
        "k1 | k2 | k3: estimator of the KL loss and of the logged kl metric.",
        key="kl_kind",
        choices=_kl_kinds,
    )
    reward_coef: float = knob(
        0.0,
        "KL in the reward: -kl_reward_coef * k1 on every token's reward, as PPO / REINFORCE++ (0 = none).",
        key="kl_reward_coef",
        interval="[0, inf)",
        example=0.01,
        meaning="0 = no KL in the reward",
    )
    is_correction: bool = knob(
        False,
        "Weight the KL of the loss by the importance ratio, rho * kl: DeepSeek-V3.2's unbiased estimate (TRL "
        "use_bias_correction_kl).",
        key="kl_is_correction",
    )


@dataclass(frozen=True)
class MaskSettings:
    off_policy_mask: float | None = knob(
        None,
        "DeepSeek-V3.2's off-policy sequence mask: drop sequences with A < 0 whose mean KL to the sampler exceeds "
        "this delta (TRL off_policy_mask_threshold; None = off).",
        interval="[0, inf)",
        example=0.5,
    )
    top_entropy_quantile: float = knob(
        1.0,
        "Train only the tokens in the top quantile of entropy of each mini-batch (arXiv 2506.01939: 0.2; TRL "
        "top_entropy_quantile). The entropies are the policy's before the update (one extra forward pass).",
        interval="[0, 1]",
        example=0.2,
        meaning="1 = every token",
    )
    cov_penalty: str = knob(
        "none",
        "Entropy control by covariance (arXiv 2505.22617): none | kl_cov (|log ratio| penalty on the highest "
        "Cov(logp, A) tokens) | clip_cov (a random few with Cov in (clip_cov_lb, clip_cov_ub) get no gradient).",
        choices=_cov_penalties,
    )
    cov_ratio: float = knob(
        2e-4,
        "Share r of the loss tokens KL-Cov / Clip-Cov act on (verl: 2e-4).",
        interval="(0, 1]",
        example=2e-3,
    )
    kl_cov_coef: float = knob(
        1.0, "KL-Cov's coefficient of |logp - old| (verl ppo_kl_coef).", interval="[0, inf)", example=1.0
    )
    clip_cov_lb: float = knob(
        1.0, "Clip-Cov's lower covariance bound (verl: 1).", interval="(-inf, inf)", example=1.0
    )
    clip_cov_ub: float = knob(
        5.0, "Clip-Cov's upper covariance bound (verl: 5).", interval="(-inf, inf)", example=5.0
    )


@dataclass(frozen=True)
class EntropySettings:
    coef: float = knob(
        0.0,
        "Entropy bonus: the loss gains -coef * (mean entropy of the trained tokens), with its gradient (TRL "
        "entropy_coef); with adaptive_entropy the starting coefficient. 0 and adaptive off: no bonus, no cost.",
        key="entropy_coef",
        interval="[0, inf)",
        example=0.001,
        meaning="0 = no entropy bonus",
    )
    adaptive: bool = knob(
        False,
        "Skywork-OR1's adaptive entropy control (TRL use_adaptive_entropy): after each optimizer step the coefficient "
        "moves by entropy_coef_delta, up while the trained tokens' entropy is at or below entropy_target, down above "
        "it, within [entropy_coef_min, entropy_coef_max]; the bonus acts only below the target.",
        key="adaptive_entropy",
    )
    target: float = knob(
        0.2,
        "Adaptive entropy control: the target mean entropy per trained token, in nats (TRL entropy_target).",
        key="entropy_target",
        interval="[0, inf)",
        example=0.2,
    )
    coef_delta: float = knob(
        0.005,
        "Adaptive entropy control: the step of the coefficient per optimizer step (TRL entropy_coef_delta).",
        key="entropy_coef_delta",
        interval="[0, inf)",
        example=0.005,
    )
    coef_min: float = knob(
        0.0, "Adaptive entropy control: lowest coefficient (TRL entropy_coef_min).", key="entropy_coef_min",
        interval="[0, inf)", example=0.0,
    )  # fmt: skip
    coef_max: float = knob(
        1.0, "Adaptive entropy control: highest coefficient (TRL entropy_coef_max).", key="entropy_coef_max",
        interval="[0, inf)", example=0.005,
    )  # fmt: skip

    @property
    def on(self) -> bool:
        """The bonus is in the loss (the update then takes the entropy with its gradient)."""
        return self.coef != 0 or self.adaptive


@dataclass(frozen=True)
class LossSettings:
    name: str = knob(
        "clipped",
        "Policy loss of grpokit.algos.LOSSES (clipped) or your own as package.module:function.",
        key="loss",
        choices=_loss_names,
        user_defined=True,
    )
    agg: str = knob(
        "seq-mean-token-mean",
        "Aggregation of the per-token loss: seq-mean-token-mean | token-mean | seq-sum-norm.",
        choices=_agg_modes,
    )
    norm_len: int | str | None = knob(
        None,
        "Constant length normaliser L of seq-sum-norm (max_completion_length, the default: rollout.max_new_tokens).",
        interval="[1, inf)",
        example=1024,
    )


@dataclass(frozen=True)
class BatchSettings:
    dynamic_sampling: bool = knob(
        False, "DAPO: drop zero-variance groups (equal rewards) and sample more prompts to refill the batch."
    )
    max_sampling_rounds: int = knob(
        4,
        "Extra sampling rounds dynamic sampling may take before giving up with an error.",
        interval="[0, inf)",
        example=4,
    )
    overlong_shaping: bool = knob(False, "DAPO: soft length penalty in the last overlong_buffer tokens.")
    overlong_buffer: int | float | None = knob(
        None,
        "L_cache of DAPO's overlong shaping: tokens, or a fraction in (0, 1) of rollout.max_new_tokens (None: 0.25).",
        interval="(0, inf)",
        example=64,
    )
    mask_truncated: bool = knob(
        False, "DAPO overlong filtering: no loss on truncated completions (cut off without EOS)."
    )


@dataclass(frozen=True)
class GAESettings:
    gamma: float = knob(
        1.0, "GAE discount gamma of the critic-based estimators (gae).", interval="[0, 1]", example=1.0
    )
    lam: float = knob(
        0.95,
        "GAE lambda of the critic-based estimators (gae).",
        interval="[0, 1]",
        example=0.95,
        meaning="0 = one-step TD, 1 = Monte Carlo returns minus V",
    )


PARTS = {
    "advantage": AdvantageSettings,
    "ratio": RatioSettings,
    "kl": KLSettings,
    "masks": MaskSettings,
    "entropy": EntropySettings,
    "loss": LossSettings,
    "batch": BatchSettings,
    "gae": GAESettings,
}


@dataclass(frozen=True)
class Knob:
    """One leaf of AlgoSettings under its flat name."""

    key: str
    part: str
    name: str
    doc: str
    default: Any
    choices: Callable[[], tuple[str, ...]] | None
    interval: str | None
    example: Any
    meaning: str
    user_defined: bool


def _knobs() -> dict[str, Knob]:
    out = {}
    for part, cls in PARTS.items():
        for f in dataclasses.fields(cls):
            m = f.metadata
            key = m["key"] or f.name
            assert key not in out, f"two settings share the flat name {key!r}"
            out[key] = Knob(
                key,
                part,
                f.name,
                m["doc"],
                f.default,
                m["choices"],
                m["interval"],
                m["example"],
                m["meaning"],
                m["user_defined"],
            )
    return out


KNOBS: dict[str, Knob] = _knobs()
"""Every setting by its flat name (YAML / command line), in declaration order."""


@dataclass(frozen=True)
class AlgoSettings:
    """The whole algorithm. Build one from a preset with `PRESETS[name].override(eps_high=0.28, ...)`."""

    advantage: AdvantageSettings = AdvantageSettings()
    ratio: RatioSettings = RatioSettings()
    kl: KLSettings = KLSettings()
    masks: MaskSettings = MaskSettings()
    entropy: EntropySettings = EntropySettings()
    loss: LossSettings = LossSettings()
    batch: BatchSettings = BatchSettings()
    gae: GAESettings = GAESettings()

    def __post_init__(self) -> None:
        for key, value in self.flat().items():
            check_knob(key, value)

    @staticmethod
    def of(**flat: Any) -> AlgoSettings:
        """AlgoSettings from flat names, the rest at their defaults: `AlgoSettings.of(advantage="group_centre")`."""
        return AlgoSettings().override(**flat)

    def override(self, **flat: Any) -> AlgoSettings:
        """A copy with the settings named by their flat names replaced (None leaves one as it is)."""
        unknown = sorted(set(flat) - set(KNOBS))
        if unknown:
            raise ValueError(f"unknown algorithm setting(s) {unknown}; known: {', '.join(KNOBS)}")
        changes: dict[str, dict[str, Any]] = {}
        for key, value in flat.items():
            if value is not None:
                k = KNOBS[key]
                changes.setdefault(k.part, {})[k.name] = value
        parts = {part: dataclasses.replace(getattr(self, part), **kw) for part, kw in changes.items()}
        return dataclasses.replace(self, **parts)

    def get(self, key: str) -> Any:
        """One setting by its flat name."""
        k = KNOBS[key]
        return getattr(getattr(self, k.part), k.name)

    def flat(self) -> dict[str, Any]:
        """{flat name: value} of every setting (what config.yaml records as resolved_algo)."""
        return {key: getattr(getattr(self, k.part), k.name) for key, k in KNOBS.items()}

    @property
    def uses_reference(self) -> bool:
        """A KL in the loss or in the reward needs the frozen reference's log-probs."""
        return self.kl.beta > 0 or self.kl.reward_coef > 0

    @property
    def uses_critic(self) -> bool:
        """The advantage estimator reads a critic's values (PPO's GAE): the trainer builds a critic."""
        estimator = self.advantage.estimator
        return ADVANTAGE_ALIASES.get(estimator, estimator) in CRITIC_ADVANTAGES

    def ineffective(self, given: set[str] | frozenset[str] = frozenset()) -> list[str]:
        """Why settings would be silently ignored, one line each ([] when none): the knobs in ``given`` (the flat
        names set explicitly; a preset's own values are not judged) that nothing reads under the others, and
        combinations that cannot run. Checked when the config is, so nothing is ignored or refused mid-run.
        A user-defined estimator ("module:function") may read anything: its knobs are not judged."""
        estimator = ADVANTAGE_ALIASES.get(self.advantage.estimator, self.advantage.estimator)
        out = []
        if self.kl.reward_coef > 0 and estimator == "process_group":
            out.append(
                f"algo.kl_reward_coef={self.kl.reward_coef:g}: the process_group estimator (grpo_process) sums "
                "step rewards and takes no KL in the reward; use a KL loss (algo.beta) instead"
            )
        # std_ddof / std_eps with an estimator that divides by no std are not refused: TRL's configs
        # (grpokit.config.trl) write TRL's defaults out whatever scale_rewards chooses
        if estimator in ADVANTAGES:  # a built-in estimator: which of the advantage knobs it reads is known
            for key in sorted(given & {"gamma", "lam"}):
                if estimator not in CRITIC_ADVANTAGES:
                    out.append(
                        f"algo.{key}={self.get(key):g}: only a critic-based estimator (gae: algo.preset=ppo) "
                        f"discounts; advantage {estimator} ignores it"
                    )
        surrogate = self.ratio.surrogate
        if surrogate in TOKEN_ONLY and self.ratio.level != "token":
            out.append(
                f"algo.surrogate={surrogate} builds its own token ratio, so algo.ratio_level={self.ratio.level} "
                "cannot apply: set algo.ratio_level=token"
            )
        readers = {
            "sapo_tau_pos": ("sapo",),
            "sapo_tau_neg": ("sapo",),
            "is_cap": ("dppo_tv", "dppo_kl"),
            "vespo_k_pos": ("vespo",),
            "vespo_lambda_pos": ("vespo",),
            "vespo_k_neg": ("vespo",),
            "vespo_lambda_neg": ("vespo",),
            "dual_clip": ("clip",),
        }
        for key in sorted(given & set(readers)):
            if surrogate not in readers[key] and self.get(key) is not None:
                out.append(
                    f"algo.{key}={self.get(key):g}: only algo.surrogate={' or '.join(readers[key])} reads it, "
                    f"not {surrogate}"
                )
        cov_keys = {"kl_cov_coef": ("kl_cov",), "clip_cov_lb": ("clip_cov",), "clip_cov_ub": ("clip_cov",)}
        cov_keys["cov_ratio"] = ("kl_cov", "clip_cov")
        for key in sorted(given & set(cov_keys)):
            if self.masks.cov_penalty not in cov_keys[key]:
                out.append(
                    f"algo.{key}={self.get(key):g}: only algo.cov_penalty={' or '.join(cov_keys[key])} reads it, "
                    f"not {self.masks.cov_penalty}"
                )
        adaptive_keys = {"entropy_target", "entropy_coef_delta", "entropy_coef_min", "entropy_coef_max"}
        for key in sorted(given & adaptive_keys):
            if not self.entropy.adaptive:
                out.append(f"algo.{key}={self.get(key):g}: only adaptive entropy control reads it; set "
                           "algo.adaptive_entropy=true")  # fmt: skip
        if self.entropy.coef_min > self.entropy.coef_max:
            out.append(
                f"algo.entropy_coef_min={self.entropy.coef_min:g} > algo.entropy_coef_max={self.entropy.coef_max:g}"
            )
        if "kl_is_correction" in given and self.kl.is_correction and self.kl.beta == 0:
            out.append("algo.kl_is_correction=true weights the KL of the loss, which is off (algo.beta=0)")
        if "norm_len" in given and self.loss.agg != "seq-sum-norm":
            out.append(
                f"algo.norm_len={self.loss.norm_len}: only algo.agg=seq-sum-norm divides by it, not {self.loss.agg}"
            )
        if "overlong_buffer" in given and not self.batch.overlong_shaping:
            out.append(
                f"algo.overlong_buffer={self.batch.overlong_buffer}: the buffer of overlong shaping, which is off "
                "(algo.overlong_shaping=true turns it on)"
            )
        return out

    def loss_options(self) -> LossOptions:
        """The loss's settings these knobs choose (norm_len must be resolved), the one place algo.* becomes
        LossOptions. The entropy bonus's coefficient is left at 0: it is the step's (train/update.py sets it)."""
        return LossOptions(
            eps_low=self.ratio.eps_low,
            eps_high=self.ratio.eps_high,
            ratio_level=self.ratio.level,
            dual_clip=self.ratio.dual_clip,
            surrogate=self.ratio.surrogate,
            sapo_tau_pos=self.ratio.sapo_tau_pos,
            sapo_tau_neg=self.ratio.sapo_tau_neg,
            is_cap=self.ratio.is_cap,
            vespo_k=(self.ratio.vespo_k_pos, self.ratio.vespo_k_neg),
            vespo_lambda=(self.ratio.vespo_lambda_pos, self.ratio.vespo_lambda_neg),
            off_policy_mask=self.masks.off_policy_mask,
            kl_is_correction=self.kl.is_correction,
            cov_penalty=self.masks.cov_penalty,
            kl_cov_coef=self.masks.kl_cov_coef,
            agg=self.loss.agg,
            norm_len=self.loss.norm_len,
            beta=self.kl.beta,
            kl_kind=self.kl.kind,
        )

    def loss_kwargs(self) -> dict[str, Any]:
        """``loss_options()`` as keywords of `policy_loss` / `token_terms` (what saved rollouts record), without
        the entropy bonus's coefficient."""
        out = dataclasses.asdict(self.loss_options())
        del out["entropy_coef"]
        return out


def check_knob(key: str, value: Any) -> None:
    """Raise ValueError if `value` is not allowed for setting `key` (choices or interval)."""
    k = KNOBS[key]
    if k.choices is not None:
        valid = k.choices()
        if value not in valid and not (k.user_defined and isinstance(value, str) and ":" in value):
            raise ValueError(f"{key}={value!r} is not one of {list(valid)}")
    if k.interval is not None and isinstance(value, (int, float)) and not isinstance(value, bool):
        if not in_interval(value, k.interval):
            raise ValueError(f"{key}={value!r} is out of range: it must be in {k.interval}")
