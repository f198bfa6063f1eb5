"""One rank started by ``grpokit launch``: ``python -m grpokit.cli.rank COMMAND ARGS`` is ``python -m grpokit
COMMAND ARGS`` that dies with the launcher.

torch's agent starts each rank in a session of its own, so a launcher killed with SIGKILL (the OOM killer,
``kill -9``, a CI timeout) would leave the ranks, and what they started, running. Here the rank asks the
kernel for SIGKILL when its parent dies (PR_SET_PDEATHSIG, Linux), and ends at once if the launcher
(``GRPOKIT_LAUNCHER_PID``) is already gone; its reward workers and sandboxes die with it
(grpokit.rewards._keeper). SIGTERM and Ctrl-C to the launcher are unchanged: the agent passes them on and
every rank saves a checkpoint."""

from __future__ import annotations

import os
import signal
import sys

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


if __name__ == "__main__":
    die_with_launcher()
    from grpokit.cli.exit import exit_program
    from grpokit.cli.main import main

    exit_program(main(sys.argv[1:]))
