"""An exponential moving average of the policy's weights (``train.ema_decay``; OpenRLHF's ``--enable_ema``):

    theta_ema <- d * theta_ema + (1 - d) * theta        after every step, d = train.ema_decay

The rollouts are still sampled from the policy itself and the update is unchanged: the average is a second model
beside it, evaluated next to it (``ema/accuracy``, ...) and saved in every checkpoint's ``ema/`` folder (a Hugging
Face model folder), which a resume takes back. Where a fixed learning rate leaves the policy swinging around a
plateau (greedy answers one too high, then one too low, from one evaluation to the next), the average sits nearer
its middle; where the policy is still climbing it lags about 1 / (1 - d) steps behind (docs/guides/training.md).

    average = WeightAverage.build(policy_model, decay=0.9)     # a copy of the policy, no gradients
    average.step(policy_model)                                 # after each step

``train.adopt_average`` (``Adoption``, off by default) turns the average into a move of the policy itself: every k
steps both score greedy completions of the same training prompts with the accuracy reward, and when the average
scores higher the policy takes its weights (the optimizer's moments stay). A policy climbing fast scores above its
lagging average and keeps its weights; one swinging around a plateau is brought back to the average's middle, which
it then leaves more slowly; one climbing slowly can lose a little (docs/algorithms/average.md).

    adoption = Adoption.build(cfg.train, train_rows=400, seed=0)   # every 10 steps, 64 fixed prompts
    if adoption.due(step):
        scores = adoption.compare(average, policy, score)             # score(model) -> mean reward
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


@dataclass(frozen=True)
class Adoption:
    """train.adopt_average: after every ``every``-th step, the policy takes the average's weights when the average's
    greedy completions of the training rows ``row_ids`` score above the policy's (a tie keeps the policy: on a slow
    climb the two often answer alike, and taking the lagging average then would undo steps)."""

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
        score: Callable[[torch.nn.Module], float],
        agree: Callable[[bool], bool] = bool,
    ) -> dict[str, float]:
        """Score both with ``score`` (a model -> the mean reward of its greedy completions of ``row_ids``), move the
        policy to the average when it scores higher (``agree``: every rank's decision, under torchrun all
        must take it) and return the step's average/* metrics."""
        average_score, policy_score = float(score(average.model)), float(score(policy))
        adopted = bool(agree(average_score > policy_score))
        if adopted:
            average.adopt_into(policy)
        return {"average/adopted": float(adopted), "average/score": average_score, "average/policy_score": policy_score}
