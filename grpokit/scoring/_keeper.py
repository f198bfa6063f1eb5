"""A keeper process above each reward worker, so that nothing a reward function starts outlives the trainer.

    trainer ── keeper (child subreaper, its own process group) ── worker (runs the reward functions)
                                                                     └─ whatever they start, at any depth

The worker's process group alone is not enough: a SIGKILLed trainer takes only the worker with it
(PR_SET_PDEATHSIG), and a child started in its own session (``start_new_session=True``, a daemon's
double fork) leaves the group. The keeper is the worker's parent and a child subreaper
(PR_SET_CHILD_SUBREAPER), so every orphaned descendant becomes its child instead of init's; it kills
the whole tree (every descendant, found in /proc, until none is left) when the trainer dies (its
death signal is RETIRE, caught), when the trainer retires the worker (``stop``: RETIRE), or when the
worker ends. Linux only, like the workers' fork; elsewhere the keeper still kills its process group.

grpokit retires a worker with a signal of its own, ``RETIRE`` (SIGUSR1), never SIGTERM, so that a signal
sent from outside is told apart: the keeper's end mirrors it. A SIGTERM, SIGINT, SIGHUP or SIGQUIT sent to
the keeper kills the tree, then the keeper itself by that signal; a worker that ends by a signal (sent to it,
the OOM killer's SIGKILL, a crash) has its keeper end by the same signal, once the tree is killed. So the
keeper's wait status is how the worker ended, and ``stop`` returns it when the keeper ended before grpokit
retired it (grpokit.rollout.tools.runner reads it: a worker stopped from outside).
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import time

from grpokit.core.procfs import children_by_parent

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36

RETIRE = signal.SIGUSR1
"""grpokit's own signal to a keeper: retire its worker (kill the tree, exit 0); also its death signal."""
OUTSIDE = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
"""Signals a keeper catches when they come from outside: it kills the tree, then ends by the same signal."""


def _prctl(option: int, value: int) -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def descendants(root: int) -> list[int]:
    """Every process below ``root`` (children, their children, ...), read from /proc (empty without it), zombies
    included: a worker whose main thread has ended shows as a zombie while its other threads exit, and until they
    have, what it started is still its child (reparented to the keeper only then): left out, it would be missed."""
    children = children_by_parent(zombies=True)
    out, todo = [], [root]
    while todo:
        for pid in children.get(todo.pop(), []):
            out.append(pid)
            todo.append(pid)
    return out


def kill_tree(root: int, timeout_s: float = 5.0) -> None:
    """SIGKILL every descendant of ``root`` (this process, a subreaper: orphans come back to it as
    children and are reaped here) and ``root``'s process group, until none is left, not even a zombie (one still
    holding children, see ``descendants``), or the time is up."""
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


def _end_as(status: int) -> None:
    """End this process as a child that ended with wait status ``status`` did: killed by the same signal (no core
    file: a keeper is a fork of the trainer, as large), or exiting with its code."""
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        for step in (
            lambda: resource.setrlimit(resource.RLIMIT_CORE, (0, 0)),
            lambda: signal.signal(signum, signal.SIG_DFL),  # (refused for SIGKILL, whose action is fixed)
            lambda: signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum}),
            lambda: os.kill(os.getpid(), signum),
        ):
            try:
                step()
            except (OSError, ValueError):
                pass
        os._exit(128 + signum)  # a signal whose default is not to end (never a termination signal)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


def _signalled_status(signum: int) -> int:
    """The wait status of a process killed by ``signum``."""
    return signum & 0x7F


def become_keeper(trainer: int, worker_fds: tuple[int, ...]) -> None:
    """Called in a freshly forked worker process (its own process group): fork the real worker, which
    returns from this call, while this process stays behind as its keeper and never returns."""
    me = os.getpid()
    caught = (RETIRE, *OUTSIDE)
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    worker = 0  # (its pid once forked)

    def ignore_more() -> None:
        for signum in caught:
            signal.signal(signum, signal.SIG_IGN)

    def retire(signum: int, frame: object) -> None:
        ignore_more()
        ended = None  # the worker ended before the retirement (a signal from outside): end as it did
        if worker:
            try:
                pid, status = os.waitpid(worker, os.WNOHANG)
                ended = status if pid == worker and os.WIFSIGNALED(status) else None
            except ChildProcessError:
                pass
        kill_tree(me)
        _end_as(ended) if ended is not None else os._exit(0)

    def from_outside(signum: int, frame: object) -> None:
        ignore_more()
        kill_tree(me)
        _end_as(_signalled_status(signum))

    signal.pthread_sigmask(signal.SIG_BLOCK, caught)  # none handled half-set, nor by the worker's copy
    signal.signal(RETIRE, retire)
    for signum in OUTSIDE:
        signal.signal(signum, from_outside)
    _prctl(_PR_SET_PDEATHSIG, RETIRE)  # the trainer dies (even by SIGKILL): clean up
    if os.getppid() != trainer:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, caught)
        retire(RETIRE, None)
    worker = os.fork()
    if worker == 0:  # the worker: dies with its keeper, serves the trainer
        for signum in caught:
            signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, caught)
        _prctl(_PR_SET_CHILD_SUBREAPER, 0)
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != me:
            os._exit(0)
        return
    signal.pthread_sigmask(signal.SIG_UNBLOCK, caught)
    for fd in worker_fds:  # the keeper holds no pipe end: the trainer sees EOF when the worker dies
        try:
            os.close(fd)
        except OSError:
            pass
    status = 1 << 8  # (exit 1)
    while True:  # reap orphans handed to us until the worker itself ends
        try:
            pid, child_status = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        if pid == worker:
            status = child_status
            break
    ignore_more()
    kill_tree(me)
    _end_as(status)


def stop(keeper: int, timeout_s: float = 5.0) -> int | None:
    """Retire a worker: its keeper kills the whole tree and exits (SIGKILL of its group past ``timeout_s``); the
    keeper is reaped. Returns its wait status when it had ended by itself, or ended as its worker had (a signal
    from outside, see the module docstring): then not 0; 0 when the retirement ended it; None when it had to be
    killed here or was reaped already."""
    try:
        os.kill(keeper, RETIRE)
    except OSError:
        pass
    done, status = _reap_within(keeper, timeout_s)
    if done:
        return status
    for kill in (lambda: os.killpg(keeper, signal.SIGKILL), lambda: os.kill(keeper, signal.SIGKILL)):
        try:
            kill()
        except OSError:
            pass
    try:
        os.waitpid(keeper, 0)
    except ChildProcessError:
        pass
    return None


def ended(keeper: int, wait_s: float) -> int | None:
    """The wait status of a keeper whose worker has gone (its pipe closed), waited for up to ``wait_s`` (it ends
    within milliseconds once the tree is killed) and reaped; None when it still runs then (the worker closed its
    pipe but lives: retire it with ``stop``)."""
    return _reap_within(keeper, wait_s)[1]


def _reap_within(keeper: int, wait_s: float) -> tuple[bool, int | None]:
    """(done, status): the keeper reaped within ``wait_s`` with its wait status, or reaped elsewhere already (done,
    None); (False, None) when it still runs then."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            pid, status = os.waitpid(keeper, os.WNOHANG)
        except ChildProcessError:
            return True, None
        if pid == keeper:
            return True, status
        if time.monotonic() > deadline:
            return False, None
        time.sleep(0.002)
