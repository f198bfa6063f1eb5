"""math-verify in worker processes, for `math_accuracy` (see `accuracy.py`): a few long-lived
`_math_worker.py` processes, one budget per completion for all its answers (`budget_s`), a worker that
misses its deadline replaced; one pool per process (a forked child starts its own)."""

from __future__ import annotations

import json
import math
import os
import queue
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path


class VerifierPool:
    """A few long-lived `_math_worker` processes, each answering one (gold, pred) at a time.

    Thread-safe; usable from any thread (no signals in this process). A worker that misses its
    deadline is killed and replaced, and that item counts as incorrect.
    """

    def __init__(self, workers: int | None = None):
        self.workers = workers or max(1, min(4, os.cpu_count() or 1))
        self._idle: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._live = 0
        self.timeouts = 0

    def _spawn(self) -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, "-B", str(Path(__file__).with_name("_math_worker.py"))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            bufsize=1,
        )
        if self._readline(proc, 60.0) != "@ready":
            proc.kill()
            raise RuntimeError("math-verify worker failed to start (is math-verify installed?)")
        return proc

    def warm(self, starting: Callable[[], None] | None = None) -> None:
        """Start one worker now unless one is live, so that the first answer math-verify must read does
        not wait for its start (1-2 s on an idle core, 10 s and more under load). `starting()` is
        called just before a start (RewardRunner's workers then stop the completion's budget)."""
        with self._lock:
            if self._live > 0:
                return
            self._live += 1
        if starting is not None:
            starting()
        try:
            proc = self._spawn()
        except BaseException:
            with self._lock:
                self._live -= 1
            raise
        self._idle.put(proc)

    def _checkout(self) -> subprocess.Popen:
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            pass
        with self._lock:
            spawn = self._live < self.workers
            if spawn:
                self._live += 1
        if not spawn:
            return self._idle.get()
        try:
            return self._spawn()
        except BaseException:
            with self._lock:
                self._live -= 1
            raise

    @staticmethod
    def _readline(proc: subprocess.Popen, timeout: float) -> str | None:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([proc.stdout], [], [], left)
            if ready:
                line = proc.stdout.readline()
                if not line:
                    return None
                if line.startswith("@"):
                    return line.strip()

    def verify(self, groups: list[list[tuple[str, str, tuple | None]]], timeout_s: float) -> list[bool]:
        """For each group (one completion's items), whether verify(gold, pred) holds for all its
        (gold, pred, exact) items; `exact` is None or _exact_values(): compare the other side exactly
        with those rational values. Groups run in parallel over the workers, the items of a group one
        after the other within ONE budget for the group, budget_s(timeout_s): past it the group is
        False (counted in `timeouts`) and its worker is replaced. A group stops at its first False."""
        results = [False] * len(groups)
        todo = iter(range(len(groups)))
        lock = threading.Lock()
        errors: list[BaseException] = []
        budget = budget_s(timeout_s)

        def work() -> None:
            proc = None
            try:
                while True:
                    with lock:
                        g = next(todo, None)
                    if g is None:
                        return
                    left, ok = budget, True  # time spent waiting for answers (not starting workers)
                    for gold, pred, exact in groups[g]:
                        if proc is None:
                            proc = self._checkout()
                        request = {"gold": gold, "pred": pred, "timeout_s": timeout_s, "exact": exact}
                        proc.stdin.write(json.dumps(request) + "\n")
                        proc.stdin.flush()
                        asked = time.monotonic()
                        reply = self._readline(proc, left)
                        left -= time.monotonic() - asked
                        if reply is None:  # stuck or dead: replace it
                            self.timeouts += 1
                            proc.kill()
                            proc.wait()
                            proc = None
                            with self._lock:
                                self._live -= 1
                        if reply != "@1":
                            ok = False
                            break
                    results[g] = ok
            except BaseException as e:
                errors.append(e)
            finally:
                if proc is not None:
                    self._idle.put(proc)

        threads = [threading.Thread(target=work, daemon=True) for _ in range(min(self.workers, len(groups)))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return results


def budget_s(timeout_s: float) -> float:
    """math-verify's time for one completion, all its answers together (gold parse + pred parse + verify)."""
    return 2 * max(1, math.ceil(timeout_s)) + 2.0


_POOL: VerifierPool | None = None
_POOL_LOCK = threading.Lock()
_POOL_WORKERS: int | None = None  # None: VerifierPool's default; 1 in a forked child


def shared_pool() -> VerifierPool:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = VerifierPool(_POOL_WORKERS)
        return _POOL


def _forget_pool_in_child() -> None:
    """A forked child (the reward runner's workers) starts its own math-verify workers: sharing the
    parent's pipes would interleave two processes' requests and replies. One: the runner already
    spreads completions over its workers, and its warm_up starts one (a second would start, cold,
    inside a completion's budget)."""
    global _POOL, _POOL_LOCK, _POOL_WORKERS
    _POOL, _POOL_LOCK, _POOL_WORKERS = None, threading.Lock(), 1


os.register_at_fork(after_in_child=_forget_pool_in_child)


def warm_up(starting: Callable[[], None]) -> None:
    """math_accuracy's warm_up hook (see grpokit.scoring._workers): this process's math-verify worker
    started before a completion's budget runs; a no-op once one is live."""
    shared_pool().warm(starting)
