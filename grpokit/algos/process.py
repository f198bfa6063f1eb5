"""GRPO with process supervision (DeepSeekMath, arXiv 2402.03300, sec. 4.1.3): per-step rewards.

A process reward scores each reasoning step of a completion. For the G completions o_1..o_G of one
prompt, completion i has steps k = 1..K_i ending at token indices t_end(i, k) (0-based, ascending) with
scores r_{i,k}. Then

    r~_{i,k} = (r_{i,k} - mean(R)) / (std(R) + eps),   R = {r_{j,k'} : all steps of all G completions}
    A_{i,t}  = sum_{k : t_end(i,k) >= t} r~_{i,k}       (the normalised rewards of the steps ending at or after t)

Conventions (the same as the outcome estimators in advantages.py):
- std with `std_ddof` (default 1, unbiased: divide by |R| - 1); eps = 1e-6 added to the std.
- a group whose step rewards are all equal (including a group with a single step in all) gets
  A = 0 exactly, not 0/eps noise; so does a completion with no steps at all (it adds nothing to R).
- tokens after a completion's last step end get A = 0 (the empty sum). They are NOT masked: they stay
  in the loss (its KL term and its normaliser), so the objective's normaliser does not depend on the
  steps.

Worked example, G = 2, completion 0 with steps [(1, 1.0), (3, 0.0)] and 5 tokens, completion 1 with
steps [(2, 1.0)] and 4 tokens: R = [1, 0, 1], mean 2/3, std sqrt((1/9 + 4/9 + 1/9) / 2) = 0.5774, so
r~ = [0.5774, -1.1547] and [0.5774]; A_0 = [-0.5774, -0.5774, -1.1547, -1.1547, 0],
A_1 = [0.5774, 0.5774, 0.5774, 0].
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ._checks import check_groups

StepRewards = list[list[tuple[int, float]]]
"""Per completion, its steps in order as (t_end, score): t_end the 0-based index in the completion of
the step's last token, ascending (steps may end in the same token); score a finite number."""


def check_step_rewards(step_rewards: StepRewards, lengths: list[int]) -> None:
    """Raise ValueError naming the completion and the step when `step_rewards` does not fit completions
    of `lengths` tokens: not one list per completion, a t_end outside 0..length-1, t_ends not ascending,
    a score that is not a finite number."""
    if len(step_rewards) != len(lengths):
        raise ValueError(f"step_rewards has {len(step_rewards)} entries for {len(lengths)} completions")
    for i, (steps, n) in enumerate(zip(step_rewards, lengths)):
        last = -1
        for k, step in enumerate(steps):
            if not (isinstance(step, (tuple, list)) and len(step) == 2):
                raise ValueError(f"completion {i}, step {k}: expected (t_end, score), got {step!r}")
            t_end, score = step
            if isinstance(t_end, bool) or not isinstance(t_end, int) or not 0 <= t_end < n:
                raise ValueError(
                    f"completion {i}, step {k}: t_end={t_end!r} is not a token index of the completion "
                    f"(0..{n - 1}, it has {n} tokens)"
                )
            if t_end < last:
                raise ValueError(
                    f"completion {i}, step {k}: t_end={t_end} comes before the previous step's "
                    f"({last}); steps must end at ascending token indices"
                )
            if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
                raise ValueError(f"completion {i}, step {k}: score {score!r} is not a finite number")
            last = t_end


def process_group_advantages(
    step_rewards: StepRewards,
    group_size: int,
    completion_mask: Tensor,
    *,
    std_ddof: int = 1,
    eps: float = 1e-6,
) -> Tensor:
    """GRPO process supervision (DeepSeekMath sec. 4.1.3); formula and conventions in the module docstring.

    Args:
        step_rewards: (N,) lists of (t_end, score), groups contiguous (rows [g*G:(g+1)*G] are prompt g).
        group_size: G >= 2, dividing N.
        completion_mask: (N, L) 1 for generated tokens up to and including EOS; t_end < sum_t m_{i,t}
            (multi-turn: t_end a column up to the last 1, the tool tokens between turns 0).
    Returns:
        (N, L) float32 advantages, 0 at masked-out positions and after each completion's last step.
    Raises:
        ValueError: step_rewards that do not fit the mask (see check_step_rewards), bad group_size.
    """
    n, width = completion_mask.shape
    check_groups(n, group_size)
    mask = completion_mask.to(torch.bool)  # (N, L)
    # a step may end at any column up to the last generated token: the mask has gaps in multi-turn
    # rollouts (tool tokens are 0 between the model's turns), else this is the token count
    last = torch.where(mask.any(-1), width - mask.flip(-1).to(torch.long).argmax(-1), 0)  # (N,)
    check_step_rewards(step_rewards, last.tolist())
    delta = torch.zeros(n, width, dtype=torch.float64)  # (N, L) normalised score at each step's last token
    for g in range(n // group_size):
        rows = range(g * group_size, (g + 1) * group_size)
        scores = torch.tensor([s for i in rows for _, s in step_rewards[i]], dtype=torch.float64)  # (|R|,)
        if scores.numel() == 0 or bool(scores.amax() == scores.amin()):
            continue  # no steps, or all equal: no signal, advantages exactly 0
        mean, std = scores.mean(), scores.std(correction=std_ddof)  # |R| >= 2 here: two scores differ
        for i in rows:
            for t_end, s in step_rewards[i]:
                delta[i, t_end] += (s - mean) / (std + eps)
    # A_{i,t} = sum_{s >= t} delta_{i,s}: a reversed cumulative sum along the completion
    advantages = delta.flip(-1).cumsum(-1).flip(-1)  # (N, L)
    return torch.where(mask, advantages, 0).to(torch.float32).to(completion_mask.device)  # (N, L)
