"""An exponential moving average of the policy's weights (``train.ema_decay``; OpenRLHF's ``--enable_ema``):

    theta_ema <- d * theta_ema + (1 - d) * theta        after every step, d = train.ema_decay

The rollouts are still sampled from the policy itself and the update is unchanged: the average is a second model
beside it, evaluated next to it (``ema/accuracy``, ...) and saved in every checkpoint's ``ema/`` folder (a Hugging
Face model folder), which a resume takes back. Where a fixed learning rate leaves the policy swinging around a
plateau (greedy answers one too high, then one too low, from one evaluation to the next), the average sits nearer
its middle; where the policy is still climbing it lags about 1 / (1 - d) steps behind (docs/guides/training.md).

    average = WeightAverage.build(policy_model, decay=0.9)     # a copy of the policy, no gradients
    average.step(policy_model)                                 # after each step
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from grpokit.model.checkpoint import load_weights_into
from grpokit.train.reference import mix_toward

EMA_DIR = "ema"
"""A checkpoint's folder of the averaged weights (grpokit.model.checkpoint.MODEL_SUBFOLDERS)."""


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
