"""Asynchronous rollouts under torchrun (``grpokit launch``, rollout.max_staleness >= 1): every rank runs its own
sampler process (grpokit.train.async_sampler) for its own share of the prompts, and the ranks agree on what
they take.

Every rank samples, not rank 0 for all: in the synchronous loop each rank already samples its share (its slice
of the step's prompts, its own seed), and the asynchronous one keeps that split. Generation then grows with the
ranks (every rank's CPU or GPU generates), no batch travels between ranks, and a sampler process needs no place
in the process group. Rank 0 sampling for all would leave the other ranks idle while it generates the whole
batch and would send every batch through a collective.

    rank r's trainer                                       rank r's sampler process (no collective)
    take(step, agree=agree_on_age(dist)): its batch j  <-  its share of batch j: the prompts and seed of
        too old on any rank: dropped on every rank          the synchronous loop (RankShare)
    update (DDP / FSDP: collectives, all ranks in step)
    push every rollout.sync_every steps                ->  the newest weights before each batch
        (the same steps on every rank)

What keeps the ranks in step:

- a batch too old on one rank is dropped on all (``agree_on_age``: one all-gather of a flag per batch taken),
  so every rank takes the same batch indices, runs the same optimizer steps and pushes at the same steps;
- a sampler process that dies (or whose reward raises) on one rank is said to the others in that same
  all-gather (``say_died``): every rank then saves the checkpoint (a collective) and stops with
  SamplerDiedError naming the rank;
- a process samples with its rank's share and seed and no collective (``RankShare``): under dynamic sampling
  each fills its own share, so the ranks' prompt streams may end at different places; a checkpoint keeps every
  rank's (``checkpoint_over_ranks``) and a resume gives each rank its own;
- fsdp: the process samples from the full, unsharded copy the trainer keeps for generation
  (Distributed.generation_model), whose trainable weights every rank gathers from the shards after each step
  (``sampling_weights``), before a push.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from torch import nn

from grpokit.rollout.episodes import OVER_RANKS as EPISODES_OVER_RANKS
from grpokit.train.async_sampler import SamplerDiedError
from grpokit.train.distributed import Distributed
from grpokit.train.sampler import Sampler, sampling_over_ranks


class RankShare(Distributed):
    """A rank's share of the prompts and its sampling seed with no process group (its world size and rank; every
    collective is the one-process no-op): what a rank's sampler process samples with."""

    def __init__(self, dist: Distributed):
        super().__init__(dist.world, dist.rank)

    @property
    def active(self) -> bool:
        return False


class OtherRankSamplerDied(SamplerDiedError):
    """Another rank's sampler process died: this rank stops with it (its own process is fine)."""


def sampling_weights(dist: Distributed, model: nn.Module, version: int) -> nn.Module:
    """The policy with whole weights, whose trainable ones a push carries: ``model`` itself, or under fsdp the
    unsharded generation copy with the weights of ``version`` gathered from the shards (a collective: every rank
    calls it at the same step), its parameters marked trainable as the policy's are (a push takes those; the
    copy is only ever run without gradients)."""
    whole = dist.generation_model(model, version)
    if whole is not model:
        for (name, p), (whole_name, w) in zip(model.named_parameters(), whole.named_parameters()):
            assert name == whole_name, (name, whole_name)
            w.requires_grad_(p.requires_grad)
    return whole


def sampler_for_process(sampler: Sampler, dist: Distributed, policy: nn.Module) -> Sampler:
    """``sampler`` as a rank's sampler process runs it: its share and seed with no collective (RankShare),
    sampling ``policy`` (``sampling_weights``). Alone: ``sampler`` itself."""
    if not dist.active:
        return sampler
    process = copy.copy(sampler)  # the same prompts, engine and rewards; its own dist and model
    process.dist = RankShare(dist)
    process.model = policy
    return process


def agree_on_age(dist: Distributed) -> Callable[[bool], bool] | None:
    """AsyncSampler.take's ``agree`` under torchrun: drop (True) when the batch is too old on any rank. A rank
    whose sampler process died sends its message instead (``say_died``); every other rank then raises
    OtherRankSamplerDied with it. None alone."""
    if not dist.active:
        return None

    def agree(too_old: bool) -> bool:
        everyone = dist.gather(("age", too_old))
        died = [(rank, said) for rank, (kind, said) in enumerate(everyone) if kind == "died"]
        if died:
            rank, said = died[0]
            raise OtherRankSamplerDied(f"on rank {rank}: {said}")
        return any(said for _, said in everyone)

    return agree


def say_died(dist: Distributed, error: SamplerDiedError) -> None:
    """This rank's sampler process died (``error``): tell the ranks waiting in ``agree_on_age`` (the all-gather
    matching theirs). Alone, or when another rank's died (they know): nothing."""
    if dist.active and not isinstance(error, OtherRankSamplerDied):
        dist.gather(("died", str(error)))


OVER_RANKS = {
    "async/staleness_mean": "mean",  # every rank trains as many samples
    "async/staleness_max": "max",
    "async/dropped": "sum",
    "async/queue_depth": "mean",
    "async/wait_s": "max",  # the step waits for the slowest rank
    "async/version": "min",  # the oldest weights that sampled any rank's share
    "async/sampler_busy": "mean",
}
"""How the async/* metrics of a take add up over ranks; async/staleness_{lag} (sample counts) are summed, the
multi-turn episode/* and tools/* ones the process sends with a batch as grpokit.rollout.episodes.OVER_RANKS says."""


def taken_over_ranks(
    dist: Distributed, sampling: dict[str, float], overlap: dict[str, float]
) -> tuple[dict[str, float], dict[str, float]]:
    """A take's sampling, async/* and (multi-turn) episode metrics over every rank's share
    (grpokit.train.sampler.sampling_over_ranks; ``OVER_RANKS``), as one process would report them; a metric no
    table names (masked_token_frac) stays this rank's. Alone: as they are."""
    if not dist.active:
        return sampling, overlap
    tables = {**EPISODES_OVER_RANKS, **OVER_RANKS}
    how = {key: tables.get(key, "sum" if key.startswith("async/staleness_") else None) for key in overlap}
    how = {key: reduction for key, reduction in how.items() if reduction}
    reduced = dist.reduce({key: overlap[key] for key in how}, how)
    return sampling_over_ranks(sampling, dist), {**overlap, **reduced}


def checkpoint_over_ranks(dist: Distributed, state: dict[str, Any], stream: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's ``async`` entry (AsyncSampler.checkpoint_state) under torchrun: the batches in flight on the
    rank that had most, and every rank's prompt-stream position after its last batch taken (``streams``, by rank;
    a resume gives each its own). Every rank calls it. Alone: ``state``."""
    if not dist.active:
        return state
    everyone = dist.gather((state["in_flight"], stream))
    return {**state, "in_flight": max(n for n, _ in everyone), "streams": [s for _, s in everyone]}
