"""A keeper process above each reward worker, so that nothing a reward function starts outlives the trainer.

    trainer ── keeper (child subreaper, its own process group) ── worker (runs the reward functions)
                                                                     └─ whatever they start, at any depth

The worker's process group alone is not enough: a SIGKILLed trainer takes only the worker with it
(PR_SET_PDEATHSIG), and a child started in its own session (``start_new_session=True``, a daemon's
double fork) leaves the group. The keeper is the worker's parent and a child subreaper
(PR_SET_CHILD_SUBREAPER), so every orphaned descendant becomes its child instead of init's; it kills
the whole tree (every descendant, found in /proc, until none is left) when the trainer dies (its
death signal is SIGTERM, caught), when the trainer retires the worker (``stop``: SIGTERM), or when the
worker ends. Linux only, like the workers' fork; elsewhere the keeper still kills its process group.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time

from grpokit.core.procfs import children_by_parent

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int) -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def descendants(root: int) -> list[int]:
    """Every process below ``root`` (children, their children, ...), read from /proc (empty without it)."""
    children = children_by_parent(zombies=False)  # a zombie is dead already: its parent (or we) reap it
    out, todo = [], [root]
    while todo:
        for pid in children.get(todo.pop(), []):
            out.append(pid)
            todo.append(pid)
    return out


def kill_tree(root: int, timeout_s: float = 5.0) -> None:
    """SIGKILL every descendant of ``root`` (this process, a subreaper: orphans come back to it as
    children and are reaped here) and ``root``'s process group, until none is left or the time is up."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            os.killpg(root, signal.SIGKILL) if root != os.getpid() else None
        except OSError:
            pass
        found = descendants(root)
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        _reap_children()
        if not found or time.monotonic() > deadline:
            return
        time.sleep(0.005)


def _reap_children() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def become_keeper(trainer: int, worker_fds: tuple[int, ...]) -> None:
    """Called in a freshly forked worker process (its own process group): fork the real worker, which
    returns from this call, while this process stays behind as its keeper and never returns."""
    me = os.getpid()
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)

    def die(signum: int, frame: object) -> None:
        kill_tree(me)
        os._exit(0)

    signal.signal(signal.SIGTERM, die)
    _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)  # the trainer dies (even by SIGKILL): clean up
    if os.getppid() != trainer:
        die(signal.SIGTERM, None)
    worker = os.fork()
    if worker == 0:  # the worker: dies with its keeper, serves the trainer
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        _prctl(_PR_SET_CHILD_SUBREAPER, 0)
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != me:
            os._exit(0)
        return
    for fd in worker_fds:  # the keeper holds no pipe end: the trainer sees EOF when the worker dies
        try:
            os.close(fd)
        except OSError:
            pass
    code = 0
    while True:  # reap orphans handed to us until the worker itself ends
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        if pid == worker:
            code = os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1
            break
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    kill_tree(me)
    os._exit(code)


def stop(keeper: int, timeout_s: float = 5.0) -> None:
    """Retire a worker: its keeper kills the whole tree and exits (SIGKILL of its group past
    ``timeout_s``); the keeper is reaped."""
    try:
        os.kill(keeper, signal.SIGTERM)
    except OSError:
        pass
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            pid, _ = os.waitpid(keeper, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == keeper:
            return
        if time.monotonic() > deadline:
            break
        time.sleep(0.002)
    for kill in (lambda: os.killpg(keeper, signal.SIGKILL), lambda: os.kill(keeper, signal.SIGKILL)):
        try:
            kill()
        except OSError:
            pass
    try:
        os.waitpid(keeper, 0)
    except ChildProcessError:
        pass
