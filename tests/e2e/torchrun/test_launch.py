"""``grpokit launch``: torch's launcher (torch.distributed.run) with the ranks' exit codes passed on, where
plain torchrun exits 1 for every ending but success. Real runs: 2 ranks, gloo, CPU, a tiny model."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from paths import REPO, TESTS
from torchrun import free_port

from grpokit.cli.launch import LaunchError, exit_code_of, shutdown_timeout, split_command_line
from grpokit.model.checkpoint import list_checkpoints, verify_checkpoint

ROWS = [{"prompt": f"{a}+{b}=", "completion": str(a + b)} for a, b in [(1, 2), (3, 4), (5, 5), (9, 8)]]


def test_the_command_line_splits_at_the_grpokit_command():
    assert split_command_line(["--nproc_per_node=2", "train", "cfg.yaml", "optim.lr=1e-6"]) == (
        ["--nproc_per_node=2"],
        ["train", "cfg.yaml", "optim.lr=1e-6"],
    )
    assert split_command_line(["--nproc_per_node", "2", "--master_port", "29501", "sft", "s.yaml"]) == (
        ["--nproc_per_node", "2", "--master_port", "29501"],
        ["sft", "s.yaml"],
    )
    assert split_command_line(["demo"]) == ([], ["demo"])
    with pytest.raises(LaunchError, match="no command given; name one of train, sft, demo"):
        split_command_line(["--nproc_per_node=2"])
    with pytest.raises(LaunchError, match="not 'my_script.py'"):
        split_command_line(["--nproc_per_node=2", "my_script.py", "train"])
    with pytest.raises(LaunchError, match="not '-m'"):
        split_command_line(["-m", "grpokit", "train"])


def test_exit_codes_and_the_shutdown_timeout(monkeypatch):
    assert [exit_code_of(c) for c in (1, 2, 143, -9, -15)] == [1, 2, 143, 137, 143]
    monkeypatch.delenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", raising=False)
    assert shutdown_timeout(["--shutdown_timeout=45"]) == "45"
    assert shutdown_timeout(["--shutdown-timeout", "50"]) == "50"
    assert "TORCH_ELASTIC_SHUTDOWN_TIMEOUT" not in os.environ  # the user's option: nothing set
    monkeypatch.setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "70")
    assert shutdown_timeout([]) == "70"
    monkeypatch.delenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT")
    assert shutdown_timeout([]) == "600" and os.environ["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == "600"


@pytest.fixture(scope="module")
def sft_config(tmp_path_factory) -> Path:
    from tiny_model import write_sft_run

    return write_sft_run(tmp_path_factory.mktemp("launch"), ROWS, batch_size=2, lr=1e-3, steps=100000)


def _launch(args: list[str], tmpdir: Path | None = None, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{TESTS}", "OMP_NUM_THREADS": "1"}
    env.pop("WORLD_SIZE", None)
    if tmpdir is not None:  # where torch's agent would leave its torchelastic_* log folder
        env["TMPDIR"] = str(tmpdir)
    command = [
        sys.executable,
        "-m",
        "grpokit",
        "launch",
        "--nproc_per_node=2",
        f"--master_port={free_port()}",
    ]
    return subprocess.Popen([*command, *args], env=env, stderr=subprocess.PIPE, text=True, cwd=REPO, **kw)


@pytest.mark.slow
def test_a_bad_setting_exits_2_from_the_launcher(sft_config, tmp_path):
    """Each rank refuses the value (exit 2); torchrun alone would exit 1. The launch leaves no log folder
    in the temporary directory (before: a torchelastic_* folder per launch)."""
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    proc = _launch(
        ["sft", str(sft_config), "optim.lr=fast", f"--output-dir={tmp_path / 'run'}"], tmpdir=tmpdir
    )
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 2, err[-3000:]
    assert "optim.lr" in err and "'fast'" in err
    assert "exited with code 2" in err and "Traceback" not in err
    assert list(tmpdir.iterdir()) == []


@pytest.mark.parametrize(
    "option",
    [
        "--nproc_per_node=abc",
        "--nnodes=3:1",
        "--nnodes=a",
        "--max_restarts=-1",
        "--rdzv_backend=foo",
        "--master_port=abc",
        "--redirects=9",
        "--tee=x",
        "--local_ranks_filter=a",
        "--logs_specs=nope",
        "--rdzv_conf=a",
        "--monitor_interval=x",
        "--start_method=zz",
        "--bogus",
    ],
)
def test_bad_torchrun_options_are_one_line_errors(option, capsys):
    """Before: a traceback (or torch's usage text) for half of these."""
    from grpokit.cli.launch import main

    assert main([option, "train", "cfg.yaml"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("grpokit launch: bad torchrun option: "), err


def _children(pid: int) -> list[int]:
    found = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        if int(stat[stat.rindex(")") + 2 :].split()[1]) == pid:
            found.append(int(name))
    return found


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


@pytest.mark.slow
def test_sigkill_of_the_launcher_leaves_no_rank_running(sft_config, tmp_path):
    """torch starts each rank in a session of its own: a SIGKILLed launcher left both ranks (and their
    workers) training. Now each rank dies with it (grpokit.cli.rank)."""
    out = tmp_path / "run"
    proc = _launch(["sft", str(sft_config), f"--output-dir={out}"], stdout=subprocess.DEVNULL)
    metrics = out / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.is_file() and metrics.read_text().strip():
            break
        time.sleep(0.2)
    ranks = _children(proc.pid)
    assert proc.poll() is None and len(ranks) == 2, (
        proc.stderr.read()[-3000:] if proc.poll() is not None else ranks
    )
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(_alive(p) for p in ranks):
        time.sleep(0.2)
    assert [p for p in ranks if _alive(p)] == []


@pytest.mark.slow
def test_sigterm_to_the_launcher_saves_on_every_rank_and_exits_143(sft_config, tmp_path):
    out = tmp_path / "run"
    proc = _launch(["sft", str(sft_config), f"--output-dir={out}"])
    metrics = out / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.is_file() and len(metrics.read_text().splitlines()) >= 2:
            break
        time.sleep(0.2)
    assert proc.poll() is None, proc.stderr.read()[-3000:]
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 143, err[-3000:]
    assert "grpokit launch: stopped by SIGTERM" in err and "--resume" in err
    steps = len(metrics.read_text().splitlines())
    (checkpoint,) = list_checkpoints(out / "checkpoints")  # saved at the step the ranks agreed to stop at
    assert checkpoint.name == f"step_{steps:06d}" and verify_checkpoint(checkpoint) is None
    assert "grpokit: stopped by SIGTERM after step" in err  # rank 0's own line: the rank saved, then exited
