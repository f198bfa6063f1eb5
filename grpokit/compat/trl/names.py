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
| completions/mean_terminated_length (min, max) | completion_len/ended_mean (min, max) | those that ended (0 if none) |
| clip_ratio/low_mean, high_mean, region_mean | clip_frac_low, clip_frac_high, clip_frac | tokens whose clip bit, over loss tokens |
| clip_ratio/low_min, high_max  | clip_frac_low/seq_min, clip_frac_high/seq_max | a sequence's share of them, smallest / largest |
| tools/call_frequency          | tools/calls_per_episode    | tool calls per completion (episode)             |
| step_time                     | time/step                  | wall seconds of a step, sampling included (TRL: of an optimizer step) |
| learning_rate                 | lr                         | the policy's learning rate                      |
| sampling/sampling_logp_difference/mean (max) | sampler_logprob_diff/mean (max) | |trainer - sampler| log-prob |
| sampling/importance_sampling_ratio/mean (min, max) | mismatch/weight_mean (min, max) | the IS weights |
| kl, entropy, grad_norm, loss  | the same                   | (already TRL's names)                           |

TRL's reward_std and rewards/<fn>/std are the unbiased std (divided by n - 1) where grpokit's reward/total/std and
reward/<fn>/std divide by n: they are computed as TRL does from the step's rewards (``trl_reward_spread``). TRL's
num_tokens, the prompt and completion tokens seen since the start, is the sum of grpokit's tokens/step (the
trainer adds them up). Two are worked out from grpokit's (``with_trl_names``): tools/failure_frequency, tools/errors
over tools/calls (0 without calls), and policy_loss, the loss before the entropy bonus (loss itself without a bonus;
with one, loss + entropy_coef x entropy/bonus, TRL's with one optimizer step per step).

Not logged: cispo_clip_ratio, vespo/phi_seq_mean, aux_loss. The clip shares are token means over the step's loss
tokens, their per-sequence extremes the smallest / largest over the step's sequences; TRL averages its micro-batches'
(the same with one), and at importance_sampling_level sequence takes the means over sequences.
"""

from __future__ import annotations

import math

ALIASES = {
    "reward/total/mean": "reward",
    "zero_variance_frac": "frac_reward_zero_std",
    "completion_len/mean": "completions/mean_length",
    "completion_len/min": "completions/min_length",
    "completion_len/max": "completions/max_length",
    "truncated_frac": "completions/clipped_ratio",
    "completion_len/ended_mean": "completions/mean_terminated_length",
    "completion_len/ended_min": "completions/min_terminated_length",
    "completion_len/ended_max": "completions/max_terminated_length",
    "clip_frac_low": "clip_ratio/low_mean",
    "clip_frac_high": "clip_ratio/high_mean",
    "clip_frac": "clip_ratio/region_mean",
    "clip_frac_low/seq_min": "clip_ratio/low_min",
    "clip_frac_high/seq_max": "clip_ratio/high_max",
    "tools/calls_per_episode": "tools/call_frequency",
    "time/step": "step_time",
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
    if "tools/calls" in metrics:  # TRL's failure_frequency: failed calls over calls
        calls = metrics["tools/calls"]
        extra["tools/failure_frequency"] = metrics.get("tools/errors", 0.0) / calls if calls else 0.0
    if "loss" in metrics:  # TRL's policy_loss leaves the entropy bonus out (-coef x H): add it back
        extra["policy_loss"] = metrics["loss"] + metrics.get("entropy_coef", 0.0) * metrics.get("entropy/bonus", 0.0)
    metrics.update(extra)
    return metrics


def trl_reward_spread(per_function: dict[str, list[float | None]], total: list[float]) -> dict[str, float]:
    """TRL's rewards/<fn>/std (over the rows the function scored) and reward_std (over the total rewards of the
    scored rows): the unbiased std, sqrt(sum (x - mean)^2 / (n - 1)), as TRL's nanstd; left out below 2 values."""

    def unbiased(values: list[float]) -> float | None:
        n = len(values)
        if n < 2:
            return None
        mean = sum(values) / n
        return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))

    out: dict[str, float] = {}
    for name, values in per_function.items():
        std = unbiased([float(v) for v in values if v is not None])
        if std is not None:
            out[f"rewards/{name}/std"] = std
    std = unbiased([float(v) for v in total])
    if std is not None:
        out["reward_std"] = std
    return out


def tokens_so_far(log_history: list[dict[str, float]], step_tokens: float) -> float:
    """TRL's num_tokens after a step of ``step_tokens`` tokens: the last logged num_tokens (0 before any; a resumed
    run's history is read back from metrics.jsonl) plus the step's."""
    last = next((m["num_tokens"] for m in reversed(log_history) if "num_tokens" in m), 0.0)
    return last + step_tokens
