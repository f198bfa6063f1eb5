"""Asynchronous rollouts under torchrun (``grpokit launch``, rollout.max_staleness >= 1): every rank runs its own
sampler process (grpokit.collect.async_sampler) for its own share of the prompts, and the ranks agree on what
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
  all-gather (``say_died``): every rank then saves the checkpoint (a collective) and stops with the same kind
  of error (SamplerDiedError, or the reward's RewardFunctionError: the same exit code) naming the rank;
- a process samples with its rank's share and seed and no collective (``RankShare``): under dynamic sampling
  each fills its own share, so the ranks' prompt streams may end at different places; a checkpoint keeps every
  rank's position and batches in flight (``checkpoint_over_ranks``) and a resume gives each rank its own
  (``rank_state``);
- fsdp: the process samples from the full, unsharded copy the trainer keeps for generation
  (Distributed.generation_model), whose trainable weights every rank gathers from the shards after each step
  (``sampling_weights``), before a push.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from torch import nn

from grpokit.collect.async_sampler import SamplerDiedError
from grpokit.collect.sampler import Sampler, sampling_over_ranks
from grpokit.core import errors
from grpokit.rollout.episodes import OVER_RANKS as EPISODES_OVER_RANKS
from grpokit.train.distributed import Distributed


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
    whose sampler process died or failed sends its error instead (``say_died``); every other rank then raises
    the same kind of error with it (``told_by``). None alone."""
    if not dist.active:
        return None

    def agree(too_old: bool) -> bool:
        everyone = dist.gather(("age", too_old))
        died = [(rank, said) for rank, (kind, said) in enumerate(everyone) if kind == "died"]
        if died:
            rank, said = died[0]
            raise told_by(rank, *said)
        return any(said for _, said in everyone)

    return agree


def told_by(rank: int, name: str, code: int, message: str) -> Exception:
    """The error a rank stops with when rank ``rank``'s sampler failed with the error class ``name`` (exit code
    ``code``) saying ``message``: that class when grpokit.core.errors defines it, else one of its kind, so that
    every rank ends with the same exit code; OtherRankSamplerDied when the process itself died. Marked
    ``told_by_rank``: ``say_died`` does not say it again."""
    cls = getattr(errors, name, None)
    if not (isinstance(cls, type) and issubclass(cls, Exception)):
        kinds = {errors.EXIT_USAGE: errors.ConfigError, errors.EXIT_USER_CODE: errors.UserCodeFailedError}
        cls = kinds.get(code)
    if cls is None or issubclass(cls, SamplerDiedError):
        cls = OtherRankSamplerDied
    error = cls(f"on rank {rank}: {message}")
    error.told_by_rank = rank
    return error


def say_died(dist: Distributed, error: Exception) -> None:
    """This rank's sampler process died or failed (``error``: SamplerDiedError, or the user's code failing there):
    tell the ranks waiting in ``agree_on_age`` (the all-gather matching theirs): its class, exit code and message.
    Alone, or when another rank's failed (they know): nothing."""
    if dist.active and getattr(error, "told_by_rank", None) is None:
        dist.gather(("died", (type(error).__name__, errors.exit_code(error), str(error))))


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
    (grpokit.collect.sampler.sampling_over_ranks; ``OVER_RANKS``), as one process would report them; a metric no
    table names (masked_token_frac) stays this rank's. Alone: as they are."""
    if not dist.active:
        return sampling, overlap
    tables = {**EPISODES_OVER_RANKS, **OVER_RANKS}
    how = {key: tables.get(key, "sum" if key.startswith("async/staleness_") else None) for key in overlap}
    how = {key: reduction for key, reduction in how.items() if reduction}
    reduced = dist.reduce({key: overlap[key] for key in how}, how)
    return sampling_over_ranks(sampling, dist), {**overlap, **reduced}


PER_RANK = ("stream", "batches", "in_flight", "dropped_total")
"""The entries of a checkpoint's ``async`` state (AsyncSampler.checkpoint_state) that are each rank's own."""


def checkpoint_over_ranks(dist: Distributed, state: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's ``async`` entry (AsyncSampler.checkpoint_state) under torchrun: rank 0's, with every rank's
    own entries (``PER_RANK``: its prompt-stream position after its last batch taken, its batches in flight)
    in ``ranks``, by rank, and ``in_flight`` the most any rank lost. Every rank calls it. Alone: ``state``."""
    if not dist.active:
        return state
    everyone = dist.gather({key: state[key] for key in PER_RANK if key in state})
    return {**state, "in_flight": max(own["in_flight"] for own in everyone), "ranks": everyone}


def rank_state(dist: Distributed, saved: dict[str, Any] | None) -> dict[str, Any] | None:
    """This rank's part of a checkpoint's ``async`` entry (``checkpoint_over_ranks``): its own ``PER_RANK``
    entries over the shared ones; a checkpoint written before ``ranks`` gives its prompt position alone
    (``streams``)."""
    if not saved or not dist.active:
        return saved
    if saved.get("ranks"):
        return {**saved, **saved["ranks"][dist.rank]}
    if saved.get("streams"):
        return {**saved, "stream": saved["streams"][dist.rank]}
    return saved
