"""Asynchronous rollouts (rollout.max_staleness) as a real `grpokit train` process: SIGKILL of the trainer leaves
no sampler process behind, and a resume from its last checkpoint says what was in flight and counts the policy
versions on from the restored step."""

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

REWARD = 'def score(prompts, completions, **kw):\n    return [float("7" in c) for c in completions]\n'


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
def test_sigkill_of_the_trainer_leaves_no_sampler_and_a_resume_counts_versions_on(tmp_path):
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
        "train.save_every=1",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}
    log = tmp_path / "first.log"
    with open(log, "w") as out:
        trainer = subprocess.Popen([*argv, "train.steps=500"], env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        found = wait_until(  # (the comma: a line read while being written cannot give a cut pid)
            lambda: re.search(r"sampler process (\d+),", log.read_text()), 300, "the sampler process's start"
        )
        sampler = int(found.group(1))
        assert sampler in children(trainer.pid) and alive(sampler)
        # checkpoint 3 or a later one: train.keep_checkpoints=2 deletes step_000003 once step 5 is saved, two
        # steps later (a fraction of a second), and a poll that slept past that window under load never saw it
        wait_until(lambda: newest_checkpoint(run) >= 3, 300, "checkpoint 3")
        started = children(sampler)  # what the sampler started (reward workers), if any
    finally:
        trainer.send_signal(signal.SIGKILL)
        trainer.wait()
    # (PR_SET_PDEATHSIG ends them at once; the bound is only how long a loaded machine may take to reap them)
    wait_until(lambda: not any(alive(p) for p in [sampler, *started]), 60, "the sampler's end")

    # resume: the newest complete checkpoint; two more steps
    done = newest_checkpoint(run)
    resumed = subprocess.run(
        [*argv, f"train.steps={done + 2}", "--resume"], env=env, capture_output=True, text=True, timeout=600
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    said = re.search(r"resuming an asynchronous run at step (\d+): the (\d+) batch.*\((\d+) samples\)", resumed.stderr)
    assert said, resumed.stderr[-3000:]
    start = int(said.group(1))
    assert int(said.group(2)) >= 1  # K = 1: one batch made or being made when it was killed
    assert int(said.group(3)) == 4 * int(said.group(2))  # 2 prompts x 2 completions a batch
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    # the resumed run's two steps are the file's last two lines: the killed run may have logged a step past
    # its newest checkpoint, which stays in the file (readers take the last line of a step: grpokit.run.log)
    after = lines[-2:]
    assert [m["step"] for m in after] == list(range(start + 1, start + 3))
    # the first batch after the resume comes from the restored weights (version = the restored step); none is
    # older than K = 1 and none newer than the trainer
    assert after[0]["async/version"] == start
    for m in after:
        assert 0 <= (m["step"] - 1) - m["async/version"] <= 1
