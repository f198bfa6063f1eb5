"""The frozen reference's log-probs computed in an asynchronous run's sampler process (rollout.max_staleness >= 1,
algo.beta > 0 or algo.kl_reward_coef > 0), beside the update instead of before it (issue 34).

The reference never changes, so its log-probs of a batch are the same whichever process computes them and
however old the batch is: the sampler process computes them right after scoring, with the same function, the
same micro-batches and the same precision as the trainer's update (grpokit.train.minibatch.eval_logprobs, through grpokit.train.reference.ReferencePass), and
ships them in the batch (ScoredBatch.ref_logprobs); the trainer then skips its own pass. On a CPU with one
torch thread on both sides (the demo's), the values are bit for bit the trainer's (tested).

    reference = sampler_reference(cfg, algo, dist, device, ref_model, precision, asynchronous=True)  # None: the trainer's
    ref_logprobs = reference.logprobs(policy, rollout)    # (N, Lc), in the sampler process

Memory: the process uses the trainer's own copy of the reference, not one of its own. Its weights travel as
shared tensors (``shared_tensors``), never pickled: a forked process maps the trainer's pages (copy on write,
and nothing writes them), a spawned one maps them from shared memory. With LoRA the reference is the base
model with the adapter disabled, which the process's copy of the policy already holds: nothing more is sent.

Where the trainer keeps its own pass (``sampler_reference`` returns None):

- on a GPU (the sampler samples on the trainer's device; sharing the reference's CUDA weights with it is
  not done);
- under fsdp, whose reference is sharded over the ranks (a sampler process holds no shard group);
- with algo.ref_sync_every > 0: that reference moves toward the policy in place, so the sampler process would read
  it while it changes, and it would not be the same for a batch sampled before a move and trained after it.

Under torchrun with ddp each rank's process computes its own share's. The trainer's micro-batches of a padded
``optim.micro_batch_size=auto`` on a CPU (and of packed ones) follow the longest row over all ranks, which a
rank's process does not know: it splits by its own rows, so the values may differ from the trainer's pass in
their float rounding (each row's forward is the same; only the padding of its micro-batch differs).
"""

from __future__ import annotations

import torch

from grpokit.model.precision import Precision
from grpokit.train.distributed import Distributed
from grpokit.train.reference import ReferencePass


def sampler_reference(
    cfg,
    algo,
    dist: Distributed,
    device: torch.device,
    ref_model: torch.nn.Module | None,
    precision: Precision,
    *,
    asynchronous: bool,
) -> ReferencePass | None:
    """The reference pass an asynchronous run's sampler process makes (the module docstring); None where the
    trainer keeps its own: a synchronous run (``asynchronous`` False: grpokit.collect.factory decides), no reference
    (algo.beta = 0 and no KL in the reward), a reference that moves (algo.ref_sync_every), a GPU, fsdp."""
    if not asynchronous or not algo.uses_reference or algo.kl.ref_sync_every:
        return None  # (a reference that moves, algo.ref_sync_every: the trainer's copy, changed in place)
    if device.type != "cpu" or (dist.active and dist.strategy == "fsdp"):
        return None
    return ReferencePass.from_config(ref_model, precision, device, cfg)
