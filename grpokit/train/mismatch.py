"""The train/inference mismatch in a run: the correction the update applies, and the watch that warns, then
stops, when the sampler's log-probs drift away from the trainer's (open-instruct #1473: a gap that grows
until the run collapses). The maths is grpokit.algos.mismatch's.

    correction = MismatchCorrection.from_settings(cfg.rollout, max_age)   # None: no correction
    w, _ = correction.weights(old, sample_logprobs, mask)          # (n, L), in grpokit.train.update
    guard = MismatchGuard(cfg.rollout.max_sampler_kl, say, max_age)
    guard.check(metrics, step)                                     # a notice, or MismatchError
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor

from grpokit.algos.mismatch import is_weights
from grpokit.core.errors import TrainingError
from grpokit.rollout.engines import engine_class

GROWING_STEPS = 3
"""Steps in a row above rollout.max_sampler_kl, each higher than the one before, that stop a run."""


class MismatchError(TrainingError):
    """The sampler's log-probs kept drifting away from the trainer's."""


@dataclass(frozen=True)
class MismatchCorrection:
    """rollout.mismatch_correction resolved: a mode of grpokit.algos.mismatch.IS_MODES (not none) and its bounds."""

    mode: str
    cap: float | None
    floor: float | None

    @classmethod
    def from_settings(cls, rollout, max_age: int = 0) -> MismatchCorrection | None:
        """From a RolloutConfig and the batches' largest age in steps (``max_age``, the batch source's: grpokit.collect
        .factory): auto is token_truncate for an engine whose log-probs are not the trainer's model's (its class's
        exact_logprobs is False: vllm) and for batches of an older policy (max_age >= 1: asynchronous rollouts)
        with rollout.async_ratio=proximal, none for the others."""
        mode = rollout.mismatch_correction
        if mode == "auto":
            stale = max_age >= 1 and rollout.async_ratio == "proximal"
            exact = engine_class(rollout.engine).exact_logprobs
            off_policy = not exact or stale  # behaviour: the ratio is already to the sampler
            mode = "token_truncate" if off_policy else "none"
        if mode == "none":
            return None
        return cls(mode, rollout.mismatch_cap, rollout.mismatch_floor)

    def weights(self, old_logprobs: Tensor, sample_logprobs: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """(weights, unbounded), each (n, L): the weights pi_old / pi_sampler of the tokens ``mask``, bounded
        (0 elsewhere), and where a weight is the ratio itself (the bounds did not touch it)."""
        w = is_weights(old_logprobs, sample_logprobs, mask, self.mode, self.cap, self.floor)
        rho = is_weights(old_logprobs, sample_logprobs, mask, self.mode, None, None)
        return w, w == rho


class MismatchGuard:
    """Warns at the first step whose sampler_kl is above ``limit``, stops the run (MismatchError) after
    GROWING_STEPS steps in a row above it, each higher than the last. ``limit`` 0: off. ``max_staleness``: the
    batches' largest age (rollout.max_staleness, asynchronous rollouts), named in the messages: the gap then holds
    the samples' age."""

    def __init__(self, limit: float, say: Callable[[str], None], max_staleness: int = 0):
        self.limit, self.say = limit, say
        self.age = (
            f" With rollout.max_staleness={max_staleness} it also holds the policy's change over the samples' age "
            "(up to that many steps): a larger gap than a synchronous run's is expected there."
            if max_staleness
            else ""
        )
        self.above: list[float] = []  # sampler_kl of the current run of steps above the limit
        self.warned = False

    def state(self) -> dict:
        """What a checkpoint keeps (trainer_state.pt["mismatch"]): the run of steps above the limit, the warning."""
        return {"above": list(self.above), "warned": self.warned}

    def load_state(self, state: dict | None) -> None:
        """Go on from ``state()`` (None: a checkpoint written before it was kept: as built)."""
        if state is not None:
            self.above, self.warned = list(state["above"]), bool(state["warned"])

    def check(self, metrics: dict[str, float], step: int) -> None:
        kl = metrics.get("sampler_kl", math.nan)
        if not self.limit or math.isnan(kl):
            return
        if kl <= self.limit:
            self.above = []
            return
        growing = not self.above or kl > self.above[-1]
        self.above = [*self.above, kl] if growing else [kl]
        if not self.warned:
            self.warned = True
            self.say(
                f"WARNING step {step}: the sampler's log-probs are {kl:.3g} nats/token (KL, k3) from the trainer's, "
                f"above rollout.max_sampler_kl={self.limit:g}: the rollouts come from another distribution than "
                "the one being trained (a weight sync, precision or kernel mismatch). rollout.mismatch_correction "
                "weights the tokens; the run stops if the gap keeps growing." + self.age
            )
        if len(self.above) >= GROWING_STEPS:
            shown = ", ".join(f"{v:.3g}" for v in self.above[-GROWING_STEPS:])
            raise MismatchError(
                f"stopped at step {step}: the sampler/trainer KL grew for {GROWING_STEPS} steps in a row above "
                f"rollout.max_sampler_kl={self.limit:g} ({shown} nats/token): training on these samples drifts "
                "the run off the policy that generated them. Check the engine's weight sync and dtype "
                "(rollout.vllm), lower optim.lr, or raise rollout.max_sampler_kl (0 turns the check off)." + self.age
            )
