"""The process tree as Linux's /proc shows it: one scan of every ``/proc/PID/stat``, read by the CPU-seconds
clock (grpokit.core.clock, where the kernel keeps no per-thread children lists) and by the reward workers'
keeper (grpokit.rewards._keeper, which kills every descendant).

    children = children_by_parent(zombies=False)    # {parent pid: [child pid, ...]}; {} without /proc
"""

from __future__ import annotations

import os


def children_by_parent(zombies: bool = True) -> dict[int, list[int]]:
    """Every process's parent id (/proc/PID/stat field 4), grouped: {ppid: [pid, ...]}; ``zombies=False`` leaves
    out the processes that have ended and wait to be reaped (state Z). Empty where there is no /proc."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return children
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # it ended meanwhile
            continue
        # after "pid (comm) ", whose comm may hold spaces: state, ppid, ...
        fields = stat[stat.rindex(b")") + 2 :].split()
        if zombies or fields[0] != b"Z":
            children.setdefault(int(fields[1]), []).append(int(entry))
    return children
