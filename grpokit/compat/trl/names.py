"""TRL's metric names beside grpokit's, where the two mean the same thing (issue 30), so that a TRL
user's dashboards and scripts find them. grpokit's own names stay (they are what plots and the console
read); each alias holds the same number.

| TRL (GRPOTrainer)             | grpokit                    | meaning                                         |
|-------------------------------|----------------------------|-------------------------------------------------|
| reward                        | reward/total/mean          | mean total reward over scored completions       |
| rewards/<fn>/mean             | reward/<fn>/mean           | mean of one function over rows it applies to    |
| frac_reward_zero_std          | zero_variance_frac         | share of groups whose rewards are all equal     |
| completions/mean_length (min, max) | completion_len/mean (min, max) | completion tokens, EOS included      |
| completions/clipped_ratio     | truncated_frac             | share of completions cut at max length          |
| learning_rate                 | lr                         | the policy's learning rate                      |
| sampling/sampling_logp_difference/mean (max) | sampler_logprob_diff/mean (max) | |trainer - sampler| log-prob |
| sampling/importance_sampling_ratio/mean (min, max) | mismatch/weight_mean (min, max) | the IS weights |
| kl, entropy, grad_norm, loss  | the same                   | (already TRL's names)                           |

Left out because they differ: TRL's reward_std and rewards/<fn>/std are unbiased (grpokit's divide by
n), its num_tokens counts prompt tokens cumulatively.
"""

from __future__ import annotations

ALIASES = {
    "reward/total/mean": "reward",
    "zero_variance_frac": "frac_reward_zero_std",
    "completion_len/mean": "completions/mean_length",
    "completion_len/min": "completions/min_length",
    "completion_len/max": "completions/max_length",
    "truncated_frac": "completions/clipped_ratio",
    "lr": "learning_rate",
    "sampler_logprob_diff/mean": "sampling/sampling_logp_difference/mean",
    "sampler_logprob_diff/max": "sampling/sampling_logp_difference/max",
    "mismatch/weight_mean": "sampling/importance_sampling_ratio/mean",
    "mismatch/weight_min": "sampling/importance_sampling_ratio/min",
    "mismatch/weight_max": "sampling/importance_sampling_ratio/max",
}


def with_trl_names(metrics: dict[str, float]) -> dict[str, float]:
    """``metrics`` with TRL's names added for the keys that mean the same (in place; also returned)."""
    extra = {trl: metrics[ours] for ours, trl in ALIASES.items() if ours in metrics}
    for key, value in list(metrics.items()):
        parts = key.split("/")
        if len(parts) == 3 and parts[0] == "reward" and parts[2] == "mean" and parts[1] != "total":
            extra[f"rewards/{parts[1]}/mean"] = value
    metrics.update(extra)
    return metrics
