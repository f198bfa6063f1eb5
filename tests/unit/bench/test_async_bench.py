"""grpokit bench --async (issue 34): the demo synchronous and with asynchronous rollouts, one run after the other,
and the run-curve reader it shares with scripts/variant_study.py (grpokit.bench.curves). No timing is asserted
here: the figures are in docs/benchmarks.md, with their command."""

from __future__ import annotations

import argparse
import json

import pytest

from grpokit import bench
from grpokit.bench.async_runs import to_target
from grpokit.bench.curves import read_run_curve
from grpokit.bench.shapes import BenchError


def _bench_args(argv):
    parser = argparse.ArgumentParser(prog="grpokit")
    bench.add_bench_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["bench", *argv])


def test_a_run_curve_sums_the_steps_seconds_and_takes_a_steps_last_line(tmp_path):
    """Steps of 1.0, 2.0 and 0.5 s, step 2 logged twice (a resume: its last line, 3.0 s, counts): evaluations at
    steps 0 and 3 are at 0 and 1 + 3 + 0.5 = 4.5 training seconds."""
    lines = [{"step": 1, "time/step": 1.0}, {"step": 2, "time/step": 2.0}, {"step": 2, "time/step": 3.0},
             {"step": 3, "time/step": 0.5, "entropy": 0.7}]  # fmt: skip
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    (tmp_path / "eval.jsonl").write_text('{"step": 0, "accuracy": 0.1}\n\n{"step": 3, "accuracy": 0.6}\n')
    curve = read_run_curve(tmp_path)
    assert curve.train_s == 4.5 and [m["step"] for m in curve.metrics] == [1, 2, 3]
    assert curve.points == [(0, 0.0, 0.1), (3, 4.5, 0.6)]
    run = {"curve": curve.points}
    assert to_target(run, 0.5) == 4.5 and to_target(run, 0.1) == 0.0 and to_target(run, 0.7) is None
    (tmp_path / "eval.jsonl").write_text('{"step": 0, "accuracy": 0.1}\nnot json\n')
    with pytest.raises(BenchError, match=r"eval.jsonl, line 2: not JSON"):
        read_run_curve(tmp_path)
    with pytest.raises(BenchError, match="metrics.jsonl: no such file"):
        read_run_curve(tmp_path / "nothing")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--ks", "1,2"], "starting with 0"),
        (["--ks", "0,x"], "comma-separated integers"),
        (["--ks", "0,1,1"], "distinct"),
        (["--seeds", "0"], "--seeds must be >= 1"),
        (["--reward-latency", "-1"], "--reward-latency -1: give seconds >= 0"),
    ],
)
def test_bad_async_arguments_are_refused_by_name(argv, message, capsys, tmp_path):
    args = _bench_args(["--async", "--output-dir", str(tmp_path), *argv])
    assert args.func(args) == 2
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_async_bench_runs_the_demo_synchronously_and_with_k1_end_to_end(tmp_path, capsys):
    """Two steps of the demo with K = 0 and K = 1 on 8 held-out rows: both runs' curves (step 0, 1, 2), the table,
    the plot and the RESULT line; the asynchronous run reports its staleness."""
    args = _bench_args(
        ["--async", "--ks", "0,1", "--steps", "2", "--eval-every", "1", "--output-dir", str(tmp_path),
         "--set", "data.eval_limit=8", "--set", "rollout.prompts_per_step=4", "--json", str(tmp_path / "r.json")]
    )  # fmt: skip
    assert args.func(args) == 0
    out = capsys.readouterr().out
    result = json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[7:])
    assert [r["k"] for r in result["runs"]] == [0, 1]
    for r in result["runs"]:
        assert [p[0] for p in r["curve"]] == [0, 1, 2]
        assert all(0.0 <= p[2] <= 1.0 for p in r["curve"]) and r["curve"][2][1] > r["curve"][1][1] > 0.0
    assert result["runs"][0]["staleness_mean"] == 0.0 and 0.0 <= result["runs"][1]["staleness_mean"] <= 1.0
    assert "| seed | K | train s |" in out and "| 0 | 1 |" in out
    assert (tmp_path / "async.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((tmp_path / "r.json").read_text())["runs"] == result["runs"]
