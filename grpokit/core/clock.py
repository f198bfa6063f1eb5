"""CPU seconds: the work a run did, which the machine's load changes far less than the wall clock.

    start = cpu_seconds()
    ...                                   # train; reward workers and other child processes work too
    used = cpu_seconds() - start          # user + system seconds of this process and its children

On a shared machine the wall clock of the same work follows the other jobs (a step can take twice as long
when another job wants the same core); the CPU seconds it used barely move. They count this process, its
child processes that have ended and been waited for (``os.times``), and, when psutil is installed (it comes
with TRL and accelerate), the children still running (reward workers, math-verify's pool). Without psutil a
running child's seconds count only once it has ended.
"""

from __future__ import annotations

import os


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
