"""The algorithm's settings: one frozen, typed object with a part per independent axis.
(Over 500 lines: one frozen settings object and its seven typed parts, each about a screen; the derivations
across parts, a preset's and the refusal of settings nothing reads, need them all.)

    AlgoSettings
      advantage  AdvantageSettings  which estimator, its std convention
      ratio      RatioSettings      token / sequence ratio, the surrogate (clip, cispo, sapo, ...), the clip range
      kl         KLSettings         KL in the loss (beta, estimator), KL in the reward (k1 coefficient)
      loss       LossSettings       aggregation of the per-token loss into one scalar, its constant
      masks      MaskSettings       masks on the surrogate: DeepSeek-V3.2's off-policy sequence mask, top entropy
      entropy    EntropySettings    the entropy bonus and its adaptive coefficient (Skywork-OR1)
      batch      BatchSettings      DAPO's batch-level pieces: dynamic sampling, overlong shaping/filtering
      params     (a tuple)          the registered surrogates' and estimators' own parameters (objectives.SapoParams,
                                    advantages.GAEParams, ...): those that differ from their defaults

Presets (presets.py) are AlgoSettings instances. Every leaf has one flat name, the one used in YAML and
on the command line (`algo.eps_high=0.28`), given by `knob(key=...)` or else the field name; the config's
`algo` section, its choices and its ranges are read from here (`KNOBS`, knobs.py), not typed out again. What
reads a surrogate's or an estimator's own settings is read from the registrations (objectives.SURROGATES,
advantages.ADVANTAGES), so `ineffective` and `override` keep no list of them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, TypeVar

from .advantages import ADVANTAGE_ALIASES, ADVANTAGES, GAEParams, estimator, user_defined
from .kl import KL_KINDS
from .knobs import KNOBS, Knob, check_knob, declare, knob
from .loss import AGG_MODES, COV_PENALTIES, LOSSES, RATIO_LEVELS, LossOptions
from .multi_reward import REWARD_AGGREGATIONS
from .objectives import SURROGATES, surrogate

__all__ = ["KNOBS", "Knob", "AlgoSettings", "IneffectiveSettingError", "check_knob", "knob"]

P = TypeVar("P")


def _advantage_names() -> tuple[str, ...]:
    return (*ADVANTAGES, *ADVANTAGE_ALIASES)  # read now: register_advantage may have added some


def _ratio_levels() -> tuple[str, ...]:
    return RATIO_LEVELS


def _surrogates() -> tuple[str, ...]:
    return tuple(SURROGATES)  # read now: register_surrogate may have added some


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
    teacher_kl_coef: float = knob(
        0.0,
        "On-policy distillation: the weight w of the teacher's per-token reverse KL in the advantage, "
        "A_{i,t} = A_i + w (log pi_teacher - log pi_student) on the student's own tokens (teacher.name_or_path; "
        "grpokit.algos.distill). With algo.advantage=none the teacher's alone.",
        interval="[0, inf)",
        example=1.0,
        meaning="0 = no teacher",
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
        "Per-token surrogate of grpokit.algos.objectives.SURROGATES: clip (PPO/GRPO) | cispo | sapo | gmpo | dppo_tv | "
        "dppo_kl | vespo; gmpo reads eps_low / eps_high as log-ratio bounds, dppo_* as divergence bounds.",
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
    dual_clip: float | None = knob(
        None,
        "Dual-clip constant c > 1 for negative advantages (None = off; read by the clip surrogate).",
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
    ref_sync_every: int = knob(
        0,
        "Move the reference toward the policy every N steps, pi_ref <- alpha pi_theta + (1 - alpha) pi_ref (TR-DPO's "
        "soft update; TRL sync_ref_model, ref_model_sync_steps); the mixed reference is saved in checkpoints.",
        interval="[0, inf)",
        example=64,
        meaning="0 = the reference stays the initial policy",
    )
    ref_sync_alpha: float = knob(
        0.6,
        "The policy's share alpha in that mix (TRL ref_model_mixup_alpha); 1 makes the reference the policy.",
        interval="(0, 1]",
        example=0.6,
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


PARTS = {
    "advantage": AdvantageSettings,
    "ratio": RatioSettings,
    "kl": KLSettings,
    "masks": MaskSettings,
    "entropy": EntropySettings,
    "loss": LossSettings,
    "batch": BatchSettings,
}


def _declare_parts() -> None:
    """KNOBS in reading order: the parts first, then the parameter types the registrations declared."""
    registered = dict(KNOBS)
    KNOBS.clear()
    for part, cls in PARTS.items():
        declare(cls, part)
    KNOBS.update(registered)


_declare_parts()


class IneffectiveSettingError(ValueError):
    """A setting given that nothing under the others reads (AlgoSettings.override refuses it by name)."""


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
    params: tuple[Any, ...] = ()
    """The surrogates' and estimators' own parameters (instances of their registered types) that differ from their
    defaults, ordered by type name, so that equal settings compare equal; `params_of` reads one."""

    def __post_init__(self) -> None:
        for key, value in self.flat().items():
            check_knob(key, value)

    @staticmethod
    def of(**flat: Any) -> AlgoSettings:
        """AlgoSettings from flat names, the rest at their defaults: `AlgoSettings.of(advantage="group_centre")`."""
        return AlgoSettings().override(**flat)

    def override(self, **flat: Any) -> AlgoSettings:
        """A copy with the settings named by their flat names replaced (None leaves one as it is).

        Raises ValueError for an unknown name or a value out of range, and IneffectiveSettingError (a ValueError)
        for a surrogate's or estimator's own setting changed while neither the resulting surrogate nor estimator
        reads it (`algo.gamma=0.9` with group_std), as the config's check refuses it."""
        unknown = sorted(set(flat) - set(KNOBS))
        if unknown:
            raise ValueError(f"unknown algorithm setting(s) {unknown}; known: {', '.join(KNOBS)}")
        changes: dict[str, dict[str, Any]] = {}
        owned: dict[type, dict[str, Any]] = {}
        for key, value in flat.items():
            if value is not None:
                k = KNOBS[key]
                if k.owner is None:
                    changes.setdefault(k.part, {})[k.name] = value
                else:
                    owned.setdefault(k.owner, {})[k.name] = value
        parts: dict[str, Any] = {
            part: dataclasses.replace(getattr(self, part), **kw) for part, kw in changes.items()
        }
        if owned:
            params = {type(p): p for p in self.params}
            params |= {cls: dataclasses.replace(self.params_of(cls), **kw) for cls, kw in owned.items()}
            parts["params"] = _params_tuple(params.values())
        out = dataclasses.replace(self, **parts)
        changed = {key for key, value in flat.items() if value is not None and out.get(key) != self.get(key)}
        idle = out._unread_params(changed)
        if idle:
            raise IneffectiveSettingError(idle[0])
        return out

    def get(self, key: str) -> Any:
        """One setting by its flat name."""
        k = KNOBS[key]
        holder = getattr(self, k.part) if k.owner is None else self.params_of(k.owner)
        return getattr(holder, k.name)

    def flat(self) -> dict[str, Any]:
        """{flat name: value} of every setting (what config.yaml records as resolved_algo)."""
        return {key: self.get(key) for key in KNOBS}

    def params_of(self, cls: type[P]) -> P:
        """The instance of parameter type ``cls`` these settings hold (its defaults when they hold none)."""
        return next((p for p in self.params if type(p) is cls), None) or cls()

    @property
    def gae(self) -> GAEParams:
        """The gae estimator's parameters (gamma, lam)."""
        return self.params_of(GAEParams)

    @property
    def uses_reference(self) -> bool:
        """A KL in the loss or in the reward needs the frozen reference's log-probs."""
        return self.kl.beta > 0 or self.kl.reward_coef > 0

    @property
    def uses_teacher(self) -> bool:
        """On-policy distillation: the advantage takes a teacher's per-token log-probs (algo.teacher_kl_coef > 0)."""
        return self.advantage.teacher_kl_coef > 0

    @property
    def uses_critic(self) -> bool:
        """The advantage estimator reads a critic's values (PPO's GAE): the trainer builds a critic. A
        "module:function" estimator is not imported to say: it reads none."""
        name = self.advantage.estimator
        return not user_defined(name) and estimator(name).needs_critic

    def _unread_params(self, given: set[str] | frozenset[str]) -> list[str]:
        """One line per knob in ``given`` owned by a surrogate's or an estimator's parameter type that neither the
        chosen surrogate nor the chosen estimator reads (a "module:function" estimator may read anything)."""
        name, surrogate_name = self.advantage.estimator, self.ratio.surrogate
        out = []
        for key in sorted(given):
            cls = KNOBS[key].owner
            if cls is None or cls is SURROGATES[surrogate_name].params:
                continue
            if user_defined(name) or cls is estimator(name).params:
                continue
            by_estimators = [n for n, e in ADVANTAGES.items() if e.params is cls and ":" not in n]
            value = f"algo.{key}={_shown(self.get(key))}"
            if by_estimators:
                critic = all(ADVANTAGES[n].needs_critic for n in by_estimators)
                who = f"a critic-based estimator ({', '.join(by_estimators)})" if critic else (
                    "algo.advantage=" + " or ".join(by_estimators)
                )  # fmt: skip
                out.append(f"{value}: only {who} reads it; advantage {name} ignores it")
            else:
                readers = [n for n, s in SURROGATES.items() if s.params is cls]
                out.append(
                    f"{value}: only algo.surrogate={' or '.join(readers)} reads it, not {surrogate_name}"
                )
        return out

    def ineffective(self, given: set[str] | frozenset[str] = frozenset()) -> list[str]:
        """Why settings would be silently ignored, one line each ([] when none): the knobs in ``given`` (the flat
        names set explicitly; a preset's own values are not judged) that nothing reads under the others, and
        combinations that cannot run. Checked when the config is, so nothing is ignored or refused mid-run.
        Who reads a surrogate's or estimator's own settings comes from their registrations. A user-defined
        estimator ("module:function") may read anything: its knobs are not judged."""
        name = ADVANTAGE_ALIASES.get(self.advantage.estimator, self.advantage.estimator)
        out = []
        if self.kl.reward_coef > 0 and name in ADVANTAGES and not ADVANTAGES[name].kl_in_reward:
            out.append(
                f"algo.kl_reward_coef={self.kl.reward_coef:g}: the {name} estimator takes no KL in the reward; use "
                "a KL loss (algo.beta) instead"
            )
        # std_ddof / std_eps with an estimator that divides by no std, and eps_low / eps_high with a surrogate that
        # reads no clip range, are not refused: TRL's configs (grpokit.config.trl) write TRL's defaults out
        out += self._unread_params(given)
        if (
            name in ADVANTAGES
            and ADVANTAGES[name].fn is ADVANTAGES["none"].fn
            and self.advantage.teacher_kl_coef == 0
        ):
            out.append(
                "algo.advantage=none gives every advantage 0 and nothing would be learnt: set algo.teacher_kl_coef > 0 "
                "(on-policy distillation, with teacher.name_or_path) or choose an estimator"
            )
        entry = surrogate(self.ratio.surrogate)
        if entry.token_ratio and self.ratio.level != "token":
            out.append(
                f"algo.surrogate={self.ratio.surrogate} builds its own token ratio, so algo.ratio_level={self.ratio.level} "
                "cannot apply: set algo.ratio_level=token"
            )
        for key in sorted(given & {"dual_clip"}):
            if key not in entry.reads and self.get(key) is not None:
                readers = [n for n, s in SURROGATES.items() if key in s.reads]
                out.append(
                    f"algo.{key}={self.get(key):g}: only algo.surrogate={' or '.join(readers)} reads it, "
                    f"not {self.ratio.surrogate}"
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
        if self.kl.ref_sync_every and not self.uses_reference:
            out.append(
                f"algo.ref_sync_every={self.kl.ref_sync_every}: the run has no reference to move (algo.beta=0 and no "
                "algo.kl_reward_coef); set one of them, or leave ref_sync_every at 0"
            )
        if "ref_sync_alpha" in given and not self.kl.ref_sync_every:
            out.append(
                f"algo.ref_sync_alpha={self.kl.ref_sync_alpha:g}: only a reference sync reads it, which is off "
                "(algo.ref_sync_every=0)"
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
        params = SURROGATES[self.ratio.surrogate].params
        return LossOptions(
            eps_low=self.ratio.eps_low,
            eps_high=self.ratio.eps_high,
            ratio_level=self.ratio.level,
            dual_clip=self.ratio.dual_clip,
            surrogate=self.ratio.surrogate,
            surrogate_params=None if params is None else self.params_of(params),
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
        """``loss_options()`` as keywords of `policy_loss` / `token_terms` (what saved rollouts record: plain
        values, the surrogate's parameters as a mapping of its fields), without the entropy bonus's coefficient."""
        out = dataclasses.asdict(self.loss_options())
        del out["entropy_coef"]
        return out


def _params_tuple(params: Any) -> tuple[Any, ...]:
    """AlgoSettings.params' form: the instances that differ from their type's defaults, ordered by type name."""
    kept = [p for p in params if p != type(p)()]
    return tuple(sorted(kept, key=lambda p: f"{type(p).__module__}.{type(p).__qualname__}"))


def _shown(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)
