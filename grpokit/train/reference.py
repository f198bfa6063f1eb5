"""A frozen model's log-probs of a batch as the trainer's update computes them (the same function, micro-batches
and precision: grpokit.train.minibatch.eval_logprobs), made from settings a process can be sent: the reference's
in an asynchronous run's sampler process (grpokit.collect.reference says when and why), the teacher's in on-policy
distillation (grpokit.train.teacher).

    log_pass = ReferencePass.from_config(model, precision, device, cfg)   # as cfg's trainer runs its passes
    ref_logprobs = log_pass.logprobs(policy, rollout)    # (N, Lc); model None: the policy with its adapter off

And the reference's one move, algo.ref_sync_every > 0: ``mix_toward(reference, policy, alpha)``.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from grpokit.model.logprobs import completion_logprobs
from grpokit.model.precision import Precision
from grpokit.model.shared_prefix import shared_prefix_on
from grpokit.rollout.generation import Rollout
from grpokit.train.distributed import Distributed
from grpokit.train.learner import MicroBatchSize
from grpokit.train.minibatch import eval_logprobs

REFERENCE_DIR = "reference"
"""A checkpoint's folder of the moved reference (algo.ref_sync_every > 0), a Hugging Face folder beside the policy's
files (grpokit.model.checkpoint.MODEL_SUBFOLDERS)."""


@torch.no_grad()
def mix_toward(target: torch.nn.Module, policy: torch.nn.Module, alpha: float) -> None:
    """target <- alpha * policy + (1 - alpha) * target, parameter by parameter, in place: the reference's move
    (algo.ref_sync_every; TR-DPO's soft update, arXiv 2404.09656, TRL's SyncRefModelCallback, whose formula this is)
    and the weight average's step (grpokit.train.weight_average, alpha = 1 - decay). ``target`` and ``policy`` have
    the same parameters by name (``target`` is a copy of the policy; FSDP2 may list them in another order); under
    fsdp both are sharded alike, and each rank mixes its own shards. ``target`` may live elsewhere
    (optim.offload_reference: CPU memory)."""
    if not 0 < alpha <= 1:
        raise ValueError(f"alpha must be in (0, 1], got {alpha}")
    targets, sources = dict(target.named_parameters()), dict(policy.named_parameters())
    if targets.keys() != sources.keys():
        differ = sorted(targets.keys() ^ sources.keys())[:3]
        raise ValueError(f"the model's parameters are not the policy's ({differ}...): it is not a copy of it")
    for name, param in targets.items():
        if not sources[name].requires_grad:  # frozen in the policy (LoRA's base): the copy holds it already
            continue
        mine, theirs = _local(param), _local(sources[name])  # (shard) tensors
        if mine.shape != theirs.shape:
            raise ValueError(
                f"parameter {name} of shape {tuple(mine.shape)} against the policy's {tuple(theirs.shape)}"
            )
        mine.mul_(1.0 - alpha).add_(theirs.to(mine.device, mine.dtype), alpha=alpha)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """An FSDP2 parameter's own shard (a DTensor's local tensor, which shares its storage), else the tensor."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


@dataclasses.dataclass
class _NoGradRows:
    """What grpokit.train.update.rows_no_grad reads of a Learner: its micro-batching, device and precision."""

    micro: MicroBatchSize
    device: torch.device
    precision: Precision
    shared_prefix: bool = False  # optim.shared_prefix: each prompt once (grpokit.model.shared_prefix)
    fused_logprobs: bool = False  # optim.fused_logprobs (grpokit.model.fused_logprobs)

    def run_micro(self, fn: Callable[[int], Any], lengths: torch.Tensor) -> Any:
        return self.micro.run(fn, lengths, on_oom=lambda: None)  # a forward: no partial gradient to drop


@dataclasses.dataclass
class ReferencePass:
    """The reference's log-probs of a batch as the trainer's update computes them (PolicyUpdate.logprobs_no_grad,
    through the same ``eval_logprobs``), made from settings a process can be sent. ``model``: the frozen
    reference (its tensors travel shared, grpokit.collect.transport.shared_tensors), None with LoRA."""

    model: torch.nn.Module | None
    precision: Precision
    device: torch.device
    temperature: float
    chunk_size: int  # optim.logprob_chunk_size
    micro_batch_size: int | str  # optim.micro_batch_size
    micro_batch_tokens: int | str | None  # optim.packing: its token budget; None: padded micro-batches
    shared_prefix: bool = False  # optim.shared_prefix (padded micro-batches only), as the trainer's passes
    fused_logprobs: bool = False  # optim.fused_logprobs, as the trainer's passes

    @classmethod
    def from_config(cls, model: torch.nn.Module | None, precision: Precision, device: torch.device, cfg) -> ReferencePass:
        """The pass as ``cfg``'s trainer runs its own: rollout.temperature and the optim.* settings of its log-prob
        passes (optim.shared_prefix resolved for ``device``)."""
        optim = cfg.optim
        return cls(
            model, precision, device, cfg.rollout.temperature, optim.logprob_chunk_size, optim.micro_batch_size,
            optim.micro_batch_tokens if optim.packing else None, shared_prefix_on(optim.shared_prefix, device),
            optim.fused_logprobs,
        )  # fmt: skip

    def logprobs(self, policy: torch.nn.Module, r: Rollout) -> torch.Tensor:
        """(N, Lc) the reference's log-probs of ``r``'s completions; ``policy``: this process's copy of the policy,
        whose base with the adapter disabled is the reference under LoRA."""
        micro = MicroBatchSize(
            self.micro_batch_size, self.device, Distributed(), tokens=self.micro_batch_tokens
        )
        shared = self.shared_prefix and self.micro_batch_tokens is None
        rows = _NoGradRows(micro, self.device, self.precision, shared, self.fused_logprobs)
        if self.model is None:  # LoRA: the base model, the adapter disabled
            model, adapter_off = policy, policy.disable_adapter()
        else:
            model, adapter_off = self.model, contextlib.nullcontext()
        was_training = policy.training
        with adapter_off:
            out = eval_logprobs(
                model, r, rows, partial(completion_logprobs, model), temperature=self.temperature,
                chunk_size=self.chunk_size,
            )  # fmt: skip
        policy.train(was_training)
        return out
