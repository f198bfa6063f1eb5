"""Running tool calls: each in a forked worker process with a time budget, so that a tool that raises,
hangs, exits, or returns megabytes becomes an error message (or a cut result) for the model and the run
goes on. Workers are forked once and reused; one that overruns its budget is killed with everything it
started and replaced. ``ToolRunner.call`` is thread-safe: calls from several threads run in parallel on up
to ``workers`` processes (the multi-turn engine steps its episodes' environments in threads).

Each worker has a keeper above it, as a reward worker has (grpokit.rewards._keeper): a child subreaper
that kills every process below it, at any depth, when the worker is retired or ends, and when the process
that forked it dies (even by SIGKILL), so nothing a tool or an environment starts (a server, a daemon in
its own session) outlives the run.

A worker killed from outside grpokit (grpokit retires its workers with a signal of its own: grpokit.scoring._keeper)
is never passed over in silence. Its keeper ends as it did, and ``Worker.lost`` reads how: a SIGTERM or SIGINT
sent to it asks the run to stop after its step, as one sent to the trainer does (``Worker.report``: the process's
stop listener, grpokit.core.workers); any other signal (the OOM killer's or a tool's own SIGKILL, a crash) is a
line on stderr naming the worker, its pid and the signal. Either way the call fails (the model reads why) and a
fresh worker serves the next one.

Not a sandbox: tools are the user's own trusted code. Model-written code runs in the python tool
(grpokit.rollout.tools.python), which adds grpokit.rewards.sandbox's isolation around it.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from grpokit.core.chat_text import clean_text, cut_text
from grpokit.core.workers import (
    STOP_SIGNALS,
    OutputTail,
    WorkerPool,
    fork_worker,
    limit_address_space,
    read_frame,
    resident_bytes,
    stop_signalled,
    write_frame,
)
from grpokit.rollout.tools.parsers import ToolCall
from grpokit.rollout.tools.results import Stopped
from grpokit.rollout.tools.spec import Tool, check_arguments, echo
from grpokit.scoring._keeper import RETIRE, become_keeper, ended
from grpokit.scoring._keeper import stop as stop_keeper

_PARENT_FDS: set[int] = set()  # parent-side pipe ends of all live workers: a new child closes them
ENDED_WAIT_S = 10.0  # a worker's pipe closed: the time its keeper gets to end (ms when the worker died)


@dataclass
class ToolResult:
    """What the model reads back from one call, and how the call went."""

    content: str
    error: bool = False  # the call failed (unknown tool, bad arguments, the tool raised or died, timeout)
    timed_out: bool = (
        False  # stopped by a clock: the call's, the tool's own (Stopped) or the episode's budget
    )
    seconds: float = 0.0
    over_budget: bool = False  # stopped (or not started) because the episode's or the step's time ran out
    printed: str = ""  # what the tool printed (its last max_result_chars), kept from the trainer's streams


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
    return cut_text(clean_text(text), max_chars)


def awaited(value: object) -> object:
    """``value``, or what it gives when it is a coroutine (an ``async def`` tool's call), run to its end here."""
    return asyncio.run(value) if inspect.iscoroutine(value) else value


def _serve(
    tools: dict[str, Tool], max_chars: int, memory_mb: float | None, requests: int, replies: int
) -> None:
    """The worker's loop: (name, arguments) in, (status, text, printed, grown) out, status "ok" | "error" |
    "timeout"; printed: what the tool printed (never shown to the trainer's streams); grown: the bytes its
    resident memory grew by since the worker started."""
    output = OutputTail(max_chars)
    if memory_mb:
        limit_address_space(memory_mb)
    start = resident_bytes()
    while True:
        request = read_frame(requests)
        if request is None:
            return
        name, arguments = request
        try:
            value = awaited(tools[name].fn(**arguments))  # an async def tool (TRL takes them): its result
            reply = ("timeout" if isinstance(value, Stopped) else "ok", as_text(value, max_chars))
        except BaseException as e:  # noqa: BLE001 - SystemExit and all: the model reads what went wrong
            try:
                reply = ("error", as_text(f"{type(e).__name__}: {e}", max_chars))
            except BaseException:  # noqa: BLE001 - str(e) itself raised
                reply = ("error", type(e).__name__)
        write_frame(replies, (*reply, output.take(), resident_bytes() - start))


class Worker:
    """One forked worker and its pipes (parent side): ``serve(requests_fd, replies_fd)`` runs in the child
    (the tool runner's, or an environment's: grpokit.rollout.envs), reading pickled requests, writing replies.
    ``pid`` is its keeper's (the forked process, which forks the worker and stays above it; see the module
    docstring); ``worker_pid`` the worker's own, which it sends first (known from the first call on). ``kind``
    names it in lines ("tool worker", "environment worker")."""

    def __init__(self, serve: Callable[[int, int], None], kind: str = "tool worker"):
        def keep_and_serve(parent: int, requests: int, replies: int) -> None:
            become_keeper(parent, (requests, replies))  # this process stays as the keeper; its child serves
            write_frame(replies, os.getpid())  # who serves: named when it is killed
            serve(requests, replies)

        self.pid, self.to_child, self.from_child = fork_worker(keep_and_serve, _PARENT_FDS)
        _PARENT_FDS.update((self.to_child, self.from_child))
        self.kind = kind
        self.worker_pid: int | None = None
        self.killed = False
        self.lost_to: int | None = None  # the signal that killed it, not sent by grpokit (``lost``, ``kill``)
        self._reported = False

    @property
    def name(self) -> str:
        """As "tool worker 123 (keeper 122)": both processes, for a user may have signalled either."""
        own = f" {self.worker_pid}" if self.worker_pid is not None else ""
        return f"{self.kind}{own} (keeper {self.pid})"

    def call(self, name: str, arguments: object, timeout_s: float) -> object | None:
        """The reply to the request (name, arguments), None when the worker died (then ``lost`` says how);
        TimeoutError past ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        try:
            write_frame(self.to_child, (name, arguments), deadline)
        except (BrokenPipeError, OSError):
            return None
        if self.worker_pid is None:
            hello = read_frame(self.from_child, deadline)
            if hello is None:
                return None
            self.worker_pid = hello
        return read_frame(self.from_child, deadline)

    def lost(self) -> int | None:
        """A call got no reply (the worker's pipe closed): its keeper is waited for (it ends as the worker did,
        within milliseconds; at most ENDED_WAIT_S, past which the worker, which closed its pipe but lives, is
        retired) and reaped, the pipes closed. Returns the signal that killed the worker from outside grpokit (a
        SIGTERM sent to it or its keeper, a SIGKILL, a crash's SIGSEGV), or None (it exited)."""
        if not self.killed:
            status = ended(self.pid, ENDED_WAIT_S)
            if status is None:
                self.kill()
            else:
                self._forget(status)
        return self.lost_to

    def report(self, consequence: str) -> bool:
        """Say once that the worker was killed from outside grpokit (``lost_to``): a SIGTERM or SIGINT goes to this
        process's stop listener (grpokit.core.workers.stop_signalled: the run stops after its step; True); another
        signal, or a stop signal with no listener, is a line on stderr naming the worker, its pid and the signal,
        then ``consequence`` (what happens now). False when nothing was to be said or the run goes on."""
        if self.lost_to is None or self._reported:
            return False
        self._reported = True
        name = signal.Signals(self.lost_to).name
        pid = self.worker_pid if self.worker_pid is not None else self.pid
        if self.lost_to in STOP_SIGNALS and stop_signalled(name, f"sent to {self.name}", pid):
            return True
        line = f"grpokit: {self.name} was killed by {name}, not by grpokit; {consequence}"
        print(line, file=sys.stderr, flush=True)
        return False

    def signal_stop(self) -> None:
        """Ask the keeper to kill the worker's tree without waiting (``kill`` waits): stopping many workers,
        signal them all first, so that their keepers work at the same time."""
        if not self.killed:
            try:
                os.kill(self.pid, RETIRE)
            except OSError:
                pass

    def kill(self) -> None:
        """Stop the worker and everything it started, at any depth (its keeper kills the tree), reap the
        keeper, close the pipes; once (a second call does nothing: its pipes' numbers may belong to other
        files by then). A worker found killed from outside before (``lost_to``) is reported (``report``)."""
        if self.killed:
            return
        self._forget(stop_keeper(self.pid))
        self.report("it had ended before grpokit retired it")

    def _forget(self, status: int | None) -> None:
        """The keeper reaped with wait ``status`` (None: killed here): how the worker ended kept, the pipes closed."""
        self.killed = True
        if status is not None and os.WIFSIGNALED(status):
            self.lost_to = os.WTERMSIG(status)
        for fd in (self.to_child, self.from_child):
            _PARENT_FDS.discard(fd)
            try:
                os.close(fd)
            except OSError:
                pass


def stop_workers(workers: list) -> None:
    """Stop several workers at once: each keeper is signalled, then each is reaped (``Worker.kill``)."""
    for worker in workers:
        worker.signal_stop()
    for worker in workers:
        worker.kill()


class ToolRunner:
    """Runs :class:`ToolCall` s on forked workers, each call within ``timeout_s`` seconds.

    max_result_chars: a result longer than this is cut (with a note); the python tool's output too.
    workers: processes, i.e. calls that run at the same time. memory_mb: a worker's address space is capped
    at this many MiB above its start (a call past it gets MemoryError), and a worker whose resident memory
    grew by more than half of it (a leaking tool) is replaced after the call (None: neither). What a tool prints is kept
    from the trainer's streams (ToolResult.printed). Counters (calls, errors, timeouts, seconds, recycled
    workers) add up over the runner's life."""

    def __init__(
        self,
        tools: list[Tool],
        *,
        timeout_s: float = 10.0,
        max_result_chars: int = 2000,
        workers: int = 2,
        memory_mb: float | None = 2048,
    ):
        if (
            timeout_s <= 0
            or max_result_chars < 1
            or workers < 1
            or (memory_mb is not None and memory_mb <= 0)
        ):
            raise ValueError("timeout_s and memory_mb must be > 0, max_result_chars and workers >= 1")
        self.tools = {t.name: t for t in tools}
        self.timeout_s, self.max_chars, self.memory_mb = timeout_s, max_result_chars, memory_mb
        self._idle: queue.SimpleQueue[Worker | None] = queue.SimpleQueue()
        for _ in range(workers):
            self._idle.put(None)  # started on first use
        self._lock = threading.Lock()  # the counters
        self.workers = WorkerPool("tools")  # forked on its own thread (calls come from threads), killed at close
        self.counts = {"calls": 0, "errors": 0, "timeouts": 0, "seconds": 0.0, "recycled": 0}

    def _count(self, result: ToolResult) -> ToolResult:
        with self._lock:
            self.counts["calls"] += 1
            self.counts["errors"] += int(result.error)
            self.counts["timeouts"] += int(result.timed_out)
            self.counts["seconds"] += result.seconds
        return result

    def call(self, call: ToolCall, budget_s: float | None = None) -> ToolResult:
        """Run one call within ``timeout_s``, or within ``budget_s`` where that is less (what is left of the
        episode's or the step's time: a call it stops, or does not let start, is ``over_budget``); never
        raises for anything the model or the tool does."""
        t0 = time.perf_counter()
        try:
            problem = self._problem(call)
        except Exception as e:  # noqa: BLE001 - a user parser's odd ToolCall: the model reads an error
            problem = f"the tool call could not be read ({type(e).__name__})"
        if problem is not None:
            return self._count(ToolResult(f"Error: {problem}", error=True))
        timeout = self.timeout_s if budget_s is None else min(self.timeout_s, budget_s)
        if timeout <= 0:
            return ToolResult(
                f"Error: {call.name} was not run: the episode's time for tools ran out",
                error=True,
                timed_out=False,
                over_budget=True,
            )
        tool = self.tools[call.name]
        cut = budget_s is not None and budget_s < self.timeout_s
        until = time.monotonic() + timeout
        worker = self._idle.get()  # (waiting for a free worker counts against the budget)
        timeout = until - time.monotonic() if cut else timeout
        if timeout <= 0:
            self._idle.put(worker)
            return ToolResult(
                f"Error: {call.name} was not run: the episode's time for tools ran out",
                error=True,
                over_budget=True,
            )
        if worker is None:
            try:
                serve = functools.partial(_serve, self.tools, self.max_chars, self.memory_mb)
                worker = self.workers.spawn(functools.partial(Worker, serve))
            except Exception:
                self._idle.put(None)
                raise
        try:
            reply = worker.call(tool.name, call.arguments, timeout)
        except TimeoutError:
            self._retire(worker)
            seconds = time.perf_counter() - t0
            if cut:
                text = f"Error: {tool.name} was stopped after {seconds:.3g} s: the episode's time for tools ran out"
            else:
                text = f"Error: {tool.name} did not finish within {self.timeout_s:g} s"
            return self._count(ToolResult(text, True, True, seconds, over_budget=cut))
        except Exception as e:  # noqa: BLE001 - an unpicklable reply or a broken pipe: replace the worker
            self._retire(worker)
            return self._count(
                ToolResult(
                    f"Error: {tool.name} failed ({type(e).__name__})", True, False, time.perf_counter() - t0
                )
            )
        seconds = time.perf_counter() - t0
        if reply is None:
            lost = worker.lost()
            self._retire(worker)
            if lost is None:
                return self._count(
                    ToolResult(f"Error: {tool.name} crashed (its process exited)", True, False, seconds)
                )
            worker.report("its call failed (the model reads why) and a fresh worker serves the next call")
            text = f"Error: {tool.name} failed: its worker was killed by {signal.Signals(lost).name}"
            return self._count(ToolResult(text, True, False, seconds))
        status, text, printed, grown = reply
        if (self.memory_mb and grown > self.memory_mb * (1 << 19)) or text.startswith("MemoryError"):
            self._retire(worker)  # a leaking tool: a fresh worker for the next call
            with self._lock:
                self.counts["recycled"] += 1
        else:
            self._idle.put(worker)
        text = clean_text(text)
        return self._count(
            ToolResult(
                text if status != "error" else f"Error: {text}",
                error=status != "ok",
                timed_out=status == "timeout",
                seconds=seconds,
                printed=clean_text(printed),
            )
        )

    def _problem(self, call: ToolCall) -> str | None:
        """Why ``call`` cannot run (an unreadable call, an unknown tool, arguments that do not fit), or None."""
        if call.error is not None:
            return cut_text(clean_text(str(call.error)), 300)
        tool = self.tools.get(call.name) if isinstance(call.name, str) else None
        if tool is None:
            return f"there is no tool {echo(call.name)}; the tools are {sorted(self.tools)}"
        return check_arguments(tool, call.arguments)

    def _retire(self, worker: Worker) -> None:
        self.workers.retire(worker)
        self._idle.put(None)  # a fresh worker is forked for the next call

    @property
    def _all(self) -> list[Worker]:
        """The live workers (the pool's)."""
        return self.workers.live

    def close(self) -> None:
        """Kill every worker (call when done; the pool also does when it is collected)."""
        self.workers.close()
