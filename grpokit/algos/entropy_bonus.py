"""The entropy bonus and its adaptive coefficient (Skywork-OR1, arXiv 2505.22312 sec. 3.2.5; TRL 1.16 entropy_coef /
use_adaptive_entropy). The loss gains

    L = L_policy - alpha_k * H_k,    H_k = sum_{i,t} m'_{i,t} H_{i,t} / sum m'     (a token mean, whatever algo.agg)

with H_{i,t} = -sum_v pi(v | ...) log pi(v | ...) the policy's entropy at each trained position (with its gradient:
grpokit.model.logprobs.completion_logprobs(entropy_grad=True)) and m' the loss tokens that top_entropy_quantile keeps.
The sums run over the whole mini-batch, so its split into micro-batches cannot change the bonus.

Constant: alpha_k = c (algo.entropy_coef). Adaptive (algo.adaptive_entropy), after every optimizer step k with e_k
the mean entropy H_k it trained on (taken from the same forward passes: no extra cost), as TRL 1.16 (the authors'
code, their verl fork's EntController, applies the same rule once per rollout step to the sampled tokens' mean
-log pi_old, an estimate of the entropy):

    c_{k+1} = min(c_k + delta, c_max)   if e_k <= target          (entropy too low: push harder)
              max(c_k - delta, c_min)   otherwise
    alpha_{k+1} = c_{k+1} if e_k <= target else 0                   (the bonus acts only below the target)

starting from c_0 = algo.entropy_coef and no measurement (alpha_0 = 0). The state (c, e) is saved in checkpoints.

Example: target 0.2, delta 0.005, c_0 = 0: a step measuring e = 0.15 gives c = 0.005 and the next step's alpha =
0.005; then e = 0.30 gives c = 0 and alpha = 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class EntropyControl:
    """The adaptive coefficient's state: c (``coef``) and the last measured entropy e (``last_entropy``, inf before
    the first step)."""

    coef: float
    last_entropy: float = math.inf

    def applied(self, adaptive: bool, target: float) -> float:
        """alpha for the next optimizer step: c, or (adaptive) c while the last entropy is at or below target, else 0."""
        if not adaptive:
            return self.coef
        return self.coef if self.last_entropy <= target else 0.0

    def observe(self, entropy: float, *, target: float, delta: float, coef_min: float, coef_max: float) -> None:
        """After an optimizer step that trained on mean entropy ``entropy``: c moves by delta towards more bonus when
        it is at or below ``target``, less otherwise, clamped to [coef_min, coef_max] (module docstring)."""
        if math.isnan(entropy):  # no trained token this step: nothing measured, nothing changes
            return
        if entropy <= target:
            self.coef = min(self.coef + delta, coef_max)
        else:
            self.coef = max(self.coef - delta, coef_min)
        self.last_entropy = float(entropy)

    def state(self) -> dict[str, float]:
        return {"coef": self.coef, "last_entropy": self.last_entropy}

    @staticmethod
    def from_state(state: dict[str, float]) -> EntropyControl:
        return EntropyControl(float(state["coef"]), float(state["last_entropy"]))
