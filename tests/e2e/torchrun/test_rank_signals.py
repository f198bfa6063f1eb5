"""A signal to one torchrun rank ends the whole run as a signal to the launcher does: every rank stops after the
same step, the checkpoint of that step is saved (a collective), and `grpokit launch` exits 143. Real ranks (2,
gloo, CPU), a real SIGTERM to rank 1's process alone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from paths import REPO, TESTS
from tiny_model import ADDITION_ROWS, save_tiny_model
from torchrun import free_port

from grpokit.model.checkpoint import list_checkpoints, verify_checkpoint


def rank_pids(launcher: int) -> dict[int, int]:
    """{rank: pid} of the launcher's rank processes (RANK in their environment)."""
    out = subprocess.run(["pgrep", "-P", str(launcher)], capture_output=True, text=True).stdout.split()
    ranks = {}
    for pid in map(int, out):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for item in env:
            if item.startswith(b"RANK="):
                ranks[int(item[5:])] = pid
    return ranks


def steps_logged(run: Path) -> int:
    path = run / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.is_file() else 0


@pytest.mark.slow
def test_sigterm_to_one_rank_stops_every_rank_after_the_same_step_with_a_checkpoint(tmp_path):
    model = save_tiny_model(tmp_path / "model")
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ADDITION_ROWS))
    settings = {
        "model": {"name_or_path": str(model), "device": "cpu"},
        "data": {"train": str(tmp_path / "data.jsonl"), "template": "plain", "max_prompt_tokens": 32},
        "rollout": {"group_size": 2, "prompts_per_step": 2, "max_new_tokens": 4},
        "rewards": [{"name": "math_accuracy"}],
        "eval": {"enabled": False},
        "train": {"steps": 100000, "save_every": 0, "report_to": "none", "samples_every": 0,
                  "stop_after_flat_steps": 0, "distributed": "ddp"},
    }  # fmt: skip
    (tmp_path / "cfg.yaml").write_text(json.dumps(settings))
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in (REPO, TESTS)), "OMP_NUM_THREADS": "1"}
    env.pop("WORLD_SIZE", None)
    launcher = subprocess.Popen(
        [sys.executable, "-m", "grpokit", "launch", "--nproc_per_node=2", f"--master_port={free_port()}", "train",
         str(tmp_path / "cfg.yaml"), "--output-dir", str(run)],
        env=env, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 400
        while steps_logged(run) < 1 and time.monotonic() < deadline and launcher.poll() is None:
            time.sleep(0.2)
        ranks = rank_pids(launcher.pid)
        assert set(ranks) == {0, 1} and steps_logged(run) >= 1, launcher.poll() or ranks
        # rank 1 alone: rank 0 learns it at the step's end (Distributed.agree)
        os.kill(ranks[1], signal.SIGTERM)
        _, err = launcher.communicate(timeout=400)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert launcher.returncode == 143, err[-3000:]
    stopped = [line for line in err.splitlines() if line.startswith("grpokit: stopped by SIGTERM after")]
    assert len(stopped) == 1, err[-3000:]  # rank 0 reports
    step = int(stopped[0].split("after step ")[1].split("/")[0])
    assert steps_logged(run) == step  # both ranks stopped after the same step, the one logged last
    (checkpoint,) = list_checkpoints(run / "checkpoints")
    assert checkpoint.name == f"step_{step:06d}" and verify_checkpoint(checkpoint) is None
    assert "Traceback" not in err
