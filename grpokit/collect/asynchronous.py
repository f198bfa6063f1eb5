"""``AsyncSource``: the batch source of an asynchronous run (rollout.max_staleness = K >= 1). A sampler process
(grpokit.collect.async_sampler) makes the next batches while the trainer updates on the current one; under torchrun
every rank has its own for its share (grpokit.collect.async_ranks). What the trainer sees is the BatchSource's
(grpokit.collect.source): a batch at most K steps old, taken; ``trained`` pushes the weights when due.

    source = AsyncSource(sampler, dist, policy, plan, reference=...)   # built by grpokit.collect.factory
    source.start(log, stop, log_history)       # starts the process: the first batch is made while the trainer evaluates
    got = source.next_batch(step, log_history)     # None: a signal (to this process or the sampler's) came while waiting

The process dying or stalling, or the user's code failing there, raises (with every rank told under torchrun,
so all save the checkpoint and stop with the same kind of error); a SIGTERM or SIGINT sent to the process stops
the run after its step as one sent to the trainer does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from grpokit.collect.async_ranks import (
    agree_on_age,
    checkpoint_over_ranks,
    rank_state,
    sampler_for_process,
    sampling_weights,
    say_died,
    taken_over_ranks,
)
from grpokit.collect.async_sampler import AsyncSampler, StopRequested
from grpokit.collect.sampler import Sampler
from grpokit.collect.source import BatchSource, Collected
from grpokit.core.errors import ConfigError, TrainingError
from grpokit.train.distributed import Distributed


class AsyncSource(BatchSource):
    """Batches from a sampler process beside the update (the module docstring). ``plan``: the factory's
    SourcePlan (K, the push interval, the heartbeat's timeout, the reward functions the process resolves again);
    ``reference``: the reference pass the process makes with each batch (None: the trainer's update makes it);
    ``eval_generator``: what the trainer's evaluation decodes with."""

    def __init__(
        self,
        sampler: Sampler,
        dist: Distributed,
        policy: torch.nn.Module,
        plan: Any,
        *,
        reference: Any = None,
        eval_generator: Any = None,
    ):
        self.sampler, self.dist, self.max_age = sampler, dist, plan.max_age
        self.sync_every = plan.sync_every
        self.eval_generator = eval_generator if eval_generator is not None else sampler.generator
        whole = sampling_weights(dist, policy, 0)  # fsdp: the unsharded copy
        self.process = AsyncSampler(
            sampler_for_process(sampler, dist, whole), whole, rewards=plan.process_rewards,
            max_staleness=plan.max_age, sync_every=plan.sync_every, version=0, reference=reference,
            timeout_s=plan.timeout_s,
        )  # fmt: skip
        self._stop = None  # the run's signal handling (start)

    def start(self, log: Any, stop: Any, log_history: Sequence[dict[str, float]] = ()) -> None:
        self._stop = stop
        self.process.start(log_history)  # the first batch is made while the trainer evaluates
        log.print(
            f"asynchronous rollouts: sampler process {self.process.pid}, batches at most {self.max_age} step(s) "
            f"old, weights pushed every {self.sync_every} step(s)"
        )

    def next_batch(self, step: int, log_history: Sequence[dict[str, float]] = ()) -> Collected | None:
        """The process's next batch, at most max_age steps old; None when a signal (to this process or to the
        sampler's) came while it waited (one process: under torchrun the ranks take their batches in step)."""
        process, stopping = self.process, None
        if not self.dist.active:
            stopping = lambda: bool(self._stop and self._stop.signal_name) or bool(process.signalled())  # noqa: E731
        try:
            batch, timing, sampling, extra = process.take(
                step, log_history=log_history, agree=agree_on_age(self.dist), stopping=stopping
            )
        except StopRequested:  # the run stops at the last step taken
            self._sampler_signal()
            return None
        except (TrainingError, ConfigError) as e:
            say_died(self.dist, e)  # the other ranks wait for this batch's agreement: they stop too
            e.every_rank = True  # so every rank saves the checkpoint (grpokit.run.loop)
            raise
        sampling, extra = taken_over_ranks(self.dist, sampling, extra)
        return Collected(batch, timing, sampling, extra)

    def trained(self, policy: torch.nn.Module, step: int) -> None:
        """Push the weights of ``step`` every rollout.sync_every steps; a signal sent to the process: this is the
        run's last step."""
        self.process.trained(sampling_weights(self.dist, policy, step), step)
        self._sampler_signal()

    def _sampler_signal(self) -> None:
        """A SIGTERM or SIGINT sent to the sampler process, or to one of its tool or environment workers, stops the
        run as one sent to the trainer does."""
        signalled = self.process.signalled()
        if signalled and self._stop is not None:
            name, worker = signalled
            whose = f"worker {worker} of the sampler process" if worker else "the sampler process"
            self._stop.request(name, f"sent to {whose} {self.process.pid}")

    def state(self, step: int) -> dict[str, Any]:
        """The sampler's entries, the prompt stream's after the last batch taken, and ``async``: the last push and
        the batches in flight, waited for while the process lives (torchrun: every rank's)."""
        own = self.process.checkpoint_state(step)
        return {**super().state(step), "stream": own["stream"], "async": checkpoint_over_ranks(self.dist, own)}

    def load_state(self, state: dict[str, Any], policy: torch.nn.Module, step: int) -> str | None:
        super().load_state(state, policy, step)
        own = rank_state(self.dist, state.get("async"))  # torchrun: this rank's prompt position and batches
        if own and own.get("stream"):
            self.sampler.stream.load_state(own["stream"])
        whole = sampling_weights(self.dist, policy, step)  # the restored weights (fsdp: gathered)
        lost = self.process.load_state(own, whole, step, self.sampler.stream.state())
        if not lost:
            return None
        r = self.sampler.cfg.rollout
        return (
            f"resuming an asynchronous run at step {step}: the {lost} batch(es) its sampler process had made or was "
            f"making ({lost * r.prompts_per_step * r.group_size} samples) were not in the checkpoint (its process "
            f"had ended or stalled, or an older grpokit wrote it); they are made again from the weights of step "
            f"{step}, so this run departs from the uninterrupted one."
        )

    def finish(self, summary: dict[str, Any]) -> None:
        """The samples dropped for their age (every rank's)."""
        dropped = self.dist.reduce({"dropped": float(self.process.dropped_total)}, {"dropped": "sum"})
        summary["async_dropped_samples"] = int(dropped["dropped"])

    def close(self) -> None:
        self.process.close()
