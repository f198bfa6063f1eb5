"""Which batch source a run gets, and what the rest of the run needs to know of it: the one reader of
rollout.max_staleness outside the config's checks.

    plan = plan_source(cfg, rewards, process_rewards)   # before the model loads: K, the reward workers started
    source = make_source(plan, sampler, dist, policy, ref_model=..., precision=..., device=...)
    plan.max_age, plan.off_policy                       # what the update and the mismatch watch are told

rollout.max_staleness = 0: ``SyncSource`` (grpokit.collect.source), the batch sampled in this process from the
current policy. K >= 1: ``AsyncSource`` (grpokit.collect.asynchronous), a sampler process beside the update.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from grpokit.collect.async_sampler import check_sendable
from grpokit.collect.asynchronous import AsyncSource
from grpokit.collect.reference import sampler_reference
from grpokit.collect.sampler import Sampler
from grpokit.collect.source import BatchSource, SyncSource
from grpokit.config.schema import Config
from grpokit.model.precision import Precision
from grpokit.rewards import RewardRunner
from grpokit.rollout.engines import engine_class
from grpokit.rollout.generation import FastGenerator
from grpokit.train.distributed import Distributed


@dataclass(frozen=True)
class SourcePlan:
    """How the run's batches are made, decided from the config before the model loads (``plan_source``)."""

    max_age: int  # rollout.max_staleness: how many steps older than the policy a batch may be (0: made by it)
    sync_every: int  # rollout.sync_every: the sampler process gets the weights every this many steps
    timeout_s: float  # rollout.sampler_timeout_s: the sampler process's heartbeat may lapse this long
    process_rewards: Callable[[], list] | None  # the reward functions, resolved again in a sampler process

    @property
    def off_policy(self) -> bool:
        """Batches may come from an older policy than the one they train (the ratio's denominator and the
        mismatch correction then measure from the sampler's log-probs)."""
        return self.max_age > 0


def plan_source(cfg: Config, rewards: RewardRunner, process_rewards: Callable[[], list]) -> SourcePlan:
    """The run's SourcePlan. A synchronous run's reward workers start now (math-verify's process sets up while the
    model loads); an asynchronous run scores in its sampler process, which resolves the reward functions again
    (``process_rewards``, a picklable function): refused now, before the model loads, when it cannot be sent."""
    r = cfg.rollout
    plan = SourcePlan(r.max_staleness, r.sync_every, r.sampler_timeout_s, process_rewards if r.max_staleness else None)
    if plan.off_policy:
        check_sendable(process_rewards, plan.max_age, "the reward functions")
    else:
        rewards.start()
    return plan


def make_source(
    plan: SourcePlan,
    cfg: Config,
    algo: Any,
    sampler: Sampler,
    dist: Distributed,
    policy: torch.nn.Module,
    *,
    ref_model: torch.nn.Module | None,
    precision: Precision,
    device: torch.device,
) -> BatchSource:
    """The run's batch source (the module docstring), built once the policy is loaded (and, under torchrun, wrapped)."""
    if not plan.off_policy:
        return SyncSource(sampler)
    # the trainer's evaluation decodes with the sampler's engine, but one that holds its own weights (vLLM's) lives in
    # the sampler process: the fast engine over the trainer's weights then, not a second engine for evaluation alone
    # (on a GPU, in the same memory)
    holds_weights = engine_class(cfg.rollout.engine).holds_weights
    eval_generator = (
        FastGenerator.from_settings(cfg.rollout) if holds_weights else None
    )
    # the reference's log-probs made in the process with each batch (a CPU run; not fsdp), else by the update
    reference = sampler_reference(cfg, algo, dist, device, ref_model, precision, asynchronous=True)
    return AsyncSource(sampler, dist, policy, plan, reference=reference, eval_generator=eval_generator)
