"""Settings counted in passes over the training rows (TRL's epochs), made steps once the trainer has counted the
rows: ``train.num_train_epochs``, ``train.save_each_epoch``, ``eval.each_epoch``."""

from __future__ import annotations

import math
from typing import Any

from grpokit.core.errors import ConfigError


def resolve_epochs(cfg: Any, rows: int, per_step: int) -> None:
    """What is counted in passes over the training rows, made steps once the rows are counted (the trainer's
    build; ``per_step``: rows a step takes): train.num_train_epochs -> train.steps = ceil(epochs x rows /
    per_step); train.save_each_epoch -> train.save_every and eval.each_epoch -> eval.every = ceil(rows /
    per_step), one pass. grpokit's stream of rows runs on across passes (a step may take the end of one and
    the start of the next), so "the end of a pass" is the step in which it ends."""
    one_pass = math.ceil(rows / per_step)
    if cfg.train.num_train_epochs:
        cfg.train.steps = math.ceil(cfg.train.num_train_epochs * rows / per_step)
    for flag, section, key in (("train.save_each_epoch", cfg.train, "save_every"), ("eval.each_epoch", cfg.eval, "every")):
        if getattr(section, flag.split(".")[1]):
            given = getattr(section, key)
            if given and given != one_pass:
                raise ConfigError(
                    f"{flag}=true and {flag.split('.')[0]}.{key}={given}: choose one (each pass over the {rows} "
                    f"rows is {one_pass} steps)"
                )
            setattr(section, key, one_pass)
