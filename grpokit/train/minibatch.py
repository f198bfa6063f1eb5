"""The mini-batch helpers every pass over a sampled batch shares: the policy's update (grpokit.train.update), PPO's
critic (grpokit.train.critic), the advantages' loss mask (grpokit.train.advantages) and the no-grad log-prob passes
(the reference's and the teacher's, grpokit.train.reference / teacher, also made in an asynchronous run's sampler
process).

    mask = loss_mask(rollout, mask_truncated)                    # (N, Lc) the tokens the losses train on
    for mb in mini_batch_order(N, optim, seed): ...              # (M,) rows each: epochs x mini_batches
    t = micro_tensors(rollout, rows, mask, device)               # a micro-batch's tensors, trimmed
    out = rows_no_grad(learner, rollout, forward)                # (N, Lc) over the learner's micro-batches
    logp = eval_logprobs(model, rollout, learner, fn, temperature=t, chunk_size=c)   # (N, Lc)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from grpokit.config.schema import OptimConfig
from grpokit.rollout.batch import length_sorted
from grpokit.rollout.generation import Rollout
from grpokit.train.learner import Learner


def loss_mask(r: Rollout, mask_truncated: bool) -> torch.Tensor:
    """(N, Lc) the tokens the losses train on: the completion mask, with truncated completions left out
    under DAPO's overlong filtering (algo.mask_truncated)."""
    mask = r.completion_mask.clone()  # (N, Lc)
    if mask_truncated:
        mask[r.truncated] = 0
    return mask


def several_passes(optim: OptimConfig) -> bool:
    """More than one gradient step per rollout: the ratio's denominator must be frozen beforehand."""
    return optim.epochs > 1 or optim.mini_batches > 1


def mini_batch_order(n: int, optim: OptimConfig, seed: int) -> Iterator[torch.Tensor]:
    """The update's mini-batches, each (M,) row indices: optim.epochs passes over the n rows, each split
    into optim.mini_batches. Several passes shuffle each pass with a generator seeded with ``seed`` (the
    step's), so the policy's update and the critic's see the same rows in the same order."""
    mini = n // optim.mini_batches
    order_gen = torch.Generator().manual_seed(seed)
    for _ in range(optim.epochs):
        order = torch.randperm(n, generator=order_gen) if several_passes(optim) else torch.arange(n)
        for m in range(optim.mini_batches):
            yield order[m * mini : (m + 1) * mini]  # (M,)


def micro_tensors(
    r: Rollout, idx: torch.Tensor, mask: torch.Tensor, device: torch.device
) -> dict[str, torch.Tensor]:
    """Rows ``idx`` of the batch, trimmed to their own longest prompt/completion, on ``device``; with
    "context_mask" for multi-turn rollouts (the tool tokens attended to, see Rollout.context_mask)."""
    pm = r.prompt_mask[idx]
    cm = r.attention_mask[idx]
    p_start = int((pm.sum(0) > 0).nonzero().min()) if pm.any() else 0
    c_len = max(1, int((cm.sum(0) > 0).nonzero().max()) + 1) if cm.any() else 1
    d = device
    extra = {} if r.context_mask is None else {"context_mask": cm[:, :c_len].to(d)}
    return extra | {
        "prompt_ids": r.prompt_ids[idx][:, p_start:].to(d),
        "prompt_mask": pm[:, p_start:].to(d),
        "completion_ids": r.completion_ids[idx][:, :c_len].to(d),
        "completion_mask": r.completion_mask[idx][:, :c_len].to(d),
        "loss_mask": mask[idx][:, :c_len].to(d),
        "sample_logprobs": r.logprobs[idx][:, :c_len].to(d),
    }


@torch.no_grad()
def rows_no_grad(
    learner: Learner, r: Rollout, forward: Callable[[dict[str, torch.Tensor]], torch.Tensor]
) -> torch.Tensor:
    """(N, Lc) on the CPU: ``forward(tensors)`` -> (n, L) over micro-batches of length-sorted rows (tensors
    as from micro_tensors), under the learner's autocast, sized, packed (learner.micro.packed) and retried
    as its updates are."""
    N, Lc = r.completion_ids.shape
    out = torch.zeros(N, Lc)
    lengths = r.row_lengths  # (N,)

    def run(limit: int) -> None:  # rows per micro-batch, or packed a token budget
        for micro in learner.micro.split(length_sorted(torch.arange(N), lengths), lengths, limit):
            t = micro_tensors(r, micro, r.completion_mask, learner.device)
            with learner.precision.autocast(learner.device):  # the same numerics as the update
                values = forward(t)  # (n, L)
            out[micro, : values.shape[1]] = values.float().cpu()

    learner.run_micro(run, lengths)
    return out


def eval_logprobs(
    model,
    r: Rollout,
    learner,
    logprobs_fn: Callable[..., tuple],
    *,
    temperature: float,
    chunk_size: int,
    entropy: bool = False,
) -> torch.Tensor:
    """(N, Lc) log-probs of the batch's completions under ``model`` in eval mode (with ``entropy`` their
    entropies instead), over ``learner``'s micro-batches (rows_no_grad), through ``logprobs_fn`` (``model``'s
    completion_logprobs, see Distributed.logprobs_fn). The one function of the log-prob passes before an
    update: the trainer's (PolicyUpdate.logprobs_no_grad) and the reference's in an asynchronous run's sampler
    process (grpokit.train.reference), so both compute the same numbers."""
    model.eval()

    def forward(t: dict[str, torch.Tensor]) -> torch.Tensor:
        logprobs, token_entropy = logprobs_fn(
            t["prompt_ids"],
            t["prompt_mask"],
            t["completion_ids"],
            t["completion_mask"],
            temperature=temperature,
            chunk_size=chunk_size,
            with_entropy=entropy,
            context_mask=t.get("context_mask"),
            packed=learner.micro.packed,
            **({"shared_prefix": True} if getattr(learner, "shared_prefix", False) else {}),
            **({"fused": True} if getattr(learner, "fused_logprobs", False) else {}),
        )
        return token_entropy if entropy else logprobs  # (n, L)

    return rows_no_grad(learner, r, forward)
