"""Whole CLI runs under torchrun (2 ranks, gloo, CPU) against the same run in one process: ``grpokit sft``
(DDP and FSDP) and ``grpokit train`` with multi-turn tool rollouts. Same data order, same seeds, the
global batch split by whole groups / rows: the per-step losses and the final weights must agree."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torchrun import launch, tool_episode_config

ROWS = [
    {"prompt": f"{a}+{b}=", "completion": str(a + b), "answer": str(a + b)}
    for a, b in [(1, 2), (3, 4), (5, 5), (9, 8), (2, 7), (6, 1), (4, 4), (8, 3)]
]


def _weights(out: Path) -> dict[str, torch.Tensor]:
    summary = json.loads((out / "summary.json").read_text())
    return load_file(str(Path(summary["checkpoint"]) / "model.safetensors"))


def _metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _close(a: dict, b: dict, atol: float) -> None:
    """Every weight within atol, but the key biases: their gradient is zero in exact arithmetic (a bias on
    the keys adds one constant to a query's scores, which the softmax removes), so Adam's normalised step
    turns the rounding noise of the summation order into differences of ~1e-5."""
    assert a.keys() == b.keys()
    for name in a:
        if name.endswith("k_proj.bias"):
            continue
        assert torch.allclose(a[name].float(), b[name].float(), atol=atol, rtol=0), name


@pytest.fixture(scope="module")
def sft_setup(tmp_path_factory):
    from tiny_model import write_sft_run

    folder = tmp_path_factory.mktemp("sft")
    cfg = write_sft_run(folder, ROWS, batch_size=4, lr=1e-2, steps=3)
    one = folder / "one"
    from grpokit.cli.main import main

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the ranks (OMP_NUM_THREADS=1): the same summation order in the kernels
    try:
        assert main(["sft", str(cfg), "--output-dir", str(one)]) == 0  # the one-process run, in this process
    finally:
        torch.set_num_threads(threads)
    return folder, cfg, one


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_sft_on_two_ranks_gives_the_one_process_losses_and_weights(sft_setup, strategy):
    folder, cfg, one = sft_setup
    two = folder / strategy
    args = ["grpokit", "sft", str(cfg), "--output-dir", str(two), f"train.distributed={strategy}"]
    launch(args, nproc=2, module=True)
    ref, got = _metrics(one), _metrics(two)
    assert [m["step"] for m in got] == [m["step"] for m in ref] == [1, 2, 3]
    for r, g in zip(ref, got):
        assert g["loss"] == pytest.approx(r["loss"], abs=1e-6)
    _close(_weights(one), _weights(two), atol=2e-6)


PACKED = ["sft.packing=true", "optim.micro_batch_tokens=16"]  # 2-3 examples of ~6 tokens a micro-batch


@pytest.fixture(scope="module")
def sft_packed(sft_setup):
    """The one-process run of sft_setup's config, packed."""
    from grpokit.cli.main import main

    folder, cfg, _ = sft_setup
    one = folder / "one_packed"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main(["sft", str(cfg), "--output-dir", str(one), *PACKED]) == 0
    finally:
        torch.set_num_threads(threads)
    return one


@pytest.mark.slow
def test_sft_packed_under_fsdp_gives_the_one_process_losses_and_weights(sft_setup, sft_packed):
    """Packed micro-batches by tokens on two FSDP ranks. Before, the trainer's packing check ran a forward on
    the sharded model (outside its FSDP root) and the run failed before its first step."""
    folder, cfg, _ = sft_setup
    two = folder / "fsdp_packed"
    args = ["grpokit", "sft", str(cfg), "--output-dir", str(two), "train.distributed=fsdp", *PACKED]
    launch(args, nproc=2, module=True)
    ref, got = _metrics(sft_packed), _metrics(two)
    assert [m["step"] for m in got] == [m["step"] for m in ref] == [1, 2, 3]
    for r, g in zip(ref, got):
        assert g["loss"] == pytest.approx(r["loss"], abs=1e-6)
    _close(_weights(sft_packed), _weights(two), atol=2e-6)


@pytest.mark.slow
def test_multiturn_tool_rollouts_on_two_ranks_log_global_numbers_and_resume(tmp_path):
    """2 ranks, 3 steps of tool episodes: exit 0, rank 0 logs one line per step with the episode and tool
    numbers, and a resume from step 2 by the same 2 ranks repeats step 3. (The CLI's ranks sample their
    own shares with their own seeds, so the run is not the one-process run; tests/e2e/torchrun/test_distributed.py
    proves the update's equivalence on one global batch.)"""
    import shutil

    cfg = tool_episode_config(
        tmp_path, ROWS, algo={"preset": "grpo"}, train={"save_every": 1, "keep_checkpoints": 0}
    )
    run = tmp_path / "run"
    launch(["grpokit", "train", str(cfg), "--output-dir", str(run)], nproc=2, module=True)
    full = _metrics(run)
    assert [m["step"] for m in full] == [1, 2, 3]
    for m in full:  # 8 episodes per step, 4 per rank: the counts are summed over ranks, the means averaged
        assert m["tools/calls"] == pytest.approx(8 * m["tools/calls_per_episode"]), m
    assert sum(m["tools/calls"] for m in full) > 0 and max(m["episode/turns_mean"] for m in full) > 1
    shutil.copytree(run, tmp_path / "resumed")
    args = ["--output-dir", str(tmp_path / "resumed"), "--resume-from", "step_000002"]
    launch(["grpokit", "train", str(cfg), *args], nproc=2, module=True)
    again = _metrics(tmp_path / "resumed")
    assert [m["step"] for m in again] == [1, 2, 3, 3]
    for key in ("loss", "reward", "tools/calls", "episode/turns_mean"):
        assert again[3][key] == pytest.approx(full[2][key], rel=1e-5, abs=1e-7), key
