"""The reward runner: reward functions called in TRL's convention in forked, killable worker processes,
each with its time budget, a keeper above each worker that kills whatever a function starts, and what a
batch's scoring returns (`RewardResult`). Below the verifiers (`grpokit.rewards`, which re-exports these
names): it runs any function and knows none of them.

Modules: `runner.py` (`RewardRunner`: the calling convention, budgets, failures per row), `result.py`
(`RewardResult`, `TrainerState`), `completions.py` (completions and prompts in TRL's two shapes: strings
or chat messages), `steps.py` (the shape of a process reward's result), `_workers.py` (one call never
raising; the worker processes), `_keeper.py` (the keeper above each worker, also above tool workers).
"""

from grpokit.scoring.completions import as_completions, to_text
from grpokit.scoring.result import RewardResult, TrainerState
from grpokit.scoring.runner import RewardRunner

__all__ = ["RewardResult", "RewardRunner", "TrainerState", "as_completions", "to_text"]
