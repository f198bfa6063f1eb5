"""Running tool calls: each in a forked worker process with a time budget, so that a tool that raises,
hangs, exits, or returns megabytes becomes an error message (or a cut result) for the model and the run
goes on. Workers are forked once and reused; one that overruns its budget is SIGKILLed with its process
group and replaced. ``ToolRunner.call`` is thread-safe: calls from several threads run in parallel on up
to ``workers`` processes (the multi-turn engine steps its episodes' environments in threads).

Not a sandbox: tools are the user's own trusted code. Model-written code runs in the python tool
(grpokit.rollout.tools.python), which adds grpokit.rewards.sandbox's isolation around it.
"""

from __future__ import annotations

import json
import os
import pickle
import queue
import select
import signal
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from grpokit.core.workers import fork_worker
from grpokit.rollout.tools.parsers import ToolCall
from grpokit.rollout.tools.spec import Tool, check_arguments

_HEADER = struct.Struct("<Q")
_PARENT_FDS: set[int] = set()  # parent-side pipe ends of all live workers: a new child closes them


@dataclass
class ToolResult:
    """What the model reads back from one call, and how the call went."""

    content: str
    error: bool = False  # the call failed (unknown tool, bad arguments, the tool raised or died, timeout)
    timed_out: bool = False
    seconds: float = 0.0


def as_text(value: object, max_chars: int) -> str:
    """The tool's return value as the model reads it: a str as is, else JSON (str() if not JSON-able),
    cut to ``max_chars`` with a note saying how much was left out."""
    if isinstance(value, str):
        text = value
    else:
        try:
            text = json.dumps(value)
        except (TypeError, ValueError, RecursionError):
            text = str(value)
    if len(text) > max_chars:
        text = text[:max_chars] + f"... [cut: {len(text) - max_chars} more characters]"
    return text


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes | None:
    """n bytes from fd before the (monotonic) deadline, None = no deadline; None at EOF; TimeoutError past it."""
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


def _write_frame(fd: int, obj: object) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]


def _serve(tools: dict[str, Tool], requests: int, replies: int, max_chars: int) -> None:
    """The worker's loop: (name, arguments) in, ("ok" | "error", text) out."""
    while True:
        header = _read_exact(requests, _HEADER.size, None)
        if header is None:
            return
        name, arguments = pickle.loads(_read_exact(requests, _HEADER.unpack(header)[0], None))
        try:
            reply = ("ok", as_text(tools[name].fn(**arguments), max_chars))
        except BaseException as e:  # noqa: BLE001 - SystemExit and all: the model reads what went wrong
            reply = ("error", as_text(f"{type(e).__name__}: {e}", max_chars))
        _write_frame(replies, reply)


class _Worker:
    """One forked worker and its pipes (parent side)."""

    def __init__(self, tools: dict[str, Tool], max_chars: int):
        def serve(parent: int, requests: int, replies: int) -> None:
            _serve(tools, requests, replies, max_chars)

        self.pid, self.to_child, self.from_child = fork_worker(serve, _PARENT_FDS)
        _PARENT_FDS.update((self.to_child, self.from_child))

    def call(self, name: str, arguments: dict, timeout_s: float) -> tuple[str, str] | None:
        """The reply, None when the worker died; TimeoutError past ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        try:
            _write_frame(self.to_child, (name, arguments))
        except (BrokenPipeError, OSError):
            return None
        header = _read_exact(self.from_child, _HEADER.size, deadline)
        if header is None:
            return None
        body = _read_exact(self.from_child, _HEADER.unpack(header)[0], deadline)
        return None if body is None else pickle.loads(body)

    def kill(self) -> None:
        """SIGKILL the worker's process group, reap it, close its pipes."""
        for target in (
            lambda: os.killpg(self.pid, signal.SIGKILL),
            lambda: os.kill(self.pid, signal.SIGKILL),
        ):
            try:
                target()
            except OSError:
                pass
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass
        for fd in (self.to_child, self.from_child):
            _PARENT_FDS.discard(fd)
            try:
                os.close(fd)
            except OSError:
                pass


class ToolRunner:
    """Runs :class:`ToolCall` s on forked workers, each call within ``timeout_s`` seconds.

    max_result_chars: a result longer than this is cut (with a note); the python tool's output too.
    workers: processes, i.e. calls that run at the same time. Counters (calls, errors, timeouts,
    seconds) add up over the runner's life; the engine reads their change over a rollout."""

    def __init__(
        self, tools: list[Tool], *, timeout_s: float = 10.0, max_result_chars: int = 2000, workers: int = 2
    ):
        if timeout_s <= 0 or max_result_chars < 1 or workers < 1:
            raise ValueError("timeout_s must be > 0, max_result_chars and workers >= 1")
        self.tools = {t.name: t for t in tools}
        self.timeout_s, self.max_chars = timeout_s, max_result_chars
        self._idle: queue.SimpleQueue[_Worker | None] = queue.SimpleQueue()
        for _ in range(workers):
            self._idle.put(None)  # started on first use
        self._lock = threading.Lock()
        self._all: list[_Worker] = []
        # Workers are forked from this one long-lived thread: PR_SET_PDEATHSIG fires when the *thread* that
        # forked a child exits, and calls come from the engine's short-lived step threads.
        self._spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grpokit-tools")
        self.owner = os.getpid()
        self.counts = {"calls": 0, "errors": 0, "timeouts": 0, "seconds": 0.0}

    def _count(self, result: ToolResult) -> ToolResult:
        with self._lock:
            self.counts["calls"] += 1
            self.counts["errors"] += int(result.error)
            self.counts["timeouts"] += int(result.timed_out)
            self.counts["seconds"] += result.seconds
        return result

    def call(self, call: ToolCall) -> ToolResult:
        """Run one call; never raises for anything the model or the tool does."""
        t0 = time.perf_counter()
        if call.error is not None:
            return self._count(ToolResult(f"Error: {call.error}", error=True))
        tool = self.tools.get(call.name)
        if tool is None:
            return self._count(
                ToolResult(
                    f"Error: there is no tool {call.name!r:.60}; the tools are {sorted(self.tools)}",
                    error=True,
                )
            )
        problem = check_arguments(tool, call.arguments)
        if problem:
            return self._count(ToolResult(f"Error: {problem}", error=True))
        worker = self._idle.get()
        if worker is None:
            worker = self._spawner.submit(_Worker, self.tools, self.max_chars).result()
            with self._lock:
                self._all.append(worker)
        try:
            reply = worker.call(tool.name, call.arguments, self.timeout_s)
        except TimeoutError:
            self._retire(worker)
            seconds = time.perf_counter() - t0
            return self._count(
                ToolResult(
                    f"Error: {tool.name} did not finish within {self.timeout_s:g} s", True, True, seconds
                )
            )
        except Exception as e:  # noqa: BLE001 - an unpicklable reply or a broken pipe: replace the worker
            self._retire(worker)
            return self._count(
                ToolResult(
                    f"Error: {tool.name} failed ({type(e).__name__})", True, False, time.perf_counter() - t0
                )
            )
        seconds = time.perf_counter() - t0
        if reply is None:
            self._retire(worker)
            return self._count(
                ToolResult(f"Error: {tool.name} crashed (its process exited)", True, False, seconds)
            )
        self._idle.put(worker)
        status, text = reply
        return self._count(
            ToolResult(text if status == "ok" else f"Error: {text}", status != "ok", False, seconds)
        )

    def _retire(self, worker: _Worker) -> None:
        worker.kill()
        with self._lock:
            if worker in self._all:
                self._all.remove(worker)
        self._idle.put(None)  # a fresh worker is forked for the next call

    def close(self) -> None:
        """Kill every worker (call when done; also run at exit of the owning process)."""
        if os.getpid() != self.owner:
            return
        with self._lock:
            workers, self._all = self._all, []
        for w in workers:
            w.kill()
        self._spawner.shutdown(wait=False)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
