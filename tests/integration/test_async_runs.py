"""Asynchronous rollouts (rollout.max_staleness) as a real `grpokit train` process: SIGKILL of the trainer leaves
no sampler process behind, and a resume from its last checkpoint is the killed run bit for bit (its batch in
flight was in the checkpoint). The other signals and failures of an asynchronous run, through the same CLI:
tests/integration/test_exit_codes.py."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tiny_model import ADDITION_ROWS, SMALL_RUN, save_tiny_model

REWARD = """import os
import signal
from pathlib import Path


def score(prompts, completions, trainer_state=None, **kw):
    # batch 5 or later, once step 5 is logged (after checkpoint 4): SIGKILL of the trainer, once. The trainer
    # cannot log step 8 (checkpoint 8) before this batch is scored, so the kill always lands between
    # checkpoint 4 and checkpoint 8, with step 5 (and perhaps 6) logged past the checkpoint.
    run, marker = Path(os.environ["GRPOKIT_TEST_RUN"]), Path(os.environ["GRPOKIT_TEST_RUN"] + ".killed")
    metrics = run / "metrics.jsonl"
    if trainer_state.global_step >= 5 and not marker.exists() and metrics.is_file():
        if any(line.startswith('{"step": 5,') for line in metrics.read_text().splitlines()):
            marker.write_text("")
            os.kill(int(Path(os.environ["GRPOKIT_TEST_RUN"] + ".pid").read_text()), signal.SIGKILL)
    return [float("7" in c) for c in completions]
"""
# the clocks' numbers (and how full the queue was when a batch was taken): the rest must match bit for bit
VARYING = ("time/", "step_time", "tokens_per_s", "peak_memory_mb", "async/wait_s", "async/sampler_busy", "async/trainer_busy",
           "async/queue_depth")  # fmt: skip


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"  # a zombie has ended


def children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def newest_checkpoint(run: Path) -> int:
    """The step of the run's newest checkpoint, 0 when none: a step_N folder appears whole (renamed from
    step_N.tmp once written)."""
    return max((int(p.name[5:]) for p in (run / "checkpoints").glob("step_??????")), default=0)


def wait_until(condition, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"{what} did not happen within {timeout_s} s")


@pytest.mark.slow
def test_sigkill_of_the_trainer_leaves_no_sampler_and_the_resume_is_the_uninterrupted_run(tmp_path):
    """K = 1, a checkpoint every 4 steps: the trainer is killed (SIGKILL, from its own reward function, at a
    point the steps fix: after step 5 is logged, before checkpoint 8) and leaves no sampler process behind; a
    resume from checkpoint 4 says nothing was lost and logs steps 5 and 6 bit for bit as the killed run did
    (its batch in flight and the process's prompt position were in the checkpoint; on 37165e5 the resumed
    sampler made batch 4 again from the restored weights and every number differed)."""
    model = save_tiny_model(tmp_path / "model")
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ADDITION_ROWS))
    (tmp_path / "reward.py").write_text(REWARD)
    run = tmp_path / "run"
    argv = [
        sys.executable, "-m", "grpokit", "train",
        f"model.name_or_path={model}",
        f"data.train={tmp_path / 'data.jsonl'}",
        f"train.output_dir={run}",
        f"rewards=[{{name: '{tmp_path / 'reward.py'}:score'}}]",
        *SMALL_RUN,
        "rollout.max_staleness=1",
        "train.save_every=4",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}
    env.update(GRPOKIT_SAMPLER_START="fork", GRPOKIT_TEST_RUN=str(run))  # (fork: a CPU run's default)
    log = tmp_path / "first.log"
    with open(log, "w") as out:
        trainer = subprocess.Popen([*argv, "train.steps=500"], env=env, stdout=out, stderr=subprocess.STDOUT)
    Path(f"{run}.pid").write_text(str(trainer.pid))
    try:
        found = wait_until(  # (the comma: a line read while being written cannot give a cut pid)
            lambda: re.search(r"sampler process (\d+),", log.read_text()), 300, "the sampler process's start"
        )
        sampler = int(found.group(1))
        assert sampler in children(trainer.pid) and alive(sampler)
        started = children(sampler)  # what the sampler started (reward workers), if any
        trainer.wait(timeout=300)
    finally:
        if trainer.poll() is None:
            trainer.kill()
            trainer.wait()
    assert trainer.returncode == -signal.SIGKILL, log.read_text()[-3000:]
    # (PR_SET_PDEATHSIG ends them at once; the bound is only how long a loaded machine may take to reap them)
    wait_until(lambda: not any(alive(p) for p in [sampler, *started]), 60, "the sampler's end")
    killed = {m["step"]: m for m in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}
    assert newest_checkpoint(run) == 4 and set(killed) in ({1, 2, 3, 4, 5}, {1, 2, 3, 4, 5, 6})

    resumed = subprocess.run(
        [*argv, "train.steps=6", "--resume"], env=env, capture_output=True, text=True, timeout=600
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming an asynchronous run" not in resumed.stderr  # nothing in flight was lost
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    after = lines[len(killed) :]
    assert [m["step"] for m in after] == [5, 6]
    for m in after:  # step 5 always (6 when the killed run logged it too): every number but the clocks'
        if m["step"] in killed:
            assert kept(m) == kept(killed[m["step"]]), m["step"]


def kept(metrics: dict) -> dict:
    """A metrics line without the clocks' numbers."""
    return {k: v for k, v in metrics.items() if not k.startswith(VARYING) and not k.endswith("/seconds")}
