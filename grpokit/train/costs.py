"""What a training step cost, as every trainer logs it: seconds by stage, throughput and peak memory.

    metrics.update(step_costs(seconds, tokens, device, dist, stages={"generation": 1.2, "update": 0.4}))
    # time/generation, time/update, time/step, tokens_per_s, peak_memory_mb

Under torchrun each rank measures its own; the line written is the step's as a whole: the slowest rank's
times and the largest peak (the step waits for the last rank), the ranks' throughputs summed.
"""

from __future__ import annotations

import torch

from grpokit.train.distributed import Distributed
from grpokit.train.learner import peak_memory_mb


def step_costs(
    seconds: float,
    tokens: float,
    device: torch.device,
    dist: Distributed,
    stages: dict[str, float] | None = None,
) -> dict[str, float]:
    """time/<stage> for each of ``stages`` (seconds), time/step = ``seconds``, tokens_per_s = ``tokens`` (the
    step's generated or trained tokens on this rank) / seconds, peak_memory_mb (grpokit.train.learner);
    reduced over ranks as the module docstring says."""
    costs = {f"time/{stage}": value for stage, value in (stages or {}).items()}
    costs["time/step"] = seconds
    costs["tokens_per_s"] = tokens / seconds
    costs["peak_memory_mb"] = peak_memory_mb(device)
    return dist.reduce(costs, {key: "sum" if key == "tokens_per_s" else "max" for key in costs})
