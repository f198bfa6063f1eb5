"""grpokit.algos: the pure-tensor maths of the GRPO family (torch only; no transformers, no config).

Axes: advantages (advantages.py; per-token whitening in whiten.py; the trainer's entry point
compute_advantages in estimate.py), KL estimators (kl.py), the clipped policy loss and its
aggregations (loss.py), its per-token surrogates (objectives.py: clip, cispo, sapo, gmpo, dppo_*, vespo; each
registered with its own parameter type, as the estimators are, their settings declared in knobs.py) and the
masks on them (masks.py: off-policy, high-entropy, KL-Cov / Clip-Cov), the entropy bonus and its adaptive
coefficient (entropy_bonus.py), chunked log-softmax / entropy (entropy.py), the typed settings of an algorithm
(settings.py), named presets (presets.py),
and the PPO baseline pieces (ppo.py).
"""

from .advantages import (
    ADVANTAGE_ALIASES,
    ADVANTAGE_KINDS,
    ADVANTAGES,
    GROUP_SCALES,
    AdvantageInputs,
    Estimator,
    GAEParams,
    batch_whitened_advantages,
    estimator,
    get_advantage,
    group_advantages,
    register_advantage,
    reinforce_pp_advantages,
    rloo_advantages,
    whiten_tokens,
)
from .entropy import entropy_from_logits, selective_log_softmax
from .estimate import compute_advantages
from .kl import KL_KINDS, kl_estimate
from .loss import (
    AGG_MODES,
    LOSSES,
    RATIO_LEVELS,
    LossOptions,
    get_loss,
    gradient_free_rows,
    importance_ratio,
    policy_loss,
    register_loss,
)
from .objectives import SURROGATES, Surrogate, SurrogateInputs, register_surrogate
from .ppo import discounted_returns, gae, token_level_rewards, value_loss
from .presets import PRESETS, SETTING_KEYS
from .settings import (
    KNOBS,
    AdvantageSettings,
    AlgoSettings,
    BatchSettings,
    IneffectiveSettingError,
    KLSettings,
    LossSettings,
    RatioSettings,
)

__all__ = [
    "KNOBS",
    "LOSSES",
    "get_loss",
    "register_loss",
    "SURROGATES",
    "Surrogate",
    "SurrogateInputs",
    "register_surrogate",
    "Estimator",
    "GAEParams",
    "estimator",
    "AdvantageSettings",
    "AlgoSettings",
    "BatchSettings",
    "IneffectiveSettingError",
    "KLSettings",
    "LossSettings",
    "RatioSettings",
    "ADVANTAGES",
    "ADVANTAGE_ALIASES",
    "ADVANTAGE_KINDS",
    "AdvantageInputs",
    "batch_whitened_advantages",
    "get_advantage",
    "register_advantage",
    "whiten_tokens",
    "AGG_MODES",
    "GROUP_SCALES",
    "KL_KINDS",
    "PRESETS",
    "RATIO_LEVELS",
    "SETTING_KEYS",
    "compute_advantages",
    "discounted_returns",
    "entropy_from_logits",
    "gae",
    "gradient_free_rows",
    "group_advantages",
    "importance_ratio",
    "kl_estimate",
    "LossOptions",
    "policy_loss",
    "reinforce_pp_advantages",
    "rloo_advantages",
    "selective_log_softmax",
    "token_level_rewards",
    "value_loss",
]
