"""An exponential moving average of the policy's weights (``train.ema_decay``; OpenRLHF's ``--enable_ema``):

    theta_ema <- d * theta_ema + (1 - d) * theta        after every step, d = train.ema_decay

The rollouts are still sampled from the policy itself and the update is unchanged: the average is a second model
beside it, evaluated next to it when train.ema_decay is set (``ema/accuracy``, ...) and saved in every checkpoint's
``ema/`` folder (a Hugging Face model folder), which a resume takes back. Where a fixed learning rate leaves the policy swinging around a
plateau (greedy answers one too high, then one too low, from one evaluation to the next), the average sits nearer
its middle; where the policy is still climbing it lags about 1 / (1 - d) steps behind (docs/guides/training.md).

    average = WeightAverage.build(policy_model, decay=0.9)     # a copy of the policy, no gradients
    average.step(policy_model)                                 # after each step

``train.adopt_average`` (``Adoption``; auto: on for a CPU run) turns the average into a move of the policy itself:
every k steps both score greedy completions of the same training prompts with the accuracy reward, and when the
average scores higher by more than the comparison's noise (``significant``) the policy takes its weights (the
optimizer's moments stay). A policy that climbs answers at least as well as its lagging average and keeps its
weights; one swinging around a plateau is brought back to the average's middle, which it then leaves more slowly
(docs/algorithms/average.md).

    adoption = Adoption.build(cfg.train, train_rows=400, seed=0)   # every 10 steps, 64 fixed prompts
    if adoption.due(step):
        metrics = adoption.compare(average, policy, score)            # score(model) -> reward per prompt
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from grpokit.model.checkpoint import load_weights_into
from grpokit.train.reference import mix_toward

EMA_DIR = "ema"
"""A checkpoint's folder of the averaged weights (grpokit.model.checkpoint.MODEL_SUBFOLDERS)."""
ADOPTED_DECAY = 0.9
"""The average's decay under train.adopt_average when train.ema_decay is 0."""


class WeightAverage:
    """The averaged copy of the policy (``model``) and its decay; it owns the copy and moves it."""

    def __init__(self, model: torch.nn.Module, decay: float):
        if not 0 < decay < 1:
            raise ValueError(f"decay must be in (0, 1), got {decay}")
        self.model, self.decay = model, decay

    @classmethod
    def build(cls, policy: torch.nn.Module, decay: float, resume_from: Path | None = None) -> WeightAverage:
        """A frozen copy of ``policy`` (as it is now: the initial weights), or on resume the average the checkpoint
        saved (a checkpoint of the run before it had one: its policy's weights, where the average starts)."""
        model = copy.deepcopy(policy).requires_grad_(False).eval()
        if resume_from is not None:
            saved = Path(resume_from) / EMA_DIR
            load_weights_into(model, saved if saved.is_dir() else Path(resume_from))
        return cls(model, decay)

    def step(self, policy: torch.nn.Module) -> None:
        """theta_ema <- d theta_ema + (1 - d) theta, parameter by parameter."""
        mix_toward(self.model, policy, 1.0 - self.decay)

    def adopt_into(self, policy: torch.nn.Module) -> None:
        """theta <- theta_ema for every parameter the policy trains (by name; its frozen ones, LoRA's base, are the
        average's already), in place: the optimizer's moments and the policy object stay."""
        averaged = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, param in policy.named_parameters():
                if param.requires_grad:
                    param.copy_(averaged[name].to(param.device, param.dtype))


ADOPT_Z = 1.645
"""The one-sided 5% point of a normal: how many standard errors above 0 the average's mean gain per prompt must be."""


@dataclass(frozen=True)
class Adoption:
    """train.adopt_average: after every ``every``-th step, the policy takes the average's weights when the average's
    greedy completions of the training rows ``row_ids`` score higher than the policy's by more than the comparison's
    noise: the per-prompt gains g_j = s_j(average) - s_j(policy) have a mean above ADOPT_Z standard errors,
    mean(g) > 1.645 sd(g) / sqrt(n) (a one-sided paired test at 5%). On a slow climb the lagging average answers
    better by chance now and then, and taking it would undo steps; on a plateau it answers better by many prompts."""

    every: int
    row_ids: tuple[int, ...]

    @classmethod
    def build(cls, train, train_rows: int, seed: int) -> Adoption:
        """train.adopt_every and train.adopt_prompts rows of the ``train_rows`` training rows, drawn once with
        ``seed`` (sorted: the order they are decoded in), so a resumed run compares on the same rows."""
        count = min(train.adopt_prompts, train_rows)
        return cls(train.adopt_every, tuple(sorted(random.Random(seed).sample(range(train_rows), count))))

    def due(self, steps_done: int) -> bool:
        """Whether the comparison follows step ``steps_done`` (k, 2k, ...)."""
        return steps_done > 0 and steps_done % self.every == 0

    def compare(
        self,
        average: WeightAverage,
        policy: torch.nn.Module,
        score: Callable[[torch.nn.Module], list[float]],
        agree: Callable[[bool], bool] = bool,
    ) -> dict[str, float]:
        """Score both with ``score`` (a model -> the reward of its greedy completion of each of ``row_ids``), move the
        policy to the average when its gain passes the test (``significant``; ``agree``: every rank's decision,
        under torchrun all must take it) and return the step's average/* metrics (the two mean scores)."""
        average_scores, policy_scores = score(average.model), score(policy)
        adopted = bool(agree(significant([a - p for a, p in zip(average_scores, policy_scores, strict=True)])))
        if adopted:
            average.adopt_into(policy)
        return {
            "average/adopted": float(adopted),
            "average/score": sum(average_scores) / len(average_scores),
            "average/policy_score": sum(policy_scores) / len(policy_scores),
        }


def significant(gains: list[float], z: float = ADOPT_Z) -> bool:
    """mean(gains) > z * sd(gains) / sqrt(n) and mean > 0, sd the sample standard deviation (n - 1): the average's
    paired gain over the policy is above the comparison's noise (all gains 0: not)."""
    n = len(gains)
    mean = sum(gains) / n
    if mean <= 0:
        return False
    sd = (sum((g - mean) ** 2 for g in gains) / (n - 1)) ** 0.5 if n > 1 else 0.0
    return mean > z * sd / n**0.5
