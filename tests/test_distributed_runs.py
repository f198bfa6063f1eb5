"""Whole CLI runs under torchrun (2 ranks, gloo, CPU) against the same run in one process: ``grpokit sft``
(DDP and FSDP) and ``grpokit train`` with multi-turn tool rollouts. Same data order, same seeds, the
global batch split by whole groups / rows: the per-step losses and the final weights must agree."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_distributed import launch

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
    from tiny_model import save_tiny_model

    folder = tmp_path_factory.mktemp("sft")
    model = save_tiny_model(folder / "model")
    data = folder / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    cfg = folder / "sft.yaml"
    cfg.write_text(
        f"model: {{name_or_path: {model}, device: cpu}}\n"
        f"data: {{train: {data}, template: plain, max_length: 64}}\n"
        "sft: {batch_size: 4}\noptim: {lr: 1.0e-2, micro_batch_size: 1}\n"
        "train: {steps: 3, tensorboard: false}\n"
    )
    one = folder / "one"
    from grpokit.cli import main

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the ranks (OMP_NUM_THREADS=1): the same summation order in the kernels
    try:
        assert main(["sft", str(cfg), "--output-dir", str(one)]) == 0  # the one-process run, in this process
    finally:
        torch.set_num_threads(threads)
    return folder, cfg, one


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
