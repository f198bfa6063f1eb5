"""Processes as the tests that kill workers see them (tests/unit/rollout/test_env_isolation.py,
test_workers_killed_from_outside.py): whether a pid runs, and waiting, bounded, for it to end."""

from __future__ import annotations

import time


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its parent counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def gone_within(pid: int, seconds: float = 20.0) -> bool:
    """Whether ``pid`` has ended within ``seconds`` (polled: an early end costs nothing)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.02)
    return not alive(pid)
