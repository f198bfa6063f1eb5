"""The embedded default: the warm start is cached, the data is held out, and the README's command learns."""

import json

import pytest

from grpokit.demos.default import DemoSpec, completion_text, make_problems, prepare_demo

SMALL = DemoSpec(max_operand=9, eval_size=20, hidden_size=32, sft_steps=20, sft_batch=16)


def test_problems_are_held_out():
    train, held_out = make_problems(SMALL)
    assert len(train) + len(held_out) == 100
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in held_out}
    assert all(int(r["answer"]) == sum(map(int, r["prompt"].rstrip("=").split("+"))) for r in train)


def test_demo_answers_are_scored_by_math_accuracy():
    from grpokit.rewards import resolve_reward

    score = resolve_reward("math_accuracy")
    got = score(["3+4=", "3+4="], [completion_text(7), completion_text(8)], answer=["7", "7"])
    assert got == [1.0, 0.0]


@pytest.mark.slow
def test_warm_start_is_cached(tmp_path):
    messages = []
    first = prepare_demo(SMALL, cache=tmp_path, log=messages.append)
    assert any("warm start" in m for m in messages)
    messages.clear()
    second = prepare_demo(SMALL, cache=tmp_path, log=messages.append)
    assert first == second and any("cached" in m for m in messages)
    assert not any("warm start 1/" in m for m in messages)
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(second["model"])


@pytest.mark.slow
def test_readme_demo_command_learns(tmp_path, monkeypatch):
    """`grpokit train --output-dir D` (the README's first command) reproduces the numbers the README and
    docs/getting-started.md quote: 5.0% before, 95.5% after (README: "from 5% to over 90%"), each within 3
    points (the run is deterministic on one CPU; another CPU's float sums may move a few answers)."""
    from grpokit.cli.main import main

    monkeypatch.setenv("GRPOKIT_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "demo"
    assert main(["train", "--output-dir", str(out), "train.tensorboard=false"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert abs(summary["eval_accuracy_before"] - 0.050) <= 0.03
    assert abs(summary["eval_accuracy_after"] - 0.955) <= 0.03 and summary["eval_accuracy_after"] > 0.90
    assert (out / "metrics.jsonl").is_file() and (out / "curves.png").is_file()


def test_demo_print_model_path_names_the_shipped_model(tmp_path, monkeypatch, capsys):
    from grpokit.cli.main import main
    from grpokit.demos.default import SHIPPED_DIR

    monkeypatch.setenv("GRPOKIT_CACHE", str(tmp_path / "cache"))
    assert main(["demo", "--print-model-path"]) == 0
    out = capsys.readouterr().out
    assert out.strip() == str(SHIPPED_DIR) and (SHIPPED_DIR / "config.json").is_file()


def test_demo_names_the_demos_when_one_is_unknown(capsys):
    from grpokit.cli.main import main

    assert main(["demo", "tool"]) == 2
    err = capsys.readouterr().err
    assert "no demo 'tool'" in err and "addition, steps, tools, r1" in err


@pytest.mark.parametrize("name", ["tools", "steps"])
def test_demo_refuses_a_folder_holding_a_run_before_building_anything(name, tmp_path, monkeypatch, capsys):
    """The run-folder rules of grpokit train, checked before the warm start (minutes) and the evaluation."""
    from grpokit.cli.main import main

    cache = tmp_path / "cache"
    monkeypatch.setenv("GRPOKIT_CACHE", str(cache))
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    assert main(["demo", name, "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert "already holds a run" in err and "--overwrite" in err
    assert not cache.exists() or not any(cache.iterdir())  # nothing was built


def test_demos_run_with_one_torch_thread_unless_omp_num_threads_is_set(monkeypatch):
    import torch

    from grpokit.cli.main import _one_thread_for_tiny_models

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        monkeypatch.setenv("OMP_NUM_THREADS", "2")
        _one_thread_for_tiny_models()
        assert torch.get_num_threads() == 2  # the user's choice
        monkeypatch.delenv("OMP_NUM_THREADS")
        _one_thread_for_tiny_models()
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_result_tables_are_not_cut_in_a_log_file(capsys):
    """rich cuts a table to 80 columns when stdout is not a terminal; results are printed whole."""
    from rich.table import Table

    from grpokit.run.log import result_console

    table = Table()
    for k in range(6):
        table.add_column(f"column {k} with a long header")
    table.add_row(*[f"value {k} that is long as well" for k in range(6)])
    result_console().print(table)
    out = capsys.readouterr().out
    assert "value 5 that is long as well" in out and "…" not in out


@pytest.mark.slow
def test_results_go_to_stdout_and_progress_to_stderr(tmp_path):
    """`grpokit train --output-dir D > log`: the table and the done line on stdout, every step's line and
    the notices on stderr."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "GRPOKIT_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "grpokit", "train", "--output-dir", str(tmp_path / "d"), "train.steps=2",
         "data.eval_limit=16", "eval.num_samples=1", "train.tensorboard=false"],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "held-out accuracy" in done.stdout and "done in" in done.stdout
    assert "step 2/2" in done.stderr and "step 2/2" not in done.stdout
    assert "shipped" in done.stderr and "warm start 1/" not in done.stderr


@pytest.mark.parametrize("command", ["train", "sft", "demo", "eval", "sample", "pipeline", "view", "config", "launch"])
def test_help_texts_carry_no_rst_markup(command, capsys):
    """--help is read in a terminal: no ``double backticks`` (launch printed its module docstring with them,
    eval's flags their declarations'); sft's help names no RL setting."""
    from grpokit.cli.main import main

    try:
        code = main([command, "--help"])
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr().out
    assert code == 0 and out.strip() and "``" not in out
    if command == "sft":
        assert "group size" not in out and "preset" not in out


def test_demo_r1_takes_no_overrides(capsys):
    """Its stages live in OUTPUT/pipeline.yaml; an override would be silently dropped, so it is refused."""
    from grpokit.cli.main import main

    assert main(["demo", "r1", "train.steps=3"]) == 2
    assert "takes no overrides" in capsys.readouterr().err
