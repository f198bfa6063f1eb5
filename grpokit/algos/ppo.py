"""PPO baseline pieces (Schulman et al. arXiv 1707.06347; GAE arXiv 1506.02438; RLHF form of
Ouyang et al. arXiv 2203.02155): per-token KL-penalised rewards, GAE, returns, clipped value loss.

All functions take (B, T) tensors with a completion mask (1 up to and including EOS). Masked-out
positions are skipped by the recursions (the next masked-in token is "t+1"), so any padding side works.
"""

from __future__ import annotations

import torch
from torch import Tensor


def token_level_rewards(rewards: Tensor, kl: Tensor, completion_mask: Tensor, *, beta: float) -> Tensor:
    """r_t = -beta * kl_t, plus the sequence score at its last masked-in token (the EOS).

    Args:
        rewards: (B,) scalar score per completion; kl: (B, T) per-token KL estimate (detach it);
        completion_mask: (B, T).
    Returns:
        (B, T) per-token rewards, 0 at masked-out positions.
    """
    mask = completion_mask.to(torch.bool)  # (B, T)
    m = mask.to(kl.dtype)  # (B, T)
    csum = m.cumsum(-1)  # (B, T)
    is_last = mask & (csum == m.sum(-1, keepdim=True))  # (B, T) one-hot at the last masked-in token
    out = -beta * kl + is_last.to(kl.dtype) * rewards.to(kl.dtype).unsqueeze(-1)  # (B, T)
    return torch.where(mask, out, torch.zeros_like(out))  # (B, T)


def gae(rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float) -> tuple[Tensor, Tensor]:
    """Generalised Advantage Estimation (Schulman et al. arXiv 1506.02438).

      delta_t = r_t + gamma V_{t+1} - V_t        (V after the last masked-in token is 0: terminal)
      A_t     = sum_l (gamma lam)^l delta_{t+l}  = delta_t + gamma lam A_{t+1}
      returns = A + V

    Args:
        rewards: (B, T) per-token rewards (see token_level_rewards); values: (B, T) critic values;
        mask: (B, T) completion mask; masked-out positions are skipped and get 0.
    Returns:
        advantages (B, T), returns (B, T), both 0 where mask is 0, no gradient (computed under no_grad).
    """
    with torch.no_grad():
        m = mask.to(torch.bool)  # (B, T)
        values = torch.where(m, values, 0).to(rewards.dtype)  # (B, T)
        next_value = rewards.new_zeros(rewards.shape[0])  # (B,)
        next_adv = rewards.new_zeros(rewards.shape[0])  # (B,)
        adv = torch.zeros_like(rewards)  # (B, T)
        for t in reversed(range(rewards.shape[1])):
            delta = rewards[:, t] + gamma * next_value - values[:, t]  # (B,)
            a_t = delta + gamma * lam * next_adv  # (B,)
            adv[:, t] = torch.where(m[:, t], a_t, 0)
            next_adv = torch.where(m[:, t], a_t, next_adv)  # (B,) carried over masked positions
            next_value = torch.where(m[:, t], values[:, t], next_value)  # (B,)
        returns = torch.where(m, adv + values, 0)  # (B, T)
    return adv, returns


def discounted_returns(rewards: Tensor, mask: Tensor, gamma: float = 1.0) -> Tensor:
    """G_t = sum_{s >= t} gamma^{s-t} r_s over masked-in tokens (GAE with V = 0, lam = 1). (B, T) -> (B, T)."""
    adv, _ = gae(rewards, torch.zeros_like(rewards), mask, gamma, 1.0)
    return adv  # (B, T)


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    clip: float | None,
    *,
    num_tokens: int | float | Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped value loss (PPO2 / OpenAI baselines), token-mean over the batch.

      v_clip = clip(V, V_old - c, V_old + c)
      loss   = sum_t m * 0.5 * max((V - R)^2, (v_clip - R)^2) / num_tokens     (clip=None: no v_clip term)

    Args:
        values: (B, T) current critic values (gradient); old_values: (B, T) values at sampling time;
        returns: (B, T) targets from `gae`; mask: (B, T); clip: c or None.
        num_tokens: global sum of the mask over the optimisation batch (default: this call's).
    Returns:
        loss (), metrics {"vf_clip_frac", "value_mean", "num_tokens"} (detached, over this call's tokens).
    """
    m = mask.to(torch.bool)  # (B, T)
    zero = values.new_zeros(())  # ()
    v = torch.where(m, values, zero)  # (B, T)
    ret = torch.where(m, returns.to(v.dtype), zero)  # (B, T)
    err = (v - ret).square()  # (B, T)
    if clip is not None:
        old = torch.where(m, old_values.to(v.dtype), zero)  # (B, T)
        v_clip = old + (v - old).clamp(-clip, clip)  # (B, T)
        err_clip = (v_clip - ret).square()  # (B, T)
        clipped = (err_clip > err) & m  # (B, T)
        err = torch.maximum(err, err_clip)  # (B, T)
    else:
        clipped = torch.zeros_like(m)
    n_local = m.sum().to(v.dtype)  # ()
    n = n_local if num_tokens is None else torch.as_tensor(num_tokens, dtype=v.dtype, device=v.device)
    loss = 0.5 * torch.where(m, err, zero).sum() / n.clamp(min=1)  # ()
    denom = n_local.clamp(min=1).detach()
    metrics = {
        "vf_clip_frac": (clipped.sum() / denom).detach(),
        "value_mean": (v.detach().sum() / denom),
        "num_tokens": n_local.detach(),
    }
    return loss, metrics


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> Tensor:
    """1 - Var(R - V) / Var(R) over the masked-in tokens (population variances): 1 for a perfect critic,
    0 for one no better than the mean return, negative for a worse one; NaN when Var(R) = 0.

    Worked example: R = [1, 0, 1, 0], V = [0.5] * 4: Var(R) = 0.25, R - V = [0.5, -0.5, 0.5, -0.5] with
    Var 0.25, so 0; V = [0.9, 0.1, 0.9, 0.1]: Var(R - V) = 0.01, so 1 - 0.01 / 0.25 = 0.96. () float64"""
    m = mask.to(torch.bool)  # (N, L)
    r = returns[m].double()  # (K,)
    v = values[m].double()  # (K,)
    var_r = r.var(correction=0) if r.numel() else r.new_tensor(float("nan"))
    return 1 - (r - v).var(correction=0) / var_r if var_r > 0 else r.new_tensor(float("nan"))
