"""CPU seconds: the work a run did, which the machine's load changes far less than the wall clock.

    start = cpu_seconds()
    ...                                   # train; reward workers and other child processes work too
    used = cpu_seconds() - start          # user + system seconds of this process and its children

On a shared machine the wall clock of the same work follows the other jobs (a step can take twice as long
when another job wants the same core); the CPU seconds it used barely move. They count this process, its
child processes that have ended and been waited for (``os.times``), and, when psutil is installed (it comes
with TRL and accelerate), the children still running (reward workers, math-verify's pool). Without psutil a
running child's seconds count only once it has ended.

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
from typing import Any


def cpu_seconds() -> float:
    """User + system CPU seconds used so far by this process and its child processes (module docstring)."""
    t = os.times()
    total = t.user + t.system + t.children_user + t.children_system
    try:
        import psutil
    except ImportError:
        return total
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
