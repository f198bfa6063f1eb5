"""On-policy distillation: a teacher's per-token log-probs of the student's own samples as a dense advantage.

The student samples o_i; the teacher scores each sampled token, log pi_T(o_{i,t} | o_{i,<t}); the per-token
reverse KL of the student to the teacher, estimated on the student's own token (k1),

    kl^T_{i,t} = log pi_s(o_{i,t}) - log pi_T(o_{i,t}),

negated and weighted by w (algo.teacher_kl_coef) is the token's advantage, with discount 0 (each token's own, no
return-to-go), alone or added to the verifier rewards' advantage A_i:

    A_{i,t} = A_i + w (log pi_T(o_{i,t}) - log pi_s(o_{i,t}))

Its expectation under the student's sampling is -w times the gradient of KL(pi_s || pi_T) per token, the reverse
KL of GKD (Agarwal et al., arXiv 2306.13649) in the sampled form of Thinking Machines' "On-Policy Distillation"
(2025) and Qwen3. log pi_s is the sampling policy's, the old log-probs of the ratio. Student and teacher share the
tokenizer; both at the sampling temperature (logits / T).

Worked example, one completion of 3 tokens, w = 1, A_i = 0: student [-0.1, -2.0, -0.5], teacher [-0.3, -0.2, -0.5]
-> A = [-0.2, +1.8, 0]: the token the teacher finds far likelier is pushed up, the one it finds less likely down,
the one they agree on not at all; the mean reverse KL (k1) is (0.2 - 1.8 + 0) / 3 = -0.533.
"""

from __future__ import annotations

import torch
from torch import Tensor


def teacher_advantages(
    old_logprobs: Tensor, teacher_logprobs: Tensor, completion_mask: Tensor, coef: float = 1.0
) -> Tensor:
    """(N, L) w (log pi_T - log pi_s) on the completion tokens, 0 elsewhere (module docstring).

    Args:
        old_logprobs: (N, L) the sampling policy's log-probs of its tokens (log pi_s), no gradient.
        teacher_logprobs: (N, L) the teacher's log-probs of the same tokens.
        completion_mask: (N, L) 1 for every generated token (masked positions may hold anything, even inf).
        coef: w >= 0.
    """
    if old_logprobs.shape != teacher_logprobs.shape or old_logprobs.shape != completion_mask.shape:
        raise ValueError(
            f"teacher log-probs {tuple(teacher_logprobs.shape)}, old log-probs {tuple(old_logprobs.shape)} and "
            f"completion_mask {tuple(completion_mask.shape)} must have one shape (N, L)"
        )
    mask = completion_mask.to(torch.bool)  # (N, L)
    diff = teacher_logprobs.detach().float() - old_logprobs.detach().float()  # (N, L) -kl^T
    return torch.where(mask, coef * diff, torch.zeros((), dtype=diff.dtype, device=diff.device))  # (N, L)


def teacher_kl(old_logprobs: Tensor, teacher_logprobs: Tensor, completion_mask: Tensor) -> Tensor:
    """() the mean over the completion tokens of kl^T = log pi_s - log pi_T (the reverse KL's k1 estimate)."""
    mask = completion_mask.to(torch.bool)  # (N, L)
    diff = old_logprobs.detach().double() - teacher_logprobs.detach().double()  # (N, L)
    return torch.where(mask, diff, 0.0).sum() / mask.sum().clamp(min=1)  # ()
