"""The first step of building any trainer (GRPO, SFT), before a model or a row is loaded: the settings that need
nothing loaded are checked, the seed set, torchrun's process group joined and the output folder claimed.

    dist, run = open_run(cfg, resume=..., overwrite=..., resolved_algo=algo)   # after the config's own checks

Nothing is written to the output folder here (grpokit.run.state: only ``RunState.start``, when train() begins).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from grpokit.config.checks import check_settings_in_use
from grpokit.run.preflight import check_tracker_login
from grpokit.run.state import RunState
from grpokit.train.distributed import Distributed


def open_run(
    cfg: Any,
    *,
    resume: bool | str | Path,
    overwrite: bool,
    batch_size: int | None = None,
    resolved_algo: Any = None,
    given: dict[str, Any] | None = None,
    curves: bool = True,
) -> tuple[Distributed, RunState]:
    """(dist, run) for ``cfg`` (a GRPO or SFT config its own ``validated`` has checked): settings of a part that
    is off refused (lora.*, multi-turn, cache), a tracker without its login refused, torch seeded with
    train.seed, torchrun's ranks (``batch_size``: the rows a step splits over them, SFT's), and the output folder
    checked and claimed (not in use by another run; ``resolved_algo``, ``given`` and ``curves``: what RunState
    writes there once the run starts)."""
    check_settings_in_use(cfg)  # lora.*, multi-turn or cache settings of a part that is off: not ignored
    check_tracker_login(cfg.train.report_to)  # wandb without a login fails now, not after the model loads
    torch.manual_seed(cfg.train.seed)
    dist = Distributed.from_env(cfg, **({"batch_size": batch_size} if batch_size is not None else {}))
    run = RunState(
        cfg, dist, resume=resume, overwrite=overwrite, resolved_algo=resolved_algo, given=given, curves=curves
    )
    return dist, run
