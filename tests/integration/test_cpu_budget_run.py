"""train.max_cpu_seconds (issue 38: RL alone given the R1 recipe's compute): a run stops at the end of the
step whose training reaches the budget, as a finished run (its last checkpoint, summary.json with
train_cpu_seconds and the reason); a budget not reached changes nothing."""

import json
import os

import pytest
import torch
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


@pytest.mark.slow  # three legs of a tiny GRPO run: about 10 s on a loaded 2-core machine
def test_a_resumed_run_spends_its_cpu_budget_once(tmp_path):
    """A resumed run (the pipeline's budgeted stage after a kill: its own --resume) continues the CPU seconds
    its checkpoint recorded, so it stops at the budget's total. Before, each leg counted only itself and a
    resumed stage got its whole budget again."""
    common = ("train.save_every=1", "eval.enabled=false", "train.samples_every=0")
    run = tmp_path / "run"
    first = make_trainer(tmp_path, "train.steps=2", *common, "train.max_cpu_seconds=1e6").train()
    state = torch.load(run / "checkpoints" / "step_000002" / "trainer_state.pt", weights_only=False)
    # the checkpoint of step 2 holds the count when it was written (its own writing, after, is in the summary's)
    spent = state["train_cpu_seconds"]
    assert 0 < spent <= first["train_cpu_seconds"] and 0 < state["train_seconds"] <= first["train_seconds"]

    # a budget the first leg already used: the resumed run takes no step (before: it took one more)
    again = make_trainer(
        tmp_path, "train.steps=50", *common, f"train.max_cpu_seconds={spent / 2!r}", resume=True,
        allow_changed_config=True,
    ).train()  # fmt: skip
    assert again["steps"] == 2 and again["budget_reached"].startswith(
        f"train.max_cpu_seconds={spent / 2:g} reached"
    )
    assert spent <= again["train_cpu_seconds"] < spent + 0.5  # the first leg's, and no step

    # a budget just above it: one more step uses it up, whatever a step costs (before: the resumed leg ran until
    # it alone had used the budget, two steps' worth or more)
    budget = spent + 1e-3  # what step 2's checkpoint recorded (the second leg wrote none)
    last = make_trainer(
        tmp_path, "train.steps=50", *common, f"train.max_cpu_seconds={budget!r}", resume=True,
        allow_changed_config=True,
    ).train()  # fmt: skip
    assert last["steps"] == 3 and last["budget_reached"]
    assert last["train_cpu_seconds"] >= budget
    state = torch.load(run / "checkpoints" / "step_000003" / "trainer_state.pt", weights_only=False)
    assert spent < state["train_cpu_seconds"] <= last["train_cpu_seconds"]
    assert json.loads((run / "summary.json").read_text())["train_cpu_seconds"] == last["train_cpu_seconds"]
