"""Named algorithms as presets over the independent axes (advantage, ratio/clip, KL, aggregation).

Each preset is a plain dict of settings; the trainer maps these keys onto its config:
  advantage        an estimator of advantages.ADVANTAGES ("group_std", "token_whiten", ...)
  std_ddof         std convention of the advantage (1 = unbiased)
  eps_low/eps_high clip range [1 - eps_low, 1 + eps_high] of the ratio
  ratio_level      "token" | "sequence" | "sequence_token"
  agg              "seq-mean-token-mean" | "token-mean" | "seq-sum-norm"
  beta, kl_kind    KL-in-loss coefficient and estimator ("k1" | "k2" | "k3"); kl_kind is also the
                   estimator of the logged "kl" metric whenever there is a reference
  kl_reward_coef   KL-in-reward coefficient: -kl_reward_coef * k1_t on every token's reward (PPO,
                   REINFORCE++); 0 = none
  norm_len         None, or "max_completion_length": the trainer substitutes its max new tokens
  dual_clip        None or c > 1
  dynamic_sampling drop groups whose rewards are all equal and refill the batch (DAPO)
  overlong_shaping soft length penalty inside the last `overlong_buffer` of the length budget (DAPO)
  overlong_buffer  None, a float in (0, 1) = fraction of the max completion length, or an int = tokens
  mask_truncated   zero the loss mask of completions cut off without EOS (DAPO overlong filtering)

The formulas, per preset:
  grpo         DeepSeekMath, arXiv 2402.03300. A_i = (r_i - mean_g)/std_g; token ratio, clip 0.2;
               loss (1/B) sum_i (1/|o_i|) sum_t [l_{i,t} + 0.04 * k3_{i,t}].
  dr_grpo      Dr. GRPO, arXiv 2503.20783. A_i = r_i - mean_g (no std); loss sum_{i,t} l / (B * L_max);
               no KL. Removes the length and question-difficulty biases.
  dapo         DAPO, arXiv 2503.14476. GRPO advantage; clip-higher [0.8, 1.28]; loss sum m l / sum m;
               no KL; dynamic sampling; overlong shaping with L_cache = 4096 of L_max = 20480 (0.2).
  gspo         GSPO, arXiv 2507.18071. GRPO advantage; s_i = exp(mean_t log rho_{i,t}); clip
               [1 - 3e-4, 1 + 4e-4] on s_i; (1/B) sum_i (1/|o_i|) sum_t l; no KL.
  rloo         RLOO, arXiv 2402.14740. A_i = r_i - mean_{j!=i} r_j; REINFORCE on whole sequences,
               sum_t over tokens (seq-sum-norm with L_max, a constant rescaling of the sum); the paper
               puts its KL penalty into the reward, so the loss has beta = 0.
  reinforce_pp REINFORCE++, arXiv 2501.03262. r_t = -0.01 * k1_t (+ score at EOS), A_t = returns-to-go
               whitened per token over the batch (eq. 10, population std); token-mean; the KL lives in
               the reward (coefficient 0.01, OpenRLHF's init_kl_coef), so the loss has beta = 0.
  reinforce_pp_baseline  REINFORCE++-baseline, arXiv 2501.03262. Score r_i - mean_g, then the same
               per-token whitening; token-mean; the paper uses a k2 KL loss instead of a KL in the
               reward: set beta > 0 (its value is task-specific).
"""

from __future__ import annotations

_COMMON = {
    "std_ddof": 1,
    "eps_low": 0.2,
    "eps_high": 0.2,
    "ratio_level": "token",
    "beta": 0.0,
    "kl_kind": "k3",
    "kl_reward_coef": 0.0,
    "norm_len": None,
    "dual_clip": None,
    "dynamic_sampling": False,
    "overlong_shaping": False,
    "overlong_buffer": None,
    "mask_truncated": False,
}

PRESETS: dict[str, dict[str, object]] = {
    # DeepSeekMath, arXiv 2402.03300 (sec. 4.1): std-scaled group advantage, KL k3 in the loss, beta 0.04.
    "grpo": {**_COMMON, "advantage": "group_std", "agg": "seq-mean-token-mean", "beta": 0.04},
    # Dr. GRPO, arXiv 2503.20783: no std division, constant normaliser L = max completion length, no KL.
    "dr_grpo": {
        **_COMMON,
        "advantage": "group_centre",
        "agg": "seq-sum-norm",
        "norm_len": "max_completion_length",
    },
    # DAPO, arXiv 2503.14476: clip-higher 0.2/0.28, token-mean, no KL, dynamic sampling, overlong
    # shaping (buffer 4096 of 20480 tokens = 0.2) and overlong filtering (mask truncated completions).
    "dapo": {
        **_COMMON,
        "advantage": "group_std",
        "eps_high": 0.28,
        "agg": "token-mean",
        "dynamic_sampling": True,
        "overlong_shaping": True,
        "overlong_buffer": 0.2,
        "mask_truncated": True,
    },
    # GSPO, arXiv 2507.18071: sequence-level geometric-mean ratio, clip 3e-4 / 4e-4, no KL.
    "gspo": {
        **_COMMON,
        "advantage": "group_std",
        "eps_low": 3e-4,
        "eps_high": 4e-4,
        "ratio_level": "sequence",
        "agg": "seq-mean-token-mean",
    },
    # RLOO, arXiv 2402.14740: leave-one-out baseline, sequence-level REINFORCE (sum over tokens), KL in reward.
    "rloo": {
        **_COMMON,
        "advantage": "leave_one_out",
        "agg": "seq-sum-norm",
        "norm_len": "max_completion_length",
    },
    # REINFORCE++, arXiv 2501.03262: k1 KL in the per-token reward, returns whitened per token over the
    # batch (eq. 10), token-mean.
    "reinforce_pp": {
        **_COMMON,
        "advantage": "token_whiten",
        "agg": "token-mean",
        "kl_kind": "k1",
        "kl_reward_coef": 0.01,
    },
    # REINFORCE++-baseline, arXiv 2501.03262: group-mean baseline, then the same per-token whitening;
    # token-mean; k2 KL loss (set beta).
    "reinforce_pp_baseline": {
        **_COMMON,
        "advantage": "group_centre_token_whiten",
        "agg": "token-mean",
        "kl_kind": "k2",
    },
}

SETTING_KEYS = tuple(sorted(PRESETS["grpo"]))
