"""One output folder, one run (grpokit.run.lock): the lock, stale locks, concurrent starts, and
``--overwrite`` that keeps the old run until the new one has a step and touches nothing else."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tiny_model import ADDITION_ROWS, SMALL_RUN, has_seven, make_tiny_model, save_tiny_model, small_trainer

from grpokit import GRPOTrainer, load_config
from grpokit.cli.main import main
from grpokit.config.schema import ConfigError
from grpokit.run.lock import LOCK_FILE, MOVING, REPLACED, OutputLock, restore_aside, set_aside

ROWS, SETTINGS = ADDITION_ROWS, SMALL_RUN


def api_trainer(out: Path, steps: int = 1, **kwargs) -> GRPOTrainer:
    return small_trainer(out, steps, **kwargs)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    w = tmp_path_factory.mktemp("lock")
    save_tiny_model(w / "model")
    (w / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    # step 1's reward of slow.py outlasts any poll: the test that uses it kills the run inside it (a 1.5 s sleep
    # was a window a poll delayed by a loaded machine could miss)
    (w / "slow.py").write_text(
        "import time\n\ndef score(prompts, completions, **kw):\n    time.sleep(60)\n"
        "    return [float('7' in c) for c in completions]\n"
    )
    (w / "fails.py").write_text(
        "def score(prompts, completions, **kw):\n    raise ValueError('broken verifier')\n"
    )
    return w


def cli_args(world: Path, out: Path, *extra: str) -> list[str]:
    return [
        "train",
        f"model.name_or_path={world / 'model'}",
        f"data.train={world / 'data.jsonl'}",
        f"train.output_dir={out}",
        *SETTINGS,
        *extra,
    ]


def test_two_trainers_built_for_one_folder_only_one_trains(tmp_path):
    """Both pass the check made when they are built (nothing is there yet); the lock that train() holds and
    the check made again under it let only the first run: the second is refused, not silently mixed in."""
    out = tmp_path / "run"
    refused = []

    def start_another(step, metrics, trainer):
        assert (out / LOCK_FILE).read_text().startswith(f"pid {os.getpid()} on ")
        try:
            api_trainer(out)
        except ConfigError as e:
            refused.append(str(e))

    first = api_trainer(out, callbacks=[start_another])
    second = api_trainer(out)
    first.train()
    assert len(refused) == 1 and f"in use by another grpokit run (pid {os.getpid()}" in refused[0]
    assert not first.run.lock.held  # released when train() ends
    with pytest.raises(ConfigError, match="already holds a run"):
        second.train()
    api_trainer(out, steps=2, resume=True).train()  # the same folder, continued
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]


def test_a_run_that_fails_to_start_leaves_no_folder_and_no_lock(tmp_path):
    cfg = load_config(
        None, [f"train.output_dir={tmp_path / 'other'}", *SETTINGS, "train.accuracy_reward=nope"]
    )
    model, tok = make_tiny_model("qwen2", seed=0)
    with pytest.raises(ConfigError, match="train.accuracy_reward='nope'"):
        GRPOTrainer(
            cfg, model=model, tokenizer=tok, train_rows=ROWS, reward_functions=[("has_seven", has_seven, 1)]
        )
    assert not (tmp_path / "other").exists()  # the folder the lock made is gone again


def test_a_stale_lock_of_a_killed_process_is_taken_over(tmp_path):
    out = tmp_path / "run"
    code = (
        "import sys, time; from grpokit.run.lock import OutputLock; "
        f"lock = OutputLock({str(out)!r}); lock.acquire(); print('locked', flush=True); time.sleep(60)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    with pytest.raises(ConfigError, match=f"pid {holder.pid}"):
        OutputLock(out).acquire()
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert f"pid {holder.pid}" in (out / LOCK_FILE).read_text()  # the file stays, its lock does not
    lock = OutputLock(out)
    lock.acquire()
    assert f"pid {os.getpid()}" in (out / LOCK_FILE).read_text()
    lock.release()


@pytest.mark.slow
def test_two_cli_runs_started_together_one_runs_one_is_refused(world, tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    argv = cli_args(world, out, "train.steps=2")
    procs = [
        subprocess.Popen([sys.executable, "-m", "grpokit", *argv], env=env, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    results = [(p.wait(timeout=240), p.stderr.read()) for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    refused = next(err for code, err in results if code == 2)
    assert "in use by another grpokit run" in refused and "train.output_dir" in refused
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]  # one run's results, whole


def make_old_run(out: Path) -> dict[str, bytes]:
    """A previous run's files, and files of the user's that are no run's; returns name -> content."""
    files = {
        "metrics.jsonl": b'{"step": 1, "loss": 0.5}\n',
        "config.yaml": b"train:\n  steps: 1\n",
        "checkpoints/step_000001/trainer_state.pt": b"old state",
        "samples/step_000001.jsonl": b"{}\n",
        "notes.md": b"my notes, not a run's\n",
        "data/mine.jsonl": b'{"prompt": "mine"}\n',
    }
    for name, data in files.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(data)
    return files


def contents(out: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != LOCK_FILE
    }


def test_overwrite_then_fail_keeps_the_old_run_and_overwrite_then_succeed_replaces_it(
    world, tmp_path, capsys
):
    out = tmp_path / "run"
    old = make_old_run(out)
    failing = cli_args(world, out, f"rewards=[{{name: '{world / 'fails.py'}:score'}}]", "--overwrite")
    assert main(failing) == 3  # the user's reward failed: exit 3 (UserCodeFailedError; grpokit --help's table)
    err = capsys.readouterr().err
    assert "broken verifier" in err and "back in place" in err
    assert contents(out) == old  # every file of the old run, byte for byte; nothing of the failed one
    assert not (out / REPLACED).exists()
    assert main(cli_args(world, out, "train.steps=1", "--overwrite")) == 0
    now = contents(out)
    assert now["notes.md"] == old["notes.md"] and now["data/mine.jsonl"] == old["data/mine.jsonl"]
    assert "samples/step_000001.jsonl" not in now  # the old run's (this run writes no samples)
    assert now["checkpoints/step_000001/trainer_state.pt"] != old["checkpoints/step_000001/trainer_state.pt"]
    assert "reward/total/mean" in json.loads(now["metrics.jsonl"].splitlines()[0])  # the new run's line
    assert not (out / REPLACED).exists()


def test_overwrite_of_a_folder_without_a_run_touches_none_of_its_files(tmp_path):
    out = tmp_path / "run"
    (out / "tensorboard").mkdir(parents=True)
    (out / "tensorboard" / "mine.txt").write_text("my own tensorboard notes")
    (out / "samples").mkdir()
    (out / "samples" / "mine.txt").write_text("my samples")
    (out / "curves.png").write_bytes(b"my picture")
    api_trainer(out, overwrite=True).train()
    assert (out / "tensorboard" / "mine.txt").read_text() == "my own tensorboard notes"
    assert (out / "samples" / "mine.txt").read_text() == "my samples"
    assert (out / "metrics.jsonl").is_file()


@pytest.mark.slow
def test_a_kill_while_the_old_run_is_being_set_aside_loses_none_of_it(tmp_path):
    """set_aside moves the old run file by file: killed half-way (here: the move stopped after the samples),
    the next start puts the moved part back. Before, REPLACED existed from the first move on, and the restore
    deleted the old run's files that had not been moved yet as if the new run had written them (seen in CI:
    samples/ lost when the SIGKILL of the test below landed during the move)."""
    out = tmp_path / "run"
    old = make_old_run(out)
    (out / MOVING).mkdir()
    (out / "samples").rename(out / MOVING / "samples")  # the move killed after its first entry
    restore_aside(out)
    assert contents(out) == old and not (out / MOVING).exists() and not (out / REPLACED).exists()

    aside = set_aside(out)  # a whole move: everything of the run in REPLACED, the user's files stay
    assert aside == out / REPLACED and not (out / MOVING).exists()
    users = {"notes.md", "data/mine.jsonl"}
    assert set(contents(out)) == users | {f"{REPLACED}/{name}" for name in old if name not in users}
    restore_aside(out)
    assert contents(out) == old


def test_an_overwrite_killed_before_its_first_step_gives_the_old_run_back(world, tmp_path):
    """SIGKILL while the new run is still before its first step: the next start puts the old run back."""
    out = tmp_path / "run"
    old = make_old_run(out)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    argv = cli_args(world, out, f"rewards=[{{name: '{world / 'slow.py'}:score'}}]", "--overwrite")
    proc = subprocess.Popen([sys.executable, "-m", "grpokit", *argv], env=env, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (out / REPLACED).is_dir() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (out / REPLACED).is_dir()
    proc.send_signal(signal.SIGKILL)  # during the slow reward of step 1
    proc.wait()
    with pytest.raises(ConfigError, match="step_000001"):  # the old run's (fake) checkpoint is back
        api_trainer(out, resume=True)
    assert contents(out) == old
