"""Advantage estimators of the GRPO family: one scalar per completion, broadcast to its tokens.

Layout: `rewards` is (N,) with groups contiguous, so rows [g*G:(g+1)*G] are the G completions of
prompt g (N = num_prompts * G). Every estimator returns (N,) in the dtype of `rewards`.

| kind           | formula                                                       | paper            |
|----------------|---------------------------------------------------------------|------------------|
| "grpo"         | A_i = (r_i - mean_g) / (std_g + eps)                          | arXiv 2402.03300 |
| "dr_grpo"      | A_i = r_i - mean_g                                            | arXiv 2503.20783 |
| "batch"        | A_i = (r_i - mean_g) / (std_batch(r - mean_g) + eps)          | arXiv 2501.03262 |
| "rloo"         | A_i = r_i - mean_{j != i} r_j = G/(G-1) (r_i - mean_g)        | arXiv 2402.14740 |
| "reinforce_pp" | A_i = (r_i - mean_batch) / (std_batch + eps)                  | arXiv 2501.03262 |

A group whose rewards are all equal gets advantage exactly 0 in every estimator (not 0/eps noise):
the centred rewards of such groups are forced to 0 explicitly, because floating-point centring alone
does not guarantee it (e.g. float32 mean of [0.1, 0.1, 0.1] is not exactly 0.1).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from ._checks import check_choice, check_groups
from .presets import PRESETS

GROUP_SCALES = ("group", "batch", "none")
ADVANTAGE_KINDS = ("grpo", "dr_grpo", "batch", "rloo", "reinforce_pp")


def _centred(rewards: Tensor, group_size: int) -> Tensor:
    """r - mean_g, with exact zeros for groups of identical rewards. (N,) -> (num_groups, G)."""
    check_groups(rewards.shape[0], group_size)
    if not rewards.is_floating_point():
        rewards = rewards.float()
    r = rewards.reshape(-1, group_size)  # (P, G)
    centred = r - r.mean(dim=1, keepdim=True)  # (P, G)
    flat = r.amax(dim=1, keepdim=True) == r.amin(dim=1, keepdim=True)  # (P, 1) all rewards equal
    return torch.where(flat, torch.zeros_like(centred), centred)  # (P, G)


def group_advantages(
    rewards: Tensor,
    group_size: int,
    *,
    scale: str = "group",
    std_ddof: int = 1,
    eps: float = 1e-6,
) -> Tensor:
    """Group-relative advantages (GRPO outcome supervision and its rescalings).

    Formulas, with mean_g / std_g over the G completions of the same prompt:
      scale="group": A_i = (r_i - mean_g) / (std_g + eps)        GRPO, DeepSeekMath arXiv 2402.03300 sec. 4.1.2
      scale="batch": A_i = (r_i - mean_g) / (std_B + eps)        REINFORCE++-baseline (arXiv 2501.03262), "Lite PPO";
                     std_B is the std of the centred rewards over the whole batch of N rows
      scale="none":  A_i = r_i - mean_g                          Dr. GRPO, arXiv 2503.20783 (no std division)
    std uses `std_ddof` (1: unbiased, divide by n-1, what TRL/verl/OpenRLHF use; 0: population).

    Worked example, G=4, rewards [1, 0, 1, 0]: mean 0.5, centred [.5, -.5, .5, -.5]; unbiased std
    sqrt(4 * 0.25 / 3) = 0.5774 so A = +-0.866; with std_ddof=0 std = 0.5 and A = +-1.0.

    Args:
        rewards: (N,) scalar reward per completion, groups contiguous.
        group_size: G >= 2, must divide N.
    Returns:
        (N,) advantages; exactly 0 for every member of a group whose rewards are all equal.
    Raises:
        ValueError: group_size < 2, N not a multiple of group_size, or unknown `scale`.
    """
    check_choice("scale", scale, GROUP_SCALES)
    centred = _centred(rewards, group_size)  # (P, G)
    if scale == "none":
        return centred.reshape(-1)  # (N,)
    if scale == "group":
        std = centred.std(dim=1, correction=std_ddof, keepdim=True)  # (P, 1)
    else:
        std = centred.std(correction=std_ddof)  # () over all N centred rewards
    return (centred / (std + eps)).reshape(-1)  # (N,)


def rloo_advantages(rewards: Tensor, group_size: int) -> Tensor:
    """REINFORCE Leave-One-Out advantages (Ahmadian et al., "Back to Basics", arXiv 2402.14740).

    A_i = r_i - (1/(G-1)) sum_{j != i} r_j  =  G/(G-1) * (r_i - mean_g).

    Worked example, G=3, rewards [1, 0, 0]: A_0 = 1 - (0+0)/2 = 1, A_1 = 0 - (1+0)/2 = -0.5, A_2 = -0.5.

    Args:
        rewards: (N,) groups contiguous; group_size: G >= 2 dividing N.
    Returns:
        (N,) advantages (exactly 0 for groups of equal rewards).
    """
    centred = _centred(rewards, group_size)  # (P, G)
    return (centred * (group_size / (group_size - 1))).reshape(-1)  # (N,)


def reinforce_pp_advantages(
    rewards: Tensor,
    group_size: int | None = None,
    *,
    eps: float = 1e-6,
    std_ddof: int = 1,
) -> Tensor:
    """REINFORCE++ advantages with global (batch) normalisation (Hu et al., arXiv 2501.03262).

    Two variants from the paper:
      group_size=None -> REINFORCE++:          A_i = (r_i - mean_B(r)) / (std_B(r) + eps)
                         (batch whitening; the paper also folds beta*k1 into a per-token reward,
                         see `reinforce_pp_token_advantages` for that token-level form)
      group_size=G    -> REINFORCE++-baseline: A_i = (r_i - mean_g) / (std_B(r - mean_g) + eps)
                         (group-mean baseline, then the batch std; identical to
                         group_advantages(scale="batch"); the paper pairs it with a k2 KL loss)
    mean_B / std_B are over all N rows of the batch.

    Args:
        rewards: (N,) one reward per completion (groups contiguous when group_size is given).
    Returns:
        (N,) advantages.
    """
    if group_size is not None:
        return group_advantages(rewards, group_size, scale="batch", std_ddof=std_ddof, eps=eps)
    if rewards.shape[0] < 2:
        raise ValueError(f"REINFORCE++ batch whitening needs at least 2 rewards, got {rewards.shape[0]}")
    centred = rewards - rewards.mean()  # (N,)
    flat = rewards.amax() == rewards.amin()  # () every reward equal: no signal
    centred = torch.where(flat, torch.zeros_like(centred), centred)  # (N,)
    return centred / (centred.std(correction=std_ddof) + eps)  # (N,)


def reinforce_pp_token_advantages(
    rewards: Tensor,
    kl: Tensor,
    completion_mask: Tensor,
    *,
    beta: float,
    gamma: float = 1.0,
    eps: float = 1e-6,
) -> Tensor:
    """Token-level REINFORCE++ (arXiv 2501.03262, eqs. for r_t and G_t): KL in the reward, then whitening.

      r_t = -beta * kl_t  (+ rewards_i at the last completion token, the terminating EOS)
      G_t = sum_{s >= t, masked-in} gamma^{s-t} r_s          (return-to-go, masked tokens skipped)
      A_t = (G_t - mean(G)) / (std(G) + eps)                 (mean/std over all masked-in tokens, ddof 0)

    Args:
        rewards: (B,) scalar score per completion.
        kl: (B, T) per-token KL estimate, e.g. kl_estimate(logprobs, ref_logprobs, "k1"); detached
            by the caller (it is a reward, not a loss term).
        completion_mask: (B, T) 1 for generated tokens up to and including EOS.
    Returns:
        (B, T) whitened per-token advantages, 0 at masked-out positions.
    """
    from .ppo import discounted_returns, token_level_rewards

    mask = completion_mask.to(torch.bool)  # (B, T)
    token_rewards = token_level_rewards(rewards, kl, completion_mask, beta=beta)  # (B, T)
    returns = discounted_returns(token_rewards, completion_mask, gamma)  # (B, T)
    n = mask.sum().clamp(min=1)  # ()
    mean = torch.where(mask, returns, 0).sum() / n  # ()
    var = torch.where(mask, (returns - mean) ** 2, 0).sum() / n  # ()
    return torch.where(mask, (returns - mean) / (var.sqrt() + eps), 0)  # (B, T)


def compute_advantages(
    rewards: Tensor,
    group_size: int,
    preset_or_kind: str | Mapping[str, object],
    **kw: object,
) -> Tensor:
    """One entry point for the trainer: dispatch on an advantage kind, a preset name or a settings dict.

    `preset_or_kind` is a preset name (a key of PRESETS, whose "advantage" and "std_ddof" are used), a
    settings mapping with an "advantage" key (e.g. a PRESETS entry, optionally with "std_ddof"), or one
    of ADVANTAGE_KINDS: "grpo" | "dr_grpo" | "batch" | "rloo" | "reinforce_pp" (see module docstring).
    Keyword overrides: `std_ddof`, `eps`.

    Args:
        rewards: (N,) groups contiguous; group_size: G.
    Returns:
        (N,) advantages.
    """
    unknown = set(kw) - {"std_ddof", "eps"}
    if unknown:
        raise TypeError(
            f"compute_advantages got unexpected keyword(s) {sorted(unknown)}; allowed: std_ddof, eps"
        )
    if isinstance(preset_or_kind, Mapping):
        settings = preset_or_kind
    elif preset_or_kind in PRESETS:
        settings = PRESETS[preset_or_kind]
    else:
        settings = {"advantage": preset_or_kind}
    kind = settings["advantage"]
    check_choice("advantage", kind, ADVANTAGE_KINDS)
    std_ddof = int(kw.get("std_ddof", settings.get("std_ddof", 1)))  # type: ignore[arg-type]
    eps = float(kw.get("eps", 1e-6))  # type: ignore[arg-type]
    if kind == "rloo":
        return rloo_advantages(rewards, group_size)
    if kind == "reinforce_pp":
        return reinforce_pp_advantages(rewards, eps=eps, std_ddof=std_ddof)
    scale = {"grpo": "group", "dr_grpo": "none", "batch": "batch"}[kind]
    return group_advantages(rewards, group_size, scale=scale, std_ddof=std_ddof, eps=eps)
