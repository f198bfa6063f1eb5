"""Advantage estimators of the GRPO family: one scalar per completion (N,), or one per token (N, L).

Layout: `rewards` is (N,) with groups contiguous, so rows [g*G:(g+1)*G] are the G completions of
prompt g (N = num_prompts * G). Estimators are registered in ADVANTAGES by what they do; the trainer
calls them with AdvantageInputs (rewards, mask, per-token KL, log-probs) through `compute_advantages`
(estimate.py, which also reads the presets). Per-token whitening is in whiten.py, PPO's pieces in ppo.py.

| name                        | formula                                                   | preset / paper                  |
|-----------------------------|-----------------------------------------------------------|---------------------------------|
| "group_std"                 | A_i = (r_i - mean_g) / (std_g + eps)                      | grpo, arXiv 2402.03300          |
| "group_centre"              | A_i = r_i - mean_g                                        | dr_grpo, arXiv 2503.20783       |
| "group_centre_batch_std"    | A_i = (r_i - mean_g) / (std_batch(r - mean_g) + eps)      | "Lite PPO"                      |
| "group_centre_reward_std"   | A_i = (r_i - mean_g) / (std_batch(r) + eps)               | TRL's scale_rewards="batch"     |
| "leave_one_out"             | A_i = r_i - mean_{j != i} r_j = G/(G-1) (r_i - mean_g)    | rloo, arXiv 2402.14740          |
| "batch_whiten"              | A_i = (r_i - mean_batch) / (std_batch + eps)              | (sequence-level simplification) |
| "token_whiten"              | A_{i,t} = whiten_tokens(sum_{s>=t} r_{i,s})               | reinforce_pp, arXiv 2501.03262  |
| "group_centre_token_whiten" | the same with r_i - mean_g as the score                   | reinforce_pp_baseline, ditto    |
| "process_group"             | A_{i,t} = sum of the group-normalised step rewards ending at or after t | grpo_process, 2402.03300 4.1.3 (process.py) |
| "gae"                       | A_{i,t} = whiten_tokens(GAE(r_{i,t}, V_{i,t}; gamma, lam)) | ppo, arXiv 2203.02155 (critic)  |

With a KL in the reward (kl_coef > 0), the token-level estimators put -kl_coef * k1_{i,t} on every token
and the score on the last; the per-completion ones use r_i - kl_coef * sum_t k1_{i,t}.

A group whose rewards are all equal gets advantage exactly 0 in every estimator (not 0/eps noise):
the centred rewards of such groups are forced to 0 explicitly, because floating-point centring alone
does not guarantee it (e.g. float32 mean of [0.1, 0.1, 0.1] is not exactly 0.1).

Unscored completions (`scored` False: every reward function said None, "does not apply") carry no
signal, as in TRL's GRPOTrainer (its rewards are NaN there, and nanmean / nanstd leave them out): they
are left out of every mean and std and get advantage exactly 0. Worked example, G=3, rewards [1, 0, -]
with the third unscored: mean 0.5 over the two scored, unbiased std 0.7071, A = [0.7071, -0.7071, 0]
(counting the third as 0 would give mean 1/3, std 0.5774 and A = [1.1547, -0.5774, -0.5774]).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ._checks import check_choice, check_groups, lookup
from .knobs import declare, knob
from .ppo import discounted_returns, gae, token_level_rewards
from .process import process_group_advantages
from .whiten import whiten_tokens

GROUP_SCALES = ("group", "batch", "batch_reward", "none")


def _centred(rewards: Tensor, group_size: int, scored: Tensor | None = None) -> Tensor:
    """r - mean_g over the scored rows, exactly 0 for groups whose scored rewards are all equal and at
    every unscored row. (N,) -> (num_groups, G)."""
    check_groups(rewards.shape[0], group_size)
    if not rewards.is_floating_point():
        rewards = rewards.float()
    r = rewards.reshape(-1, group_size)  # (P, G)
    ok = torch.ones_like(r, dtype=torch.bool) if scored is None else scored.reshape(-1, group_size).bool()
    n = ok.sum(dim=1, keepdim=True)  # (P, 1) scored rows per group
    mean = torch.where(ok, r, 0).sum(dim=1, keepdim=True) / n.clamp(min=1)  # (P, 1)
    centred = torch.where(ok, r - mean, 0)  # (P, G)
    high = torch.where(ok, r, -torch.inf).amax(dim=1, keepdim=True)  # (P, 1)
    low = torch.where(ok, r, torch.inf).amin(dim=1, keepdim=True)  # (P, 1)
    flat = (high == low) | (n <= 1)  # (P, 1) no spread among the scored rewards
    return torch.where(flat, torch.zeros_like(centred), centred)  # (P, G)


def _group_mean(rewards: Tensor, group_size: int, scored: Tensor) -> Tensor:
    """Each row's group mean over the group's scored rows (0 for a group with none). (N,) -> (N,)"""
    r = rewards.float().reshape(-1, group_size)  # (P, G)
    ok = scored.reshape(r.shape)  # (P, G)
    mean = torch.where(ok, r, 0).sum(dim=1, keepdim=True) / ok.sum(dim=1, keepdim=True).clamp(min=1)
    return mean.expand_as(r).reshape(-1).to(rewards.dtype if rewards.is_floating_point() else torch.float32)


def _masked_std(x: Tensor, ok: Tensor, ddof: int, dim: int | None = None) -> Tensor:
    """std of ``x`` over the entries where ``ok``, dividing by (count - ddof); 0 where count <= ddof."""
    n = ok.sum() if dim is None else ok.sum(dim=dim, keepdim=True)
    mean = (
        torch.where(ok, x, 0).sum() / n.clamp(min=1)
        if dim is None
        else (torch.where(ok, x, 0).sum(dim=dim, keepdim=True) / n.clamp(min=1))
    )
    sq = torch.where(ok, (x - mean).square(), 0)
    ss = sq.sum() if dim is None else sq.sum(dim=dim, keepdim=True)
    return (ss / (n - ddof).clamp(min=1)).sqrt()


def group_advantages(
    rewards: Tensor,
    group_size: int,
    *,
    scale: str = "group",
    std_ddof: int = 1,
    eps: float = 1e-6,
    scored: Tensor | None = None,
) -> Tensor:
    """Group-relative advantages (GRPO outcome supervision and its rescalings).

    Formulas, with mean_g / std_g over the G completions of the same prompt:
      scale="group": A_i = (r_i - mean_g) / (std_g + eps)        GRPO, DeepSeekMath arXiv 2402.03300 sec. 4.1.2
      scale="batch": A_i = (r_i - mean_g) / (std_B + eps)        "Lite PPO", a per-completion simplification of
                     REINFORCE++-baseline (arXiv 2501.03262; the paper whitens per token, see reinforce_pp_advantages);
                     std_B is the std of the centred rewards over the whole batch of N rows
      scale="batch_reward": A_i = (r_i - mean_g) / (std_B(r) + eps)   TRL's scale_rewards="batch": std_B of the
                     rewards themselves over the batch (larger than that of the centred rewards when the
                     group means differ)
      scale="none":  A_i = r_i - mean_g                          Dr. GRPO, arXiv 2503.20783 (no std division)
    std uses `std_ddof` (1: unbiased, divide by n-1, what TRL/verl/OpenRLHF use; 0: population).

    Worked example, G=4, rewards [1, 0, 1, 0]: mean 0.5, centred [.5, -.5, .5, -.5]; unbiased std
    sqrt(4 * 0.25 / 3) = 0.5774 so A = +-0.866; with std_ddof=0 std = 0.5 and A = +-1.0.

    Args:
        rewards: (N,) scalar reward per completion, groups contiguous.
        group_size: G >= 2, must divide N.
        scored: (N,) bool, False for completions no reward function scored: left out of every mean and
            std, advantage 0 (None = all scored).
    Returns:
        (N,) advantages; exactly 0 for every member of a group whose rewards are all equal.
    Raises:
        ValueError: group_size < 2, N not a multiple of group_size, or unknown `scale`.
    """
    check_choice("scale", scale, GROUP_SCALES)
    centred = _centred(rewards, group_size, scored)  # (P, G)
    if scale == "none":
        return centred.reshape(-1)  # (N,)
    ok = (
        torch.ones_like(centred, dtype=torch.bool) if scored is None else scored.reshape(centred.shape).bool()
    )
    if scale == "group":
        std = _masked_std(centred, ok, std_ddof, dim=1)  # (P, 1)
    elif scale == "batch":
        std = _masked_std(centred, ok, std_ddof)  # () over the batch's centred rewards
    else:
        r = rewards.reshape(centred.shape).to(centred.dtype)  # (P, G)
        std = _masked_std(r, ok, std_ddof)  # () over the batch's rewards themselves (TRL)
    return (centred / (std + eps)).reshape(-1)  # (N,)


def rloo_advantages(rewards: Tensor, group_size: int, scored: Tensor | None = None) -> Tensor:
    """REINFORCE Leave-One-Out advantages (Ahmadian et al., "Back to Basics", arXiv 2402.14740).

    A_i = r_i - (1/(G-1)) sum_{j != i} r_j  =  G/(G-1) * (r_i - mean_g).

    Worked example, G=3, rewards [1, 0, 0]: A_0 = 1 - (0+0)/2 = 1, A_1 = 0 - (1+0)/2 = -0.5, A_2 = -0.5.

    With unscored rows the others are the scored ones: n/(n-1) (r_i - mean_g), n scored in the group.

    Args:
        rewards: (N,) groups contiguous; group_size: G >= 2 dividing N; scored: (N,) bool or None.
    Returns:
        (N,) advantages (exactly 0 for groups of equal rewards and at unscored rows).
    """
    centred = _centred(rewards, group_size, scored)  # (P, G)
    n = (
        centred.new_full((centred.shape[0], 1), group_size)
        if scored is None
        else (scored.reshape(centred.shape).sum(dim=1, keepdim=True).to(centred.dtype))
    )  # (P, 1) scored rows per group
    return (centred * (n / (n - 1).clamp(min=1))).reshape(-1)  # (N,)


def batch_whitened_advantages(
    rewards: Tensor, *, eps: float = 1e-6, std_ddof: int = 1, scored: Tensor | None = None
) -> Tensor:
    """One scalar per completion, whitened over the whole batch (no groups).

      A_i = (r_i - mean_B(r)) / (std_B(r) + eps)

    This is the sequence-level simplification of REINFORCE++ that grpokit used before issue 12; the
    paper's own form is token-level, see `reinforce_pp_advantages`.

    Args:
        rewards: (N,) one reward per completion.
    Returns:
        (N,) advantages (exactly 0 when every reward is equal).
    """
    if rewards.shape[0] < 2:
        raise ValueError(f"batch whitening needs at least 2 rewards, got {rewards.shape[0]}")
    centred = _centred(rewards, rewards.shape[0], scored).reshape(-1)  # (N,) one group: the batch
    ok = torch.ones_like(centred, dtype=torch.bool) if scored is None else scored.bool()
    return centred / (_masked_std(centred, ok, std_ddof) + eps)  # (N,)


def reinforce_pp_advantages(
    rewards: Tensor,
    completion_mask: Tensor,
    *,
    group_size: int | None = None,
    kl: Tensor | None = None,
    kl_coef: float = 0.0,
    gamma: float = 1.0,
    eps: float = 1e-6,
    whiten_mask: Tensor | None = None,
) -> Tensor:
    """REINFORCE++ and REINFORCE++-baseline as the paper (Hu et al., arXiv 2501.03262) defines them.

      score_i  = r_i                      (REINFORCE++, group_size=None)
               = r_i - mean_g(r)          (REINFORCE++-baseline, group_size=G; exact 0 for equal groups)
      r_{i,t}  = -kl_coef * kl_{i,t}  (+ score_i at the last masked-in token, the EOS)     KL in the reward
      G_{i,t}  = sum_{s >= t} gamma^{s-t} r_{i,s}                                            return-to-go
      A_{i,t}  = whiten_tokens(G): (G - mean) / (population std + eps) over every masked-in token of the
                 batch (eq. 10)

    Worked example, no KL, rewards [1, 0], mask [[1, 1, 1], [1, 1, 0]]: G = [[1, 1, 1], [0, 0]], token
    mean 0.6, population std 0.4899, so A = [[0.8165]*3, [-1.2247]*2] (per-sequence whitening with ddof 1
    would give +-0.7071: off by 15% and 73%).

    Args:
        rewards: (N,) scalar score per completion (groups contiguous when group_size is given).
        completion_mask: (N, L).
        kl: (N, L) per-token KL estimate of the sampling policy to the reference (k1 in the paper),
            detached; None = no KL in the reward.
        kl_coef: coefficient of the KL folded into the reward.
        whiten_mask: (N, L) the tokens whose mean and std whiten (those the loss trains on); None =
            completion_mask.
    Returns:
        (N, L) token-level advantages, 0 at masked-out positions (and outside whiten_mask).
    """
    scores = rewards if group_size is None else _centred(rewards, group_size).reshape(-1)  # (N,)
    mask = completion_mask.to(torch.bool)  # (N, L)
    dtype = scores.dtype if scores.is_floating_point() else torch.float32
    kl = torch.zeros(mask.shape, dtype=dtype, device=scores.device) if kl is None else kl.to(dtype)
    token_rewards = token_level_rewards(scores.to(dtype), kl, mask, beta=kl_coef)  # (N, L)
    returns = discounted_returns(token_rewards, mask, gamma)  # (N, L)
    return whiten_tokens(returns, mask if whiten_mask is None else whiten_mask, eps=eps)  # (N, L)


@dataclass(frozen=True)
class AdvantageInputs:
    """Everything an advantage estimator may use. N completions (groups contiguous), L positions.

    An estimator is any function `AdvantageInputs -> Tensor` returning (N,) (one scalar per
    completion, broadcast to its tokens) or (N, L) (one value per token; masked positions are ignored).
    """

    rewards: Tensor
    """(N,) total reward per completion; rows [g*G:(g+1)*G] are the G completions of prompt g."""
    group_size: int
    """G, completions per prompt."""
    completion_mask: Tensor | None = None
    """(N, L) 1 for generated tokens up to and including EOS (token-level estimators need it)."""
    kl: Tensor | None = None
    """(N, L) per-token k1 = old - ref of the sampling policy to the reference, detached; None without one."""
    kl_coef: float = 0.0
    """Coefficient of the KL folded into the reward (0 = none)."""
    old_logprobs: Tensor | None = None
    """(N, L) log-probs of the sampling policy, when the trainer has them."""
    ref_logprobs: Tensor | None = None
    """(N, L) log-probs of the reference, when there is one."""
    values: Tensor | None = None
    """(N, L) a critic's value V(s_t) at each completion position (PPO's GAE), None without a critic."""
    teacher_logprobs: Tensor | None = None
    """(N, L) a teacher's log-probs of the completion tokens (on-policy distillation), None without one; its dense
    term is added after the estimator (compute_advantages, grpokit.algos.distill)."""
    step_rewards: list[list[tuple[int, float]]] | None = None
    """Process rewards: for each completion its steps in order, as (t_end, score) with t_end the index in
    the completion of the step's last token (0-based, ascending); None when rewards are per completion."""
    std_ddof: int = 1
    """Std convention of the std-scaled estimators (1 = unbiased)."""
    scored: Tensor | None = None
    """(N,) bool: False where every reward function said None; such rows stay out of the statistics and
    get advantage 0 (None = all scored)."""
    eps: float = 1e-6
    """Added to every std before dividing."""
    gamma: float = 1.0
    """GAE discount of `gae_targets` (the gae estimator sets it from its GAEParams)."""
    lam: float = 0.95
    """GAE lambda of `gae_targets` (the gae estimator sets it from its GAEParams)."""
    params: Any = None
    """The estimator's own settings: an instance of the type it was registered with (GAEParams for gae), None for
    one registered without."""
    trained_mask: Tensor | None = None
    """(N, L) the tokens the loss trains on, when fewer than completion_mask's (algo.mask_truncated leaves
    truncated completions out): the per-token whitening estimators take their mean and std over these, so
    the advantages the loss sees are whitened; None = completion_mask."""

    def sequence_rewards(self) -> Tensor:
        """r_i - kl_coef * sum_t m_{i,t} kl_{i,t}: the KL-in-reward folded into one scalar per completion,
        as RLOO does (arXiv 2402.14740), for the estimators that take one reward per completion. (N,)"""
        if self.kl is None or self.kl_coef == 0:
            return self.rewards
        penalty = torch.where(self.completion_mask.to(torch.bool), self.kl, 0).sum(-1)  # (N,)
        return self.rewards - self.kl_coef * penalty.to(self.rewards.dtype)  # (N,)

    def token_rewards(self, scores: Tensor | None = None) -> Tensor:
        """(N, L) rewards per token: -kl_coef * kl_{i,t} on every generated token (when there is a KL in
        the reward), plus `scores` (default: rewards) on the last one, as PPO and REINFORCE++ do."""
        mask = self.mask()
        scores = self.rewards if scores is None else scores
        dtype = scores.dtype if scores.is_floating_point() else torch.float32
        kl = (
            torch.zeros(mask.shape, dtype=dtype, device=scores.device)
            if self.kl is None
            else self.kl.to(dtype)
        )
        return token_level_rewards(scores.to(dtype), kl, mask, beta=self.kl_coef)  # (N, L)

    def whiten_mask(self) -> Tensor:
        """(N, L) the tokens whose statistics per-token whitening uses: trained_mask, else the completion mask."""
        return self.mask() if self.trained_mask is None else self.trained_mask

    def mask(self) -> Tensor:
        """The completion mask, required: a token-level estimator cannot run without it. (N, L)"""
        if self.completion_mask is None:
            raise ValueError("a token-level advantage needs completion_mask (N, L)")
        return self.completion_mask


def _group_scaled(scale: str, doc: str) -> Callable[[AdvantageInputs], Tensor]:
    def estimator(a: AdvantageInputs) -> Tensor:
        r = a.sequence_rewards()
        return group_advantages(r, a.group_size, scale=scale, std_ddof=a.std_ddof, eps=a.eps, scored=a.scored)

    estimator.__doc__ = doc  # the preset table (presets.preset_table) prints it
    return estimator


_group_std = _group_scaled("group", "(r - mean_g) / std_g")
_group_centre = _group_scaled("none", "r - mean_g")
_group_centre_batch_std = _group_scaled("batch", "(r - mean_g) / std_batch(r - mean_g)")
_group_centre_reward_std = _group_scaled("batch_reward", "(r - mean_g) / std_batch(r)")


def _leave_one_out(a: AdvantageInputs) -> Tensor:
    """r - mean of the others"""
    return rloo_advantages(a.sequence_rewards(), a.group_size, a.scored)


def _batch_whiten(a: AdvantageInputs) -> Tensor:
    """(r - mean_batch) / std_batch"""
    return batch_whitened_advantages(a.sequence_rewards(), std_ddof=a.std_ddof, eps=a.eps, scored=a.scored)


def _token_whiten(a: AdvantageInputs) -> Tensor:
    """returns-to-go whitened per token over the batch"""
    return reinforce_pp_advantages(
        a.rewards, a.mask(), kl=a.kl, kl_coef=a.kl_coef, eps=a.eps, whiten_mask=a.trained_mask
    )


def _group_centre_token_whiten(a: AdvantageInputs) -> Tensor:
    """r - mean_g, then returns-to-go whitened per token over the batch"""
    return reinforce_pp_advantages(
        a.rewards,
        a.mask(),
        group_size=a.group_size,
        kl=a.kl,
        kl_coef=a.kl_coef,
        eps=a.eps,
        whiten_mask=a.trained_mask,
    )


def _none(a: AdvantageInputs) -> Tensor:
    """0 (no reward signal: with algo.teacher_kl_coef, the teacher's alone)"""
    return torch.zeros(a.rewards.shape[0], dtype=torch.float32, device=a.rewards.device)  # (N,)


def _process_group(a: AdvantageInputs) -> Tensor:
    """group-normalised step rewards, summed over the steps ending at or after each token"""
    if a.kl_coef:
        raise ValueError(
            "advantage 'process_group' takes no KL in the reward (algo.kl_reward_coef); use a KL loss (algo.beta)"
        )
    if a.step_rewards is None:
        raise ValueError(
            "advantage 'process_group' needs step rewards (AdvantageInputs.step_rewards): configure a process "
            "reward, e.g. rewards: [{name: process_reward_model, kwargs: {path: DIR}}] (see grpokit.rewards.process)"
        )
    return process_group_advantages(a.step_rewards, a.group_size, a.mask(), std_ddof=a.std_ddof, eps=a.eps)


def gae_targets(inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """PPO-RLHF's advantages and critic targets from the estimator inputs (Ouyang et al. arXiv 2203.02155):

      r_{i,t} = -kl_coef * k1_{i,t}  (+ the score r_i at the last masked-in token)   `token_level_rewards`
      A, R    = gae(r, V, mask, gamma, lam)                                          R = A + V, the returns

    Worked example, one completion of 2 tokens, score 1, no KL, V = [0.5, 0.8], gamma = 1, lam = 0.5:
    delta = [0 + 0.8 - 0.5, 1 + 0 - 0.8] = [0.3, 0.2]; A = [0.3 + 0.5 * 0.2, 0.2] = [0.4, 0.2];
    R = A + V = [0.9, 1.0].

    Returns: advantages (N, L) (not whitened) and returns (N, L), 0 at masked-out positions.
    Raises: ValueError without values (the estimator needs a critic).
    """
    if inputs.values is None:
        raise ValueError(
            "advantage 'gae' needs a critic's values (N, L) in AdvantageInputs.values; the trainer builds a "
            "critic for it (algo.preset=ppo or algo.advantage=gae)"
        )
    mask = inputs.mask()  # (N, L)
    token_rewards = inputs.token_rewards()  # (N, L)
    return gae(token_rewards, inputs.values.to(token_rewards.dtype), mask, inputs.gamma, inputs.lam)


def whitened_gae(inputs: AdvantageInputs) -> Tensor:
    """GAE advantages whitened per token over the batch (`whiten_tokens`: masked mean and population std),
    as TRL's PPOTrainer and OpenRLHF do before the clipped policy loss. (N, L)"""
    advantages, _ = gae_targets(inputs)  # (N, L)
    return whiten_tokens(advantages, inputs.whiten_mask(), eps=inputs.eps)  # (N, L) over the trained tokens


@dataclass(frozen=True)
class Estimator:
    """An advantage estimator's entry: its function and what it reads and needs, so that nothing else keeps a
    list of estimators in step (the settings' checks, the trainer's critic, torchrun's split, process rewards)."""

    fn: Callable[[AdvantageInputs], Tensor]
    params: type | None = (
        None  # its own settings (a frozen dataclass of knob() fields), in AdvantageInputs.params
    )
    needs_critic: bool = False  # reads AdvantageInputs.values: choosing it makes the trainer build a critic
    group_local: bool = (
        False  # one group at a time: exact on any split of the batch into whole groups (torchrun)
    )
    scored_aware: bool = (
        False  # leaves unscored rows out of its statistics itself (else they get the group mean)
    )
    step_rewards: bool = False  # reads AdvantageInputs.step_rewards (a process reward's steps)
    kl_in_reward: bool = True  # takes a KL in the reward (algo.kl_reward_coef)
    per_token: bool = False  # one value per token (N, L); else one per completion (N,)


@dataclass(frozen=True)
class GAEParams:
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


def _gae(a: AdvantageInputs) -> Tensor:
    """GAE with a critic's values, whitened per token over the batch"""
    p = a.params if isinstance(a.params, GAEParams) else GAEParams()
    return whitened_gae(dataclasses.replace(a, gamma=p.gamma, lam=p.lam))


# Advantage estimators by what they do; the paper names are presets (presets.py). Add your own with
# `register_advantage`, or name one in YAML as "package.module:function".
ADVANTAGES: dict[str, Estimator] = {}


def register_advantage(
    name: str, fn: Callable[[AdvantageInputs], Tensor], *, params: type | None = None, **flags: bool
) -> None:
    """Make `fn` available as `algo.advantage: <name>`. It receives AdvantageInputs and returns (N,) or (N, L).
    ``params``: its settings type, whose knob() fields become algo.* settings by their flat names (given to it as
    AdvantageInputs.params); ``flags``: Estimator's (needs_critic, group_local, scored_aware, step_rewards,
    kl_in_reward, per_token), each False by default but kl_in_reward."""
    if name in ADVANTAGE_ALIASES:
        raise ValueError(f"advantage name {name!r} is taken (an alias of {ADVANTAGE_ALIASES[name]!r})")
    if params is not None:
        declare(params)
    ADVANTAGES[name] = Estimator(fn, params, **flags)


def estimator(name: str) -> Estimator:
    """The entry of estimator `name` (an alias, or "package.module:function" imported on demand: its function
    with every flag at its default, as one registered without flags)."""
    name = ADVANTAGE_ALIASES.get(name, name)
    if name not in ADVANTAGES and ":" in name:
        ADVANTAGES[name] = Estimator(lookup("advantage", name, {}))
    return lookup("advantage", name, ADVANTAGES, also=ADVANTAGE_ALIASES)


def get_advantage(name: str) -> Callable[[AdvantageInputs], Tensor]:
    """The estimator function registered as `name` (an alias, or "package.module:function" imported on demand)."""
    return estimator(name).fn


def group_local(name: str) -> bool:
    """True for an estimator (or its alias) registered group_local: computed on any whole groups alone."""
    return estimator(name).group_local


def user_defined(name: str) -> bool:
    """A "package.module:function" estimator: it may read anything, so no setting is judged against it."""
    return ":" in ADVANTAGE_ALIASES.get(name, name)


# Names from before the estimators were named by what they do; still accepted.
ADVANTAGE_ALIASES = {
    "grpo": "group_std",
    "dr_grpo": "group_centre",
    "batch": "group_centre_batch_std",
    "rloo": "leave_one_out",
    "reinforce_pp": "token_whiten",
}

register_advantage("group_std", _group_std, group_local=True, scored_aware=True)  # (r - mean_g) / std_g  GRPO
register_advantage("group_centre", _group_centre, group_local=True, scored_aware=True)  # r - mean_g  Dr. GRPO
# (r - mean_g) / std_B(r - mean_g)   "Lite PPO"; (r - mean_g) / std_B(r)   TRL scale_rewards="batch"
register_advantage("group_centre_batch_std", _group_centre_batch_std, scored_aware=True)
register_advantage("group_centre_reward_std", _group_centre_reward_std, scored_aware=True)
register_advantage("leave_one_out", _leave_one_out, group_local=True, scored_aware=True)  # RLOO
register_advantage(
    "batch_whiten", _batch_whiten, scored_aware=True
)  # (r - mean_B) / std_B, one per completion
register_advantage(
    "token_whiten", _token_whiten, per_token=True
)  # returns-to-go whitened per token  REINFORCE++
register_advantage("group_centre_token_whiten", _group_centre_token_whiten, per_token=True)  # -baseline
register_advantage(  # sum of group-normalised step rewards at or after t   GRPO process supervision
    "process_group", _process_group, group_local=True, step_rewards=True, kl_in_reward=False, per_token=True
)
register_advantage("gae", _gae, params=GAEParams, needs_critic=True, per_token=True)  # GAE(gamma, lam)  PPO
register_advantage("none", _none, group_local=True, scored_aware=True)  # 0: on-policy distillation alone
ADVANTAGE_KINDS = (*ADVANTAGES, *ADVANTAGE_ALIASES)
