"""train.max_cpu_seconds (issue 38: RL alone given the R1 recipe's compute): a run stops at the end of the
step whose training reaches the budget, as a finished run (its last checkpoint, summary.json with
train_cpu_seconds and the reason); a budget not reached changes nothing."""

import json
import os

import pytest
from grpo_runs import make_trainer


@pytest.mark.slow  # two tiny GRPO runs: about 10 s on a loaded 2-core machine
def test_a_cpu_budget_stops_the_run_at_the_step_that_reaches_it(tmp_path):
    # any step uses more than a microsecond of CPU: the first step reaches the budget
    summary = make_trainer(tmp_path / "a", "train.steps=5", "train.max_cpu_seconds=1e-6").train()
    assert summary["steps"] == 1
    assert summary["budget_reached"].startswith("train.max_cpu_seconds=1e-06 reached: ")
    assert summary["train_cpu_seconds"] > 0 and summary["train_seconds"] > 0
    assert summary["checkpoint"].endswith("step_000001") and os.path.isdir(summary["checkpoint"])
    written = json.loads((tmp_path / "a" / "run" / "summary.json").read_text())
    assert written["budget_reached"] == summary["budget_reached"] and "eval_accuracy_after" in written

    summary = make_trainer(tmp_path / "b", "train.steps=2", "train.max_cpu_seconds=1e6").train()
    assert summary["steps"] == 2 and "budget_reached" not in summary and summary["train_cpu_seconds"] > 0
