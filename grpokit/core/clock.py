"""CPU seconds: the work a run did, which the machine's load changes far less than the wall clock.

    start = cpu_seconds()
    ...                                   # train; reward workers and other child processes work too
    used = cpu_seconds() - start          # user + system seconds of this process and its children

On a shared machine the wall clock of the same work follows the other jobs (a step can take twice as long
when another job wants the same core); the CPU seconds it used barely move. They count this process, its
child processes that have ended and been waited for (``os.times``), and every process still running below
it, each with the children it has itself waited for (Linux: /proc/PID/stat's utime + stime + cutime +
cstime): a reward worker (a child) and the processes it starts and reaps (math-verify's pool, a sandboxed
program: grandchildren) all count, at once. What is not counted: a process whose parent ended without
waiting for it (an orphan, re-parented outside this tree: a daemon that double-forks); and a process reaped
while a reading runs may be missed by that reading (or, where process ids wrapped, counted twice): the next
reading is right again. A reading walks the tree only: under a millisecond for a handful of processes. Without
/proc (not Linux) the children still running are read with psutil when it is installed (their own seconds,
not their reaped children's), else they count once they have ended.

A run's training steps are counted by a ``TrainingClock`` over every leg of the run: a resumed run starts
from the seconds its checkpoint recorded (trainer_state.pt), so ``train.max_cpu_seconds`` is spent once
however often the run is stopped and resumed.

    clock = TrainingClock()
    clock.carry(state)                    # resuming: the checkpoint's train_cpu_seconds, train_seconds
    clock.start()                         # the training steps begin (or begin again)
    clock.cpu(), clock.wall()             # seconds so far: the earlier legs' and this one's
    clock.stop()                          # the steps are over: the evaluation after them is not counted
    state.update(clock.state())           # what a checkpoint records
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from grpokit.core.procfs import children_by_parent


def cpu_seconds() -> float:
    """User + system CPU seconds used so far by this process and every process below it (module docstring)."""
    t = os.times()
    total = t.user + t.system + t.children_user + t.children_system
    below = _descendants_seconds()
    return total + (below if below is not None else _running_children_seconds())


_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100  # /proc's unit: clock ticks a second


def _descendants_seconds(children_of: Callable[[int], list[int]] | None = None) -> float | None:
    """Linux: the CPU seconds of every living process below this one, each with its own waited-for children's
    (/proc/PID/stat's utime + stime + cutime + cstime); None without /proc. ``children_of(pid)``: the pids of
    its children (default: the kernel's per-thread lists, /proc/PID/task/TID/children, else a scan of /proc)."""
    me = os.getpid()
    if children_of is None:
        if os.path.exists(f"/proc/{me}/task/{me}/children"):
            children_of = _task_children
        elif os.path.isdir("/proc"):
            children_of = _scanned_children()  # a kernel without CONFIG_PROC_CHILDREN
        else:
            return None
    ticks, below = 0, children_of(me)
    while below:
        pid = below.pop()
        # its children first, then its seconds: a child it reaps in between is in its cutime, and the child's
        # own stat is gone; the other way round that child would be in neither
        theirs = children_of(pid)
        own = _stat_ticks(pid)
        if own is None:  # it ended and was reaped meanwhile: its seconds are in its parent's
            continue
        ticks += own
        below += theirs
    return ticks / _TICKS


def _stat_ticks(pid: int) -> int | None:
    """utime + stime + cutime + cstime of ``pid`` in clock ticks (/proc/PID/stat fields 14-17), None once gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2 :].split()  # after "pid (comm) ": the name may hold spaces
    return sum(int(x) for x in fields[11:15])


def _task_children(pid: int) -> list[int]:
    """The children of ``pid``: each of its threads' list (the thread that forked a child lists it)."""
    out: list[int] = []
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in threads:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                out += [int(x) for x in f.read().split()]
        except OSError:
            pass
    return out


def _scanned_children() -> Callable[[int], list[int]]:
    """children_of from one scan of every /proc/PID/stat's parent id (grpokit.core.procfs)."""
    children = children_by_parent(zombies=True)
    return lambda pid: list(children.get(pid, []))


def _running_children_seconds() -> float:
    """Without /proc: the running children's own seconds through psutil (0 without it)."""
    try:
        import psutil
    except ImportError:
        return 0.0
    total = 0.0
    for child in psutil.Process().children(recursive=True):
        try:
            total += sum(child.cpu_times()[:2])
        except psutil.Error:  # it ended meanwhile (its seconds move into os.times' children once waited for)
            pass
    return total


class TrainingClock:
    """The CPU seconds (``cpu_seconds``) and wall seconds of a run's training steps, summed over its legs
    (module docstring). The seconds a kill loses (the steps after the last checkpoint, redone on resume) are
    not in it: a resumed run counts the steps its model kept, once."""

    KEYS = ("train_cpu_seconds", "train_seconds")  # what a checkpoint records (trainer_state.pt)

    def __init__(self) -> None:
        self._cpu = self._wall = 0.0  # the legs before this one, and this one's once stopped
        self._since: tuple[float, float] | None = None  # (cpu_seconds(), perf_counter()) while the steps run

    def carry(self, state: dict[str, Any]) -> None:
        """Continue from a checkpoint's trainer state: the seconds it recorded (0 in one written before they
        were recorded)."""
        self._cpu = float(state.get("train_cpu_seconds", 0.0))
        self._wall = float(state.get("train_seconds", 0.0))
        self._since = None

    def start(self) -> None:
        """The training steps begin; the seconds counted so far are kept."""
        self.stop()
        self._since = (cpu_seconds(), time.perf_counter())

    def stop(self) -> None:
        """The training steps are over: the count stays where it is until the next ``start``."""
        if self._since is not None:
            self._cpu, self._wall = self.cpu(), self.wall()
            self._since = None

    def cpu(self) -> float:
        """CPU seconds of the training steps so far, this process's and its children's, every leg's."""
        return self._cpu + (cpu_seconds() - self._since[0] if self._since is not None else 0.0)

    def wall(self) -> float:
        """Wall seconds of the training steps so far, every leg's."""
        return self._wall + (time.perf_counter() - self._since[1] if self._since is not None else 0.0)

    def state(self) -> dict[str, float]:
        """{"train_cpu_seconds", "train_seconds"}: the count now, for a checkpoint."""
        return dict(zip(self.KEYS, (self.cpu(), self.wall())))
