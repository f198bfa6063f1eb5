"""One rank started by ``grpokit launch``: ``python -m grpokit.cli.rank COMMAND ARGS`` is ``python -m grpokit
COMMAND ARGS`` that dies with the launcher.

torch's agent starts each rank in a session of its own, so a launcher killed with SIGKILL (the OOM killer,
``kill -9``, a CI timeout) would leave the ranks, and what they started, running. Here the rank asks the
kernel for SIGKILL when its parent dies (PR_SET_PDEATHSIG, Linux), and ends at once if the launcher
(``GRPOKIT_LAUNCHER_PID``) is already gone; its reward workers and sandboxes die with it
(grpokit.rewards._keeper). SIGTERM and Ctrl-C to the launcher are unchanged: the agent passes them on and
every rank saves a checkpoint.

``exit_program``: how every ``grpokit`` process ends (the console script, ``python -m grpokit``, a rank). A rank
of a process group leaves without the interpreter's teardown."""

from __future__ import annotations

import atexit
import os
import signal
import sys
from typing import NoReturn

from grpokit.cli.launch import LAUNCHER_PID


def die_with_launcher() -> None:
    launcher = int(os.environ.get(LAUNCHER_PID) or 0)
    try:
        import ctypes  # noqa: PLC0415

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return  # not Linux: torch's agent still stops the ranks on SIGTERM / Ctrl-C
    if launcher and os.getppid() != launcher:  # the launcher died before the signal was armed
        os._exit(128 + signal.SIGKILL)


def exit_program(code: int) -> NoReturn:
    """End the process with ``code``: ``sys.exit(code)``, unless the command succeeded in a process that joined a
    torch.distributed group (a torchrun rank). Then the ranks meet in a barrier (none tears down while another is
    still writing), the exit handlers run (grpokit.train.distributed's destroys the group; TensorBoard, wandb and
    logging flush), and the process leaves with ``os._exit(0)``: the interpreter's teardown is skipped.

    Why: gloo's and the TCPStore's C++ threads outlive the group in objects freed during that teardown (FSDP's
    device mesh holds the group), and a C++ thread that takes the GIL then aborts the process ("terminate called
    without an active exception", exit -6) after a finished run: once in CI, on a two-rank FSDP SFT run that had
    saved its checkpoint. PyTorch's own attempt to fix it at exit was abandoned (pytorch/pytorch#179291).
    A failed rank ends as before (sys.exit): a barrier could wait on ranks stuck in another collective, and a
    quicker exit lets torchrun's agent stop the other ranks before they have said why they failed."""
    dist = sys.modules.get("torch.distributed")
    if code != 0 or dist is None or not dist.is_available() or not dist.is_initialized():
        sys.exit(code)
    try:
        dist.barrier()
    except Exception as e:  # a rank that failed has left: its own code says so, this one's stays 0
        print(f"grpokit: rank {dist.get_rank()}: the ranks' last barrier failed ({e})", file=sys.stderr)
    try:
        atexit._run_exitfuncs()  # noqa: SLF001 (what sys.exit would run; public since Python 2, only named _)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    die_with_launcher()
    from grpokit.cli.main import main

    exit_program(main(sys.argv[1:]))
