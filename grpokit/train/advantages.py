"""A step's advantages: the batch's rewards (and log-probs, values) -> the preset's estimator
(grpokit.algos.compute_advantages) -> (N,) per completion or (N, Lc) per token.

    advantages = batch_advantages(batch, algo, group_size, old, ref, values, device=device, dist=dist)

Under torchrun an estimator registered group_local (grpokit.algos.advantages.Estimator) runs on
this rank's whole groups; any other (a batch std, per-token whitening over the batch, your own) runs on
every rank's rows gathered, and each rank keeps its own: the numbers one process would compute.
"""

from __future__ import annotations

import torch

from grpokit.algos import AlgoSettings, compute_advantages, kl_estimate
from grpokit.algos.advantages import group_local
from grpokit.algos.multi_reward import normalize_then_sum
from grpokit.rollout.batch import ScoredBatch
from grpokit.train.distributed import Distributed
from grpokit.train.minibatch import loss_mask


def batch_advantages(
    batch: ScoredBatch,
    algo: AlgoSettings,
    group_size: int,
    old_logprobs: torch.Tensor | None,
    ref_logprobs: torch.Tensor | None,
    values: torch.Tensor | None = None,
    *,
    device: torch.device,
    dist: Distributed,
    reward_weights: dict[str, float] | None = None,
    teacher_logprobs: torch.Tensor | None = None,
) -> torch.Tensor:
    """(N,) or (N, Lc) advantages of this rank's ``batch``. old/ref log-probs (N, Lc) or None, as
    PolicyUpdate.rollout_logprobs gives them; values (N, Lc): PPO's critic. With a KL in the reward
    (algo.kl.reward_coef > 0) the estimator also gets k1 = old - ref per token, the sampling policy's KL to
    the reference. Rows no reward function scored get 0 and stay out of the statistics. With
    algo.reward_aggregation=normalize_then_sum (GDPO) the estimator gets, instead of the weighted sum, the sum of
    each reward normalised within its group, weighted by ``reward_weights`` (name -> weight of batch.per_function).
    ``teacher_logprobs`` (N, Lc): on-policy distillation's teacher's (algo.teacher_kl_coef; grpokit.train.teacher),
    whose dense term is added per token."""
    d = device
    kl_coef = algo.kl.reward_coef
    kl = kl_estimate(old_logprobs, ref_logprobs, "k1").to(d) if kl_coef > 0 else None  # (N, Lc)
    rewards = batch.rewards.to(d)  # (N,)
    if algo.advantage.reward_aggregation == "normalize_then_sum":
        rewards = gdpo_rewards(batch, reward_weights, group_size).to(d)  # (N,)
    completion_mask = batch.rollout.completion_mask.to(d)  # (N, Lc)
    inputs = {
        "completion_mask": completion_mask,
        "kl": kl,
        "old_logprobs": old_logprobs.to(d) if old_logprobs is not None else None,
        "ref_logprobs": ref_logprobs.to(d) if ref_logprobs is not None else None,
        "values": values.to(d) if values is not None else None,
        "teacher_logprobs": teacher_logprobs.to(d) if teacher_logprobs is not None else None,
        "step_rewards": batch.step_rewards,
        "scored": batch.scored.to(d),
        # algo.mask_truncated: per-token whitening over the tokens the loss trains on
        "trained_mask": loss_mask(batch.rollout, True).to(d) if algo.batch.mask_truncated else None,
    }
    if not dist.active or group_local(algo.advantage.estimator):
        return compute_advantages(rewards, group_size, algo, kl_coef=kl_coef, **inputs)
    # batch-wide statistics: every rank's rows, (N, L) ones padded to the longest; this rank's share kept
    n = rewards.shape[0]
    rows = {
        k: v
        for k, v in {"rewards": rewards, **inputs}.items()
        if isinstance(v, (torch.Tensor, list)) and len(v) == n
    }
    everyone = {k: v.to(d) if isinstance(v, torch.Tensor) else v for k, v in dist.gather_rows(rows).items()}
    full = compute_advantages(
        everyone.pop("rewards"), group_size, algo, kl_coef=kl_coef, **{**inputs, **everyone}
    )
    mine = dist.my_share(full)  # (n,) or (n, L_global)
    return mine[:, : completion_mask.shape[1]] if mine.dim() == 2 else mine


def gdpo_rewards(batch: ScoredBatch, weights: dict[str, float] | None, group_size: int) -> torch.Tensor:
    """(N,) GDPO's total reward of ``batch`` (grpokit.algos.multi_reward.normalize_then_sum): its per-function
    values (None -> NaN) normalised within each group, weighted by ``weights`` and summed."""
    names = list(batch.per_function)
    if weights is None or set(names) - set(weights):
        raise ValueError(
            f"algo.reward_aggregation=normalize_then_sum needs the weight of every reward {names}; got {weights}"
        )
    table = [[float("nan") if v is None else float(v) for v in batch.per_function[name]] for name in names]
    per_function = torch.tensor(table, dtype=torch.float64).T.reshape(len(batch.texts), len(names))  # (N, K)
    w = torch.tensor([float(weights[name]) for name in names], dtype=torch.float64)  # (K,)
    return normalize_then_sum(per_function, w, group_size).to(batch.rewards.dtype)
