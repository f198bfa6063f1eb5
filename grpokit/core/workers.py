"""A forked worker process that runs the user's code (reward functions, tools) apart from the trainer, and
``WorkerPool``: the lifecycle of the workers one owner holds (the tool runner's, the environments').

One fork recipe for both (``grpokit.rewards._workers`` and ``grpokit.rollout.tools.runner``): the child is in its
own process group (``killpg`` reaches whatever it starts; Ctrl-C at the terminal does not), dies with its
parent (``PR_SET_PDEATHSIG``), has default signal handlers, closes the parent-side pipe ends of the other
live workers, and then serves requests on a pipe pair until the parent closes it. The standard library's
multiprocessing is not used because it neither puts a child in its own group nor ties its life to the
parent, and its pickling of the target would re-import user modules in a spawn start.

One frame format on those pipes for every worker (reward workers, tool and environment workers, the async
sampler): the pickled object's length (``FRAME_HEADER``, 8 bytes little-endian), then the pickle.

    write_frame(fd, obj, deadline=None)   # TimeoutError when the reader has not taken it by the deadline
    obj = read_frame(fd, deadline=None)   # None at end of file; TimeoutError past the deadline

A SIGTERM or SIGINT sent from outside to a worker that runs the user's code (a tool or environment worker,
grpokit.rollout.tools.runner) asks the run to stop, as one sent to the trainer does: the process that owns the
worker hands it to its stop listener, which the trainer's StopOnSignals (grpokit.run.state) sets, and the
asynchronous sampler's process (grpokit.collect.process: through its board, to the trainer):

    previous = listen_for_stops(lambda name, where, pid: ...)   # while a run's signals are handled
    stop_signalled("SIGTERM", "sent to tool worker 123 (keeper 122)", 123)   # True: a listener took it
"""

from __future__ import annotations

import ctypes
import os
import pickle
import select
import signal
import struct
import threading
import time
import warnings
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol, TypeVar

PR_SET_PDEATHSIG = 1

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
"""The signals that ask a run to stop, sent to the trainer or to any of its workers (grpokit.run.state)."""

_stop_listener: list = [None]  # this process's StopListener (listen_for_stops)


StopListener = Callable[[str, str, int], None]


def listen_for_stops(listener: StopListener | None) -> StopListener | None:
    """Set this process's listener for a stop signal (STOP_SIGNALS) that one of its workers got from outside:
    ``listener(name, where, pid)`` ("SIGTERM", "sent to tool worker 123 (keeper 122)", 123), called from the thread
    that found the worker gone; returns the listener it replaces (to put back). None: none (the worker is then
    replaced, with a line). A forked worker starts with none."""
    previous, _stop_listener[0] = _stop_listener[0], listener
    return previous


def stop_signalled(name: str, where: str, pid: int) -> bool:
    """Hand a worker's stop signal to this process's listener (``listen_for_stops``); False when there is none."""
    listener = _stop_listener[0]
    if listener is None:
        return False
    listener(name, where, pid)
    return True


FRAME_HEADER = struct.Struct("<Q")
"""A frame on a worker's pipe: its pickle's length, then the pickle."""


def frame(obj: object) -> bytes:
    """``obj`` as one frame: its pickle's length (FRAME_HEADER), then the pickle."""
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return FRAME_HEADER.pack(len(data)) + data


def write_all(fd: int, data: bytes, deadline: float | None = None) -> None:
    """All of ``data`` to ``fd``; TimeoutError when the reader has not taken it by the (monotonic) deadline
    (None: wait as long as it takes)."""
    view = memoryview(data)
    while view:
        if deadline is not None:
            wait = deadline - time.monotonic()
            if wait <= 0 or not select.select([], [fd], [], wait)[1]:
                raise TimeoutError
            view = view[os.write(fd, view[: 1 << 16]) :]  # a pipe's buffer: a write this size cannot block long
        else:
            view = view[os.write(fd, view) :]


def write_frame(fd: int, obj: object, deadline: float | None = None) -> None:
    """``obj`` as one frame to ``fd`` (see write_all for the deadline)."""
    write_all(fd, frame(obj), deadline)


def read_exact(fd: int, n: int, deadline: float | None = None) -> bytes | None:
    """``n`` bytes from ``fd``; None at end of file; TimeoutError past the (monotonic) deadline (None: none)."""
    chunks, left = [], n
    while left:
        if deadline is not None:
            wait = deadline - time.monotonic()
            if wait <= 0 or not select.select([fd], [], [], wait)[0]:
                raise TimeoutError
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_frame(fd: int, deadline: float | None = None) -> object | None:
    """The next frame's object from ``fd``; None at end of file (the writer closed or died)."""
    header = read_exact(fd, FRAME_HEADER.size, deadline)
    if header is None:
        return None
    body = read_exact(fd, FRAME_HEADER.unpack(header)[0], deadline)
    return None if body is None else pickle.loads(body)


def fork_worker(
    serve: Callable[[int, int, int], None], close_in_child: Iterable[int]
) -> tuple[int, int, int]:
    """Fork a worker; returns (pid, to_child, from_child), the parent's ends of its request and reply pipes.

    In the child, ``serve(parent_pid, requests_fd, replies_fd)`` runs, then the child exits: 0 when serve
    returned, 1 when it raised (the parent sees the closed pipe). close_in_child: the parent-side pipe ends
    of other workers, which the child must not hold open."""
    req_r, req_w = os.pipe()
    rep_r, rep_w = os.pipe()
    parent = os.getpid()
    inherited = tuple(close_in_child)
    with warnings.catch_warnings():  # Python >= 3.12 warns on fork with threads (torch has some): the
        # child runs only the user's code, never the trainer's threads' work
        warnings.filterwarnings("ignore", message=".*fork", category=DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: never returns
        status = 0
        try:
            _stop_listener[0] = None  # the parent's listener is the parent's: a worker stops no run itself
            os.setpgid(0, 0)
            try:
                ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            except (OSError, AttributeError):
                pass
            if os.getppid() != parent:  # the parent died before the death signal was armed
                os._exit(0)
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE):
                signal.signal(sig, signal.SIG_DFL)
            for fd in (*inherited, req_w, rep_r):
                try:
                    os.close(fd)
                except OSError:
                    pass
            serve(parent, req_r, rep_w)
        except BaseException:  # noqa: BLE001 - the parent sees the closed pipe and reports it
            status = 1
        finally:
            os._exit(status)
    try:
        os.setpgid(pid, pid)  # also here, so killpg works even before the child has run
    except OSError:
        pass
    os.close(req_r)
    os.close(rep_w)
    return pid, req_w, rep_r


class Killable(Protocol):
    def kill(self) -> None: ...


W = TypeVar("W", bound=Killable)


class WorkerPool:
    """The worker processes one owner holds (grpokit.rollout.tools.runner.ToolRunner's,
    grpokit.rollout.envs.EnvPool's), composed into it: ``spawn(make)`` forks one (``make()`` returns an object with ``kill()``) and keeps it,
    ``retire(worker)`` kills it and lets it go, ``close()`` kills every one kept, and runs when the pool is
    collected.

    The forks come from one long-lived thread of the pool's: PR_SET_PDEATHSIG fires when the *thread* that
    forked a child exits, and the callers may be short-lived threads (the multi-turn engine's). Only the
    process that made the pool closes it: a fork of that process (a worker itself) inherits the object and
    must not kill its parent's workers."""

    def __init__(self, name: str):
        self._lock = threading.Lock()
        self._live: list = []
        self._spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"grpokit-{name}")
        self.owner = os.getpid()

    @property
    def live(self) -> list:
        """The workers kept now (a copy)."""
        with self._lock:
            return list(self._live)

    def spawn(self, make: Callable[[], W]) -> W:
        """``make()`` run on the pool's forking thread; its worker is kept until retired or closed."""
        worker = self._spawner.submit(make).result()
        with self._lock:
            self._live.append(worker)
        return worker

    def retire(self, worker: Killable) -> None:
        """Kill ``worker`` and stop keeping it."""
        worker.kill()
        with self._lock:
            if worker in self._live:
                self._live.remove(worker)

    def close(self) -> None:
        """Kill every worker kept and stop the forking thread (in the owning process only)."""
        if os.getpid() != self.owner:
            return
        with self._lock:
            live, self._live = self._live, []
        for worker in live:
            worker.kill()
        self._spawner.shutdown(wait=False)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


class OutputTail:
    """In a worker: its stdout and stderr (file descriptors 1 and 2, and sys.stdout/sys.stderr) go into a pipe
    that a thread drains, keeping the last ``keep_bytes``; nothing the worker's code prints reaches the
    trainer's streams. ``take()`` returns what was printed since the last take (its last ``keep_bytes``)."""

    MARK = b"\0grpokit-output-mark\0"

    def __init__(self, keep_bytes: int = 4000):
        import sys
        import threading

        self.keep = keep_bytes
        self._buffer = bytearray()
        self._lock = threading.Lock()
        self._marked = threading.Event()
        read_end, write_end = os.pipe()
        for std in (1, 2):
            os.dup2(write_end, std)
        os.close(write_end)
        stream = open(1, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
        sys.stdout = sys.stderr = stream
        self._stream = stream
        threading.Thread(target=self._drain, args=(read_end,), daemon=True).start()

    def _drain(self, fd: int) -> None:
        pending = b""
        while chunk := os.read(fd, 1 << 16):
            pending += chunk
            at = pending.find(self.MARK)
            with self._lock:
                self._buffer += pending[: at if at >= 0 else max(0, len(pending) - len(self.MARK))]
                del self._buffer[: max(0, len(self._buffer) - self.keep)]
            if at >= 0:
                pending = pending[at + len(self.MARK) :]
                self._marked.set()
            else:
                pending = pending[max(0, len(pending) - len(self.MARK)) :]

    def take(self, wait_s: float = 1.0) -> str:
        try:
            self._stream.flush()
            self._marked.clear()
            os.write(1, self.MARK)
            self._marked.wait(wait_s)
        except (OSError, ValueError):  # the code closed its stdout: what was drained so far
            pass
        with self._lock:
            text, self._buffer = bytes(self._buffer).decode("utf-8", "replace"), bytearray()
        return text


def limit_address_space(extra_mb: float) -> None:
    """In a worker: cap its address space (soft RLIMIT_AS) at ``extra_mb`` MiB above its size now, so that a
    runaway allocation raises MemoryError there instead of taking the machine's memory. A forked worker
    starts with the trainer's mappings, hence relative to now."""
    import resource

    with open("/proc/self/statm") as f:
        size = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = size + int(extra_mb * (1 << 20))
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def resident_bytes() -> int:
    """This process's resident memory (RSS) in bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
