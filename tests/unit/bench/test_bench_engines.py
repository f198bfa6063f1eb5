"""grpokit bench --engine hf,fast[,vllm]: the same model, shape and preset on each rollout engine in turn, one
table side by side (issue 41). vLLM's own run of it is measured in docs/guides/vllm.md (it needs .venv-vllm)."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

from grpokit import bench


@pytest.fixture()
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow
def test_engines_side_by_side(tmp_path, capsys, one_thread):
    parser = argparse.ArgumentParser(prog="grpokit")
    bench.add_bench_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        ["bench", "--shape", "tiny", "--model-size", "tiny", "--cache-dir", str(tmp_path / "cache"), "--steps", "2"]
        + ["--engine", "hf,fast", "--device", "cpu", "--json", str(tmp_path / "r.json")]
    )
    assert args.func(args) == 0
    out = capsys.readouterr().out
    result = json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[7:])
    assert list(result["engines"]) == ["hf", "fast"]
    hf, fast = result["engines"]["hf"], result["engines"]["fast"]
    assert hf["decode_engine"] != fast["decode_engine"]  # each ran on its own engine
    assert hf["median"]["generation_tokens_per_s"] > 0 and fast["median"]["generation_tokens_per_s"] > 0
    assert "rollout engines" in out and json.loads((tmp_path / "r.json").read_text()) == result


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--engine", "hf,slow"], "--engine hf,slow: ['slow'] not among fast, hf, vllm"),
        (["--engine", "hf,fast", "--algos", "grpo,dr_grpo"], "compares engines: use one --algos preset"),
    ],
)
def test_bad_engine_lists_are_refused_by_name(argv, message, tmp_path, capsys):
    parser = argparse.ArgumentParser(prog="grpokit")
    bench.add_bench_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", "--cache-dir", str(tmp_path), *argv])
    assert args.func(args) == 2
    assert message in capsys.readouterr().err
