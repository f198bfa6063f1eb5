"""Several rewards into one per completion: summed then normalised (the default, GRPO's), or normalised then
summed (GDPO; TRL multi_objective_aggregation="normalize_then_sum").

  sum_then_normalize   r_i = sum_k w_k r_{i,k}; the advantage estimator normalises r_i within the group
  normalize_then_sum   r_i = sum_k w_k (r_{i,k} - mean_g(r_k)) / (std_g(r_k) + eps), each reward normalised within
                       its group first, so one reward's scale (a 0/10 score beside a 0/1 format check) cannot drown
                       the others; the estimator then normalises the sum (TRL: over the whole batch, batch_whiten)

With G completions per group; std unbiased (TRL's nanstd); a reward that gave no value (None, NaN here) stays out of
its group's statistics and adds nothing to the row's sum; a group where a reward has one value or all equal adds
nothing for it (TRL: NaN, then nansum).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._checks import check_groups

REWARD_AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")


def normalize_then_sum(
    per_function: Tensor, weights: Tensor, group_size: int, *, eps: float = 1e-4
) -> Tensor:
    """(N,) GDPO's total reward: each function's values normalised within its group, then the weighted sum.

    Example, one group of 2, rewards accuracy [1, 0] (weight 1) and length [10, 30] (weight 1): accuracy -> mean 0.5,
    std 0.70711: 0.5 / 0.70721 = [0.70701, -0.70701]; length -> mean 20, std 14.1421: [-0.70710, 0.70710]; sums
    [-0.000095, 0.000095] (a tie), where summing first ([11, 30]) lets the length decide alone.

    Args:
        per_function: (N, K) the K reward functions' values, NaN where one gave none; rows [g*G:(g+1)*G] are group g.
        weights: (K,) the rewards' weights.
    """
    n, k = per_function.shape
    check_groups(n, group_size)
    grouped = per_function.reshape(-1, group_size, k).to(torch.float64)  # (n/G, G, K)
    mean = torch.nanmean(grouped, dim=1, keepdim=True)  # (n/G, 1, K)
    count = (~torch.isnan(grouped)).sum(dim=1, keepdim=True)  # (n/G, 1, K)
    var = torch.nanmean((grouped - mean) ** 2, dim=1, keepdim=True) * count / (count - 1).clamp(min=1)
    std = torch.where(count > 1, var.sqrt(), torch.nan)  # (n/G, 1, K) unbiased; NaN with one value
    z = (grouped - mean) / (std + eps)  # (n/G, G, K)
    total = torch.nansum(z * weights.to(torch.float64), dim=-1)  # (n/G, G)
    return total.reshape(n).to(per_function.dtype)  # (N,)
