"""grpokit bench --learn (issue 42): grpokit and TRL's GRPOTrainer from the same checkpoint on the demo's
addition task, held-out accuracy per step and per training second. No accuracy or timing is asserted here:
the figures are in docs/benchmarks.md, with their command."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

from grpokit import bench
from grpokit.bench.learn import cpu_seconds, setting_differences
from grpokit.bench.learn_report import at_equal_seconds, at_equal_steps, interpolate, summarize
from grpokit.bench.learn_tasks import (
    LearnTask,
    answer_format,
    greedy_accuracy,
    task_data,
    task_for,
    task_rewards,
    twin_problems,
)
from grpokit.bench.shapes import BenchError


def _bench_args(argv):
    parser = argparse.ArgumentParser(prog="grpokit")
    bench.add_bench_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["bench", *argv])


@pytest.mark.slow
def test_learn_runs_both_frameworks_end_to_end(tmp_path, capsys):
    """Two steps of each arm (grpokit, grpokit with prompt selection, TRL), one seed: every arm's curve, accuracies
    in [0, 1], the plot, the selection arm's per-step selection numbers, and the setting given with --set listed
    among the differences."""
    pytest.importorskip("trl", reason="TRL runs beside grpokit here: pip install 'grpokit[trl]'")
    args = _bench_args(
        ["--learn", "--quick", "--steps", "2", "--eval-every", "1", "--output-dir", str(tmp_path)]
        + ["--set", "optim.weight_decay=0.01", "--json", str(tmp_path / "r.json")]
    )
    assert args.func(args) == 0
    out = capsys.readouterr().out
    result = json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[7:])
    assert sorted(result["summary"]) == ["grpokit", "selection", "trl"]
    for fw in ("grpokit", "selection", "trl"):
        (run,) = [r for r in result["runs"] if r["framework"] == fw]
        assert [p["step"] for p in run["curve"]] == [0, 1, 2]
        assert all(0.0 <= p["accuracy"] <= 1.0 for p in run["curve"])
        assert run["curve"][2]["train_s"] > run["curve"][1]["train_s"] > 0.0
        assert run["curve"][2]["train_cpu_s"] > run["curve"][1]["train_cpu_s"] > 0.0
    # the same checkpoint and the same evaluation function: step 0 is one number on both sides
    firsts = {r["framework"]: r["curve"][0]["accuracy"] for r in result["runs"]}
    assert firsts["grpokit"] == firsts["trl"] == firsts["selection"]
    (selection,) = [r for r in result["runs"] if r["framework"] == "selection"]
    assert [s["selection/generated_groups"] >= 16 for s in selection["selection"]] == [True, True]
    assert [c["a"] + "-" + c["b"] for c in result["comparisons"]] == [
        "selection-trl",
        "selection-grpokit",
        "grpokit-trl",
    ]
    assert {"key": "optim.weight_decay", "grpokit": 0.01, "trl": 0.0} in result["differences"]
    assert (tmp_path / "learn.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| step | grpokit accuracy | selection accuracy | trl accuracy |" in out
    assert json.loads((tmp_path / "r.json").read_text())["summary"] == result["summary"]


def test_differences_come_from_trls_defaults_and_go_when_set_alike():
    task = LearnTask()
    keys = {key for key, _, _ in setting_differences(task)}
    assert "optim.lr" not in keys and "rollout.group_size" not in keys  # named by the task: the same
    assert "algo.agg" in keys  # grpo preset: seq-mean-token-mean; TRL's loss_type dapo: token-mean
    # set alike on either side, a difference is gone
    assert "algo.agg" not in {k for k, _, _ in setting_differences(task, ["algo.agg=token-mean"])}
    assert "algo.agg" not in {k for k, _, _ in setting_differences(task, trl_set={"loss_type": "grpo"})}
    # and a setting given on one side only is one
    assert ("optim.weight_decay", 0.0, 0.1) in setting_differences(task, trl_set={"weight_decay": 0.1})


def test_summary_mean_spread_and_seconds_by_hand():
    runs = [
        {"framework": "a", "curve": [{"step": 0, "train_s": 0.0, "accuracy": 0.1}, {"step": 5, "train_s": 2.0, "accuracy": 0.2}]},
        {"framework": "a", "curve": [{"step": 0, "train_s": 0.0, "accuracy": 0.1}, {"step": 5, "train_s": 4.0, "accuracy": 0.4}]},
    ]  # fmt: skip
    (first, last) = summarize(runs)["a"]
    assert first["accuracy_mean"] == pytest.approx(0.1) and first["accuracy_std"] == 0.0
    # mean 0.3; sample std sqrt(((0.1)^2 + (0.1)^2) / 1) = 0.1414
    assert last["accuracy_mean"] == pytest.approx(0.3, abs=1e-12)
    assert last["accuracy_std"] == pytest.approx(0.1414214, abs=1e-6)
    assert (last["accuracy_min"], last["accuracy_max"], last["train_s_mean"]) == (0.2, 0.4, 3.0)


def test_greedy_accuracy_does_not_depend_on_the_batch():
    """Left padding in a batch must not change a greedy answer: batches of 16 against one row at a time."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir, _, eval_rows = task_data(LearnTask())
    rows = eval_rows[:16]
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    batched = greedy_accuracy(model, tok, rows, 8, batch=16)
    one_by_one = [greedy_accuracy(model, tok, [r], 8, batch=1) for r in rows]
    assert batched == sum(one_by_one) / len(rows)
    assert not model.training


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--seeds", "0"], "--seeds and --eval-every must be >= 1"),
        (["--steps", "0"], "--steps must be >= 1"),
        (["--output-dir", "/nonexistent/folder"], "--output-dir /nonexistent/folder: no such folder"),
    ],
)
def test_bad_learn_arguments_are_refused_by_name(argv, message, capsys):
    args = _bench_args(["--learn", *argv])
    assert args.func(args) == 2
    assert message in capsys.readouterr().err


def test_accuracy_at_equal_seconds_by_hand():
    """TRL's mean curve read at grpokit's seconds, linear between its evaluations."""
    row = lambda step, s, acc: {"step": step, "train_s_mean": s, "accuracy_mean": acc}  # noqa: E731
    summary = {
        "grpokit": [row(0, 0.0, 0.1), row(10, 5.0, 0.5), row(20, 30.0, 0.9)],
        "trl": [row(0, 0.0, 0.1), row(10, 10.0, 0.3), row(20, 20.0, 0.7)],
    }
    (only,) = at_equal_seconds(summary)  # 30 s is past TRL's last evaluation (20 s): left out
    # TRL at 5 s: halfway from (0 s, 0.1) to (10 s, 0.3) = 0.2; grpokit 0.5 there, 0.3 ahead
    assert only["train_s"] == 5.0 and only["trl"] == pytest.approx(0.2) and only["gap"] == pytest.approx(0.3)
    assert interpolate([0.0, 10.0], [0.1, 0.3], 10.0) == pytest.approx(0.3)
    assert interpolate([0.0, 10.0], [0.1, 0.3], 10.5) is None


def test_cpu_seconds_count_the_children():
    """A child process that burns 0.5 CPU seconds and then waits: the parent's own CPU hardly moves while it
    blocks on the child's pipe, so only counting the child reaches 0.4 (the kernel counts in 10 ms ticks)."""
    import subprocess
    import sys

    before = cpu_seconds()
    burn = (
        "import time, sys\nwhile time.process_time() < 0.5: pass\nprint('done', flush=True)\ntime.sleep(30)"
    )
    child = subprocess.Popen([sys.executable, "-c", burn], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "done"
        assert cpu_seconds() - before >= 0.4
    finally:
        child.kill()
        child.wait()


def test_the_tasks_by_hand():
    """The twin task's format reward, problems and rewards; each task's defaults; unknown names refused."""
    assert answer_format(
        None, ["<answer>12</answer>", " <answer>3</answer>\n", "12", "<answer>1</answer>x"]
    ) == [
        1.0,
        1.0,
        0.0,
        0.0,
    ]
    spec = type("Spec", (), {"max_operand": 3, "seed": 0, "eval_size": 2})()
    train, held_out = twin_problems(spec)  # a - b for 0 <= b <= a <= 3: 10 problems
    assert len(train) == 8 and len(held_out) == 2
    assert all(
        int(r["prompt"].split("-")[0]) - int(r["prompt"][:-1].split("-")[1]) == int(r["answer"])
        for r in train
    )
    assert [name for name, _, _ in task_rewards(task_for("twin"))] == ["answer_format", "math_accuracy"]
    assert [w for _, _, w in task_rewards(task_for("twin"))] == [0.5, 1.0]
    assert (task_for("tools").prompts_per_step, task_for("tools").max_new_tokens) == (8, 40)
    assert task_for("sum", 400).train_size == 400
    assert (task_for("twin").lr, task_for("twin", lr=1e-5).lr, task_for("tools", lr=1e-5).max_new_tokens) == (1e-4, 1e-5, 40)
    with pytest.raises(BenchError, match=r"--lr 0.0: expected a learning rate in \(0, 1\]"):
        task_for("twin", lr=0.0)
    with pytest.raises(BenchError, match="--task 'nope'"):
        task_for("nope")


def test_accuracy_at_equal_steps_by_hand():
    summary = {
        "selection": [{"step": 0, "accuracy_mean": 0.1}, {"step": 10, "accuracy_mean": 0.5}],
        "trl": [
            {"step": 0, "accuracy_mean": 0.1},
            {"step": 10, "accuracy_mean": 0.4},
            {"step": 20, "accuracy_mean": 0.6},
        ],
    }
    (row,) = at_equal_steps(summary, "selection", "trl")  # step 0 left out; step 20 only on one side
    assert row == {"step": 10, "selection": 0.5, "trl": 0.4, "gap": pytest.approx(0.1)}
