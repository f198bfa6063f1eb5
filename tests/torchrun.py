"""Running code under torchrun from a test: a free port, and ``launch`` (2 real ranks on the CPU, gloo)."""

import os
import socket
import subprocess
import sys

from paths import REPO, TESTS


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(
    args: list[str],
    nproc: int,
    timeout: float = 240,
    module: bool = False,
    paths: tuple = (),
    check: bool = True,
) -> subprocess.CompletedProcess:
    """``python -m torch.distributed.run --nproc_per_node=nproc ...`` (or plain python for nproc=0). ``paths``:
    more folders on PYTHONPATH (those of test modules a config names, e.g. "test_multiturn_training:parity").
    check: the run must exit 0 (False: the caller reads how it ended)."""
    pythonpath = os.pathsep.join(str(p) for p in (REPO, TESTS, *paths))
    env = {**os.environ, "PYTHONPATH": pythonpath, "OMP_NUM_THREADS": "1"}
    env.pop("WORLD_SIZE", None)
    runner = [sys.executable]
    if nproc:
        runner += ["-m", "torch.distributed.run", f"--nproc_per_node={nproc}", f"--master_port={free_port()}"]
    if module:
        runner.append("-m")
    proc = subprocess.run([*runner, *args], env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0 or not check, proc.stderr[-4000:]
    return proc
