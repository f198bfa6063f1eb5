"""Importing a user's reward module in a forked child first, so that what it does at import time cannot
end or hang the trainer: ``os._exit(7)``, a crash, or a module that blocks forever becomes a
RewardConfigError naming the file, before the trainer imports it itself (a module that returns or raises
in the child is then imported again in the trainer, so import-time side effects run twice).

A fork, not a fresh interpreter: the child already holds everything the trainer imported (torch, ...),
so the probe costs about the module's own import time."""

from __future__ import annotations

import os
import select
import signal
import time
import warnings
from collections.abc import Callable

IMPORT_TIMEOUT_S = 60.0
"""How long a reward module may take to import (env GRPOKIT_REWARD_IMPORT_TIMEOUT_S overrides it)."""


def probe_import(load: Callable[[], object], timeout_s: float | None = None) -> str | None:
    """Run ``load()`` (which imports the module) in a forked child; None when it returned or raised (an
    exception is safe to meet again in the trainer, which reports it), else what went wrong in words: the
    exit code or signal the process ended with, or the timeout."""
    if timeout_s is None:
        timeout_s = float(os.environ.get("GRPOKIT_REWARD_IMPORT_TIMEOUT_S") or IMPORT_TIMEOUT_S)
    read_fd, write_fd = os.pipe()
    with warnings.catch_warnings():  # Python >= 3.12 warns on fork with threads: the child only imports
        warnings.filterwarnings("ignore", message=".*fork", category=DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 0
        try:
            os.close(read_fd)
            os.setpgid(0, 0)  # its own group: whatever the module starts is killed with it
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, signal.SIG_DFL)
            try:
                load()
            except BaseException:  # noqa: BLE001 - an exception is safe: the trainer's own import reports it
                pass
            os.write(write_fd, b"returned")
        except BaseException:  # noqa: BLE001
            code = 1
        finally:
            os._exit(code)
    os.close(write_fd)
    try:
        data, timed_out = _read_until_closed(read_fd, timeout_s)
    finally:
        os.close(read_fd)
        try:
            os.killpg(pid, signal.SIGKILL)  # a hung import, and whatever the module started
        except OSError:
            pass
        _, status = os.waitpid(pid, 0)
    if timed_out:
        return f"importing it did not finish within {timeout_s:.0f} s (it blocks at import time)"
    if data == b"returned":
        return None
    if os.WIFSIGNALED(status):
        return f"importing it killed the process (signal {signal.Signals(os.WTERMSIG(status)).name})"
    return f"importing it ended the process (exit code {os.waitstatus_to_exitcode(status)})"


def _read_until_closed(fd: int, timeout_s: float) -> tuple[bytes, bool]:
    """(what the child wrote, whether the time ran out before it closed the pipe)."""
    deadline = time.monotonic() + timeout_s
    data = b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return data, True
        ready, _, _ = select.select([fd], [], [], min(left, 1.0))
        if ready:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return data, False
            data += chunk
