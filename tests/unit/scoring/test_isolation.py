"""What a reward function starts dies with the trainer, however it ends (grpokit.scoring._keeper), and a
reward module that crashes or hangs at import time is a named error, not the trainer's end
(grpokit.core.user_code). Real processes throughout: sleep children, a new session, a daemon."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tiny_model import ADDITION_ROWS, SMALL_RUN, save_tiny_model

from grpokit.cli.main import main
from grpokit.rewards import RewardRunner, resolve_reward_specs
from grpokit.rewards.registry import RewardConfigError

SPAWNER = '''
import os, subprocess, sys
from pathlib import Path

PIDS = Path(__file__).with_suffix(".pids")


def score(prompts, completions, **kw):
    """Leaves three processes behind the first time: a plain child, one in its own session, a daemon."""
    if not PIDS.exists():
        plain = subprocess.Popen(["sleep", "300"])
        session = subprocess.Popen(["sleep", "300"], start_new_session=True)
        code = "import os, time\\nos.setsid()\\nif os.fork():\\n    os._exit(0)\\nprint(os.getpid(), flush=True)\\ntime.sleep(300)"
        parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        daemon = int(parent.stdout.readline())
        parent.wait()
        PIDS.write_text(f"{plain.pid} {session.pid} {daemon}\\n")
    return [float("7" in c) for c in completions]
'''


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def wait_for_pids(path: Path, timeout_s: float = 120) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.is_file() and path.read_text().endswith("\n"):
            return [int(p) for p in path.read_text().split()]
        time.sleep(0.05)
    raise AssertionError(f"{path} never written")


def left_alive(pids: list[int], timeout_s: float = 10) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


@pytest.fixture
def spawner(tmp_path):
    path = tmp_path / "spawner.py"
    path.write_text(SPAWNER)
    yield path
    pids_file = path.with_suffix(".pids")
    for pid in [int(p) for p in pids_file.read_text().split()] if pids_file.is_file() else []:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)  # a failed test leaves nothing running either


def test_everything_a_reward_started_dies_when_the_runner_closes(spawner):
    [(name, fn, weight)] = resolve_reward_specs([{"name": f"{spawner}:score"}])
    runner = RewardRunner([(name, fn, weight)], timeout_s=60)
    runner(["1+6="], ["7"])
    pids = wait_for_pids(spawner.with_suffix(".pids"))
    assert len(pids) == 3 and all(alive(p) for p in pids)
    runner.close()
    assert left_alive(pids) == []


@pytest.mark.slow
def test_sigkill_of_the_trainer_leaves_no_process_of_its_rewards(spawner, tmp_path):
    model = save_tiny_model(tmp_path / "model")
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ADDITION_ROWS))
    argv = [
        f"model.name_or_path={model}",
        f"data.train={tmp_path / 'data.jsonl'}",
        f"train.output_dir={tmp_path / 'run'}",
        f"rewards=[{{name: '{spawner}:score'}}]",
        "train.steps=500",
        *SMALL_RUN,
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    trainer = subprocess.Popen(
        [sys.executable, "-m", "grpokit", "train", *argv], env=env, stderr=subprocess.DEVNULL
    )
    try:
        pids = wait_for_pids(spawner.with_suffix(".pids"))
        workers = [
            int(p)
            for p in subprocess.run(
                ["pgrep", "-P", str(trainer.pid)], capture_output=True, text=True
            ).stdout.split()
        ]
        assert workers and all(alive(p) for p in pids)
    finally:
        trainer.send_signal(signal.SIGKILL)
        trainer.wait()
    assert left_alive(pids + workers) == []  # the keepers, the workers, and all three of the reward's


@pytest.mark.slow
@pytest.mark.parametrize(
    "body, words",
    [
        ("import os\nos._exit(7)\n", "exit code 7"),
        ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n", "signal SIGKILL"),
        ("import time\ntime.sleep(3600)\n", "did not finish within 2 s"),
    ],
    ids=["exit-7", "killed", "hangs"],
)
def test_a_reward_file_that_ends_or_hangs_at_import_is_a_named_error(
    tmp_path, monkeypatch, capsys, body, words
):
    monkeypatch.setenv("GRPOKIT_REWARD_IMPORT_TIMEOUT_S", "2")
    path = tmp_path / "bad_rewards.py"
    path.write_text(body + "\ndef score(prompts, completions, **kw):\n    return [0.0] * len(completions)\n")
    with pytest.raises(
        RewardConfigError, match=f"rewards\\[0\\].name='{path}:score': running {path} failed: .*{words}"
    ):
        resolve_reward_specs([{"name": f"{path}:score"}])
    (tmp_path / "data.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n')
    code = main(["train", "model.name_or_path=/nonexistent", f"train.output_dir={tmp_path / 'run'}",
                 f"data.train={tmp_path / 'data.jsonl'}", f"rewards=[{{name: '{path}:score'}}]"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and str(path) in err and words in err and "Traceback" not in err


def test_a_module_that_ends_the_process_at_import_is_a_named_error(tmp_path, monkeypatch):
    (tmp_path / "exits_at_import.py").write_text("import sys, os\nos._exit(3)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(RewardConfigError, match="importing module 'exits_at_import' failed: .*exit code 3"):
        resolve_reward_specs([{"name": "exits_at_import:score"}])


@pytest.mark.slow
def test_sigkill_of_the_trainer_during_the_import_probe_leaves_nothing_holding_its_output(tmp_path):
    """The trainer is killed while the probe child imports a slow reward file: the probe dies with it
    (parent-death signal) and never held the trainer's stdout, so a reader of that output (`| tee`, a
    CI log) sees its end at once. Before: the probe lived on under init for the file's whole sleep,
    holding the pipe open."""
    mark = tmp_path / "probe.pid"
    slow = tmp_path / "slow_rewards.py"
    slow.write_text(f"import os, time\nopen({str(mark)!r}, 'w').write(str(os.getpid()))\ntime.sleep(120)\n")
    script = (
        f"from grpokit.core.user_code import load_module\nload_module({str(slow)!r}, 'score', 'rewards[0]')\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    trainer = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not (mark.exists() and mark.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    probe = int(mark.read_text())
    trainer.kill()
    trainer.wait()
    start = time.monotonic()
    assert trainer.stdout.read() == b""  # end of file: nobody holds the pipe any more
    assert time.monotonic() - start < 10
    deadline = time.monotonic() + 5
    while alive(probe) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(probe)
