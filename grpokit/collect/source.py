"""The seam between how a step's batch is made and the update that trains on it: the trainer asks its
``BatchSource`` for the next batch, says when the policy trained, and hands its checkpoints the source's state;
it never learns whether this process, a sampler process beside it or an engine made the batch (prime-rl's
orchestrator and trainer, Tinker's ``sample``). ``grpokit.collect.factory.make_source`` picks the source.

    source.start(log, stop, log_history)      # the run's log is open (an asynchronous source starts its process)
    got = source.next_batch(step, log_history)    # Collected: the batch, its seconds and metrics; None: a
                                              #   signal came while it waited, the step is not taken
    ... advantages, update ...
    source.trained(policy, step + 1)          # the policy has the weights of step + 1
    metrics.update(got.metrics(step_seconds))   # the source's own metrics (engine, episodes, async/*)
    state = source.state(step)                # trainer_state.pt's stream, spread (and async) entries
    said = source.load_state(state, policy, step)   # a resume, once every part is built
    source.finish(summary); source.close()

Implementations: ``SyncSource`` (the Sampler in this process, from the current policy) here, ``AsyncSource``
(grpokit.collect.asynchronous: a sampler process, batches up to ``max_age`` steps old). The reference's log-probs
come with a batch when its source made them (ScoredBatch.ref_logprobs); the update makes them otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from grpokit.collect.sampler import Sampler
from grpokit.rollout.batch import ScoredBatch
from grpokit.rollout.generation import rollout_metrics


@dataclass
class Collected:
    """A step's batch as its source hands it over."""

    batch: ScoredBatch  # this rank's share: N = P * G scored completions
    timing: dict[str, float]  # seconds by stage: generation, scoring (and reference when made with the batch)
    sampling: dict[str, float]  # sampling metrics over every rank (zero_variance_frac, sampling_rounds, ...)
    extra: dict[str, float] = field(default_factory=dict)  # the source's own: rollout/*, episode/*, async/*

    def metrics(self, step_seconds: float) -> dict[str, float]:
        """The source's own metrics for the step's line; a wait for the batch (async/wait_s) as the share of the
        step the trainer was busy (async/trainer_busy)."""
        out = dict(self.extra)
        if "async/wait_s" in out:
            out = {**out, "async/trainer_busy": 1.0 - out["async/wait_s"] / step_seconds}
        return out


class BatchSource:
    """Where a step's batch comes from (the module docstring). ``sampler``: the run's Sampler (its prompts,
    engine and rewards: the trainer's spread check and evaluation read it); ``eval_generator``: the engine held-out
    evaluation decodes with; ``max_age``: how many steps older than the policy a batch may be (0: made by it)."""

    sampler: Sampler
    eval_generator: Any
    max_age: int = 0

    def start(self, log: Any, stop: Any, log_history: Sequence[dict[str, float]] = ()) -> None:
        """The run's log is open: the source's own lines; ``stop``: the run's signal handling."""

    def next_batch(self, step: int, log_history: Sequence[dict[str, float]] = ()) -> Collected | None:
        """The batch the trainer at ``step`` trains on; ``log_history``: the steps logged so far (the reward
        functions' trainer_state). None when a signal came while it waited (the step is not taken)."""
        raise NotImplementedError

    def trained(self, policy: torch.nn.Module, step: int) -> None:
        """``policy`` now has the weights of ``step`` (steps taken)."""

    def state(self, step: int) -> dict[str, Any]:
        """What a checkpoint of ``step`` keeps of the source: ``stream`` (the prompts' position) and ``spread``
        (the spread check's memory), and its own."""
        return {"stream": self.sampler.stream.state(), "spread": self.sampler.spread_state()}

    def load_state(self, state: dict[str, Any], policy: torch.nn.Module, step: int) -> str | None:
        """Go on from a checkpoint's trainer_state.pt (``state``), with ``policy`` restored at ``step``; returns a
        line to say when the run departs from the uninterrupted one, else None."""
        self.sampler.stream.load_state(state["stream"])
        self.sampler.load_spread_state(state.get("spread"))
        return None

    def finish(self, summary: dict[str, Any]) -> None:
        """The source's entries in the run's summary."""

    def close(self) -> None:
        """Stop what the source started (a process, its workers)."""


class SyncSource(BatchSource):
    """The Sampler in this process: each step's batch sampled from the current policy, then scored."""

    def __init__(self, sampler: Sampler):
        self.sampler = sampler
        self.eval_generator = sampler.generator

    def next_batch(self, step: int, log_history: Sequence[dict[str, float]] = ()) -> Collected:
        batch, timing, sampling = self.sampler.sample_batch(step, log_history)
        # rollout/cuda_graphs, rollout/static_kv_cache; multi-turn: episode/turns_mean, tools/calls... (every rank's)
        extra = {**rollout_metrics(self.sampler.generator), **self.sampler.episode_metrics()}
        return Collected(batch, timing, sampling, extra)
