"""Run several reward functions on a batch, weight them, and survive their failures.
(Over 500 lines: RewardRunner is one object, the pool of killable workers with its time budgets, whose methods
share its state; the workers' own side is grpokit.scoring._workers.)

Where the functions run. By default (`isolation="process"`) every call runs in a small pool of
worker processes forked from the trainer, so that a function that runs past its time is *killed*
(SIGKILL to the worker's process group, which also takes the math-verify processes it started),
never left burning a core: a thread cannot be stopped in Python. Fork, not spawn, because the
functions are often closures or lambdas that cannot be pickled: a forked child inherits them. The
workers are forked on the first call and kept (their caches, e.g. math_accuracy's math-verify
processes, stay warm); a killed worker is replaced by a fresh fork. Only the arguments (prompts,
completions, columns) and the values cross the pipe, pickled. Consequences:
  - a function sees the trainer's memory as it was when its worker was forked; state it keeps
    between calls lives in the worker, and its side effects on the trainer's objects are not seen;
  - a model held by the trainer is shared copy-on-write, not copied; a worker dies with the trainer
    (PR_SET_PDEATHSIG) and ignores Ctrl-C (its own process group), which the trainer handles;
  - if CUDA is initialised in the trainer the fork is still safe, as for PyTorch's DataLoader
    workers: the child never touches the inherited CUDA context. A reward function that needs the
    GPU itself cannot run in a forked child: mark it `in_process = True` (the built-in reward models
    are): it is then called in the runner's own process and thread, after the workers' functions,
    with no time limit (nothing could stop it safely); or use `isolation="thread"` for all (the
    functions then run in threads and a timed-out one is abandoned, still running, as before).
The cost is ~1 ms per call and batch (pickling and pipes), plus one fork (a few ms) at start and
after each kill; see docs/benchmarks.md.

Time limits. A function marked `per_completion = True` (the built-in math_accuracy and code_tests;
set the attribute on your own element-wise function to opt in) is called on one completion at a
time, spread over the workers, and each completion has its own budget, `completion_timeout_s`: a
completion that runs past it scores 0, is counted in `reward/<name>/timeouts`, and its worker is
killed and replaced; the other completions keep their values, and `timeout_s` never cuts them
(such a function takes at most ceil(n / workers) x completion_timeout_s). One also marked
`chunked = True` (math_accuracy) accepts several completions per call: it is called on chunks
(one pipe round trip each, not one per completion; ``chunk_size``: up to 32 at first, then as many as
its last call's seconds per completion fit in 50 ms, up to one chunk per worker), and a chunk must
finish within one completion's budget; a chunk that does not, or whose worker dies, is killed and its completions
are run again one at a time, each with its own budget, so a hang still costs only its own
completion (and at most one extra budget of time). Any other function is
called once on the whole batch (so functions that compare the completions of a batch keep their
meaning) and fails as a whole when it runs past `timeout_s`.

Set-up is not a completion's time. A worker's fork, and a function's `warm_up(starting)` hook
(math_accuracy's starts its math-verify process: 1-2 s on an idle core, 10 s and more under load),
run before the completion's budget starts: the worker says READY when it is up, and a hook calls
`starting()` before slow work (see grpokit.scoring._workers). Set-up has its own limit,
`warm_up_timeout_s`; past it the worker is killed and its completions are tried once more in a
fresh worker, then fail by name (None, in `row_errors`): an infrastructure fault never scores 0.

The calling convention (TRL's GRPOTrainer, checked against its `_calculate_rewards`). Each
function is called as fn(prompts=..., completions=..., **columns, log_metric=..., log_extra=...):
`columns` are what the caller gives (the trainer: every dataset column but the prompt,
`completion_ids` and `trainer_state`); a column that is a list with one item per completion is
sliced along with the completions. `log_metric(name, value)` records a scalar (averaged over the
calls of the batch, in `RewardResult.logged`; logged as reward/<function>/<name>, where TRL logs
`name` alone, so that it never overwrites grpokit's own metrics) and
`log_extra(column, values)` extra per-completion columns (`RewardResult.extra`); both are collected
in the worker and sent back with the values. A function may be `async def` (or return an
awaitable): it is awaited in its worker; async functions do not count against `workers` (they wait
on I/O), so all of them run at the same time, as TRL's asyncio.gather does. None means "does not
apply to this completion": it adds 0 to the total, and a completion no function scored is left out
of its group's statistics with advantage 0 (TRL's rule; `ScoredBatch.scored`, grpokit.algos.advantages).

Process rewards. A function marked `step_rewards = True` returns per completion a list of
(char_end, score) (see `grpokit.rewards.process`); each list is checked against its completion's
text in the worker (a bad one fails that completion, with the step named), the lists are kept in
`RewardResult.steps`, and the function's value (`per_function`, the total) is its last step's score.

Failures, per completion. A value that is not a number or None, or is NaN or inf, fails that
completion only. A call that raises is retried one completion at a time (async ones concurrently),
so a bad row costs that row and the failing row is known; rows that fail alone keep their reason.
A function that returns something that is not a list of the right length, kills its worker, or
runs past `timeout_s` fails on every completion of the call. Failed completions get None (0 in the
total), are counted in `reward/<name>/failed_rows` and listed in `RewardResult.row_errors`, and are
logged as a warning naming the function. The runner never raises because of a reward function:
`RewardResult.failure(...)` says whether the failures are too many and why, for the caller to stop.
"""

from __future__ import annotations

import collections
import logging
import math
import os
import select
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from numbers import Real

from grpokit.core.workers import WorkerPool
from grpokit.core.workers import frame as encode_frame
from grpokit.scoring._workers import (
    READY,
    WARMING,
    _call_rows,
    _is_async,
    _per_row,
    _Task,
    _Worker,
)
from grpokit.scoring.result import RewardResult, TrainerState, _mean
from grpokit.scoring.steps import is_process_reward, step_outcome

__all__ = ["RewardResult", "RewardRunner", "TrainerState"]

log = logging.getLogger("grpokit.rewards")


CHUNK_TARGET_S = 0.05
"""A chunk of a chunked function takes about this long once its speed is known: its pipe round trip (~0.5 ms) is
then ~1% of it, and a chunk that falls back to one completion at a time re-runs little."""


def chunk_size(n: int, workers: int, item_seconds: float | None = None) -> int:
    """Completions per call of a ``per_completion`` function over ``n`` on ``workers``: ceil(n / (4 workers)),
    at most 32 (four chunks a worker balance uneven completions; a chunk that falls back re-runs few). With
    ``item_seconds``, its last call's slowest seconds per completion (chunked functions), as many as fill
    CHUNK_TARGET_S, between that and ceil(n / workers) (one round trip per worker). E.g. n = 128, 2 workers:
    16; math_accuracy at 20 us per completion: 64; a function at 10 ms per completion: 16."""
    base = max(1, min(32, math.ceil(n / (4 * workers))))
    if not item_seconds or item_seconds <= 0:
        return base
    return max(base, min(math.ceil(n / workers), int(CHUNK_TARGET_S / item_seconds)))


class RewardRunner:
    """Score completions with named, weighted reward functions (TRL's calling convention).

    runner = RewardRunner([("math_accuracy", math_accuracy, 1.0), ("format", format_strict, 0.2)])
    result = runner(prompts, completions, {"answer": answers, "completion_ids": ids})
    Every column is passed to every function as a keyword argument. See the module docstring for
    where the functions run and how `timeout_s` and `completion_timeout_s` apply.
    """

    def __init__(
        self,
        functions: list[tuple[str, Callable, float]],
        *,
        timeout_s: float = 60.0,
        completion_timeout_s: float | None = None,
        workers: int | None = None,
        isolation: str = "process",
        warm_up_timeout_s: float = 120.0,
    ):
        names = [name for name, _, _ in functions]
        if len(set(names)) != len(names):
            raise ValueError(f"reward function names must be unique, got {names}")
        for name, fn, weight in functions:
            if not callable(fn):
                raise TypeError(f"reward {name!r} is not callable: {fn!r}")
            if not isinstance(weight, Real) or not math.isfinite(weight):
                raise ValueError(f"reward {name!r} has weight {weight!r}; expected a finite number")
        if isolation not in ("process", "thread"):
            raise ValueError(f"isolation must be 'process' or 'thread', got {isolation!r}")
        self.functions = [(name, fn, float(weight)) for name, fn, weight in functions]
        self.timeout_s = float(timeout_s)
        self.completion_timeout_s = min(
            self.timeout_s, 10.0 if completion_timeout_s is None else completion_timeout_s
        )
        """Budget of one completion of a per_completion function (default min(timeout_s, 10 s))."""
        self.warm_up_timeout_s = float(warm_up_timeout_s)
        """Limit on a worker's set-up (its fork, a function's `warm_up` hook such as math_accuracy's
        math-verify process start), which no completion's budget includes."""
        self.workers = max(1, workers or min(4, os.cpu_count() or 1))
        self.isolation = isolation if hasattr(os, "fork") else "thread"
        self._pool = WorkerPool("reward")  # the worker processes; killed by close() or when collected
        # chunked function -> its last call's seconds per completion (chunk_size)
        self._item_seconds: dict[int, float] = {}

    def start(self) -> None:
        """Start the worker processes now, each running its functions' warm_up hooks (math_accuracy:
        math-verify's process), so that set-up overlaps whatever the caller does next (the trainer: loading
        the model) instead of the first batch's scoring. Optional: a runner not started starts its workers
        on its first call. Nothing to start with isolation "thread" or only in-process functions."""
        if self.isolation != "process" or all(_in_process(fn) for _, fn, _ in self.functions):
            return
        pool, functions = self._workers_here(), [fn for _, fn, _ in self.functions]
        while len(pool.live) < self.workers:
            try:
                pool.spawn(lambda: _Worker(functions, warm=True))
            except OSError:  # no process now: the first call starts them, or reports why it cannot
                return

    def close(self) -> None:
        """Stop the worker processes (they are also stopped when the runner is garbage-collected); a
        later call starts new ones."""
        self._pool.close()
        self._pool = WorkerPool("reward")

    def _workers_here(self) -> WorkerPool:
        """The pool of this process: in a fork of the runner's process (a forked sampler, a worker) the
        inherited pool's workers are the parent's, so the fork starts a pool of its own."""
        if self._pool.owner != os.getpid():
            self._pool = WorkerPool("reward")
        return self._pool

    def __enter__(self) -> RewardRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __call__(
        self, prompts: list | None, completions: list, columns: dict[str, list] | None = None
    ) -> RewardResult:
        columns = dict(columns or {})
        for reserved in ("prompts", "completions", "log_metric", "log_extra"):
            columns.pop(reserved, None)
        completions = list(completions)
        n = len(completions)
        prompts = list(prompts) if prompts is not None else [None] * n
        names = [name for name, _, _ in self.functions]
        out = _Outcome(
            values={name: [None] * n for name in names},
            row_errors={name: {} for name in names},
            seconds=dict.fromkeys(names, 0.0),
            timeouts=dict.fromkeys(names, 0),
            logs={name: [] for name in names},
        )
        if self.isolation == "thread":
            self._run_threads(prompts, completions, columns, out)
        else:
            self._run_processes(prompts, completions, columns, out)
        self._run_in_process(prompts, completions, columns, out)
        steps = {}  # process rewards: their steps aside, the last step's score as their value
        for name, fn, _ in self.functions:
            if is_process_reward(fn):
                steps[name] = [v if isinstance(v, list) else None for v in out.values[name]]
                out.values[name] = [step_outcome(v) for v in out.values[name]]
        errors: dict[str, str | None] = dict.fromkeys(names)
        for name in names:
            bad = out.row_errors[name]
            if bad:
                first = min(bad)
                errors[name] = bad[first]
                for i in bad:
                    out.values[name][i] = None
                log.warning(
                    "reward function %r failed on %d of %d completion(s) (they count 0); row %d: %s",
                    name, len(bad), n, first, bad[first],
                )  # fmt: skip
            if out.timeouts[name]:
                log.warning(
                    "reward function %r: %d completion(s) ran past %g s each and score 0 (worker killed)",
                    name,
                    out.timeouts[name],
                    self.completion_timeout_s,
                )
        unscored = [i for i in range(n) if all(out.values[name][i] is None for name in names)]
        if unscored and not any(out.row_errors.values()):
            log.warning(
                "%d of %d completion(s) got None from every reward function: they are left out of their "
                "group's statistics and get advantage 0, as in TRL (first: row %d); make sure at least one "
                "function applies to every row",
                len(unscored), n, unscored[0],
            )  # fmt: skip
        total = [0.0] * n
        for name, _, weight in self.functions:
            for i, v in enumerate(out.values[name]):
                if v is not None:
                    total[i] += weight * v
        failed = {name: n > 0 and len(out.row_errors[name]) == n for name in names}
        logged: dict[str, list[float]] = {}
        extra: dict[str, list] = {}
        for name in names:
            for metrics, columns_logged in out.logs[name]:
                for key, vs in metrics.items():  # under the function's name: never over grpokit's own
                    logged.setdefault(f"reward/{name}/{key}", []).extend(vs)
                for key, vs in columns_logged.items():
                    extra.setdefault(key, []).extend(vs)
        return RewardResult(
            total,
            out.values,
            errors,
            failed,
            out.seconds,
            out.timeouts,
            row_errors=out.row_errors,
            logged={k: _mean(vs) for k, vs in logged.items() if vs},
            extra=extra,
            steps=steps,
        )

    def _run_in_process(self, prompts, completions, columns, out: _Outcome) -> None:
        """The functions marked `in_process = True` (a model on the GPU: CUDA cannot be used in a forked
        child, and the model would load again there), called here, one after the other, in the calling
        thread: no time limit applies to them (nothing can stop them safely)."""
        row_keys = frozenset(k for k, v in columns.items() if _per_row(v, len(completions)))
        for name, fn, _ in self.functions:
            if not _in_process(fn):
                continue
            start = time.monotonic()
            kwargs = {k: list(v) if isinstance(v, (list, tuple)) else v for k, v in columns.items()}
            row_values, row_errors, logged = _call_rows(
                fn, list(prompts), list(completions), kwargs, row_keys
            )
            out.values[name] = row_values
            out.row_errors[name] = {i: e for i, e in enumerate(row_errors) if e is not None}
            out.logs[name].append(logged)
            out.seconds[name] = time.monotonic() - start

    # --- processes ------------------------------------------------------------------------------
    def _run_processes(self, prompts, completions, columns, out: _Outcome) -> None:
        pool = self._workers_here()
        values, timeouts = out.values, out.timeouts
        n = len(completions)
        start = time.monotonic()
        deadline = start + self.timeout_s
        tasks: collections.deque[_Task] = collections.deque()
        is_async = [_is_async(fn) for _, fn, _ in self.functions]
        for k, (_, fn, _) in enumerate(self.functions):
            if _in_process(fn):
                continue  # run by _run_in_process
            if getattr(fn, "per_completion", False):
                chunked = getattr(fn, "chunked", False)
                size = chunk_size(n, self.workers, self._item_seconds.get(k) if chunked else None)
                mode = "chunk" if chunked and size > 1 else "items"
                tasks.extend(_Task(k, mode, list(range(a, min(n, a + size)))) for a in range(0, n, size))
            else:
                tasks.append(_Task(k, "batch", list(range(n))))
        row_keys = frozenset(k for k, v in columns.items() if _per_row(v, n))
        first: dict[int, float] = {}
        last: dict[int, float] = {}
        item_seconds: dict[int, float] = {}  # chunked function -> this call's slowest seconds per completion
        fell_back: set[int] = set()  # chunked functions with a chunk run again one completion at a time
        busy: dict[int, _Worker] = {}  # reply fd -> worker
        poller = select.poll()

        def fail(k: int, error: str, rows: list[int] | None = None) -> None:
            """Fail function k on `rows` (default: every row not yet scored) and stop its other work."""
            name = self.functions[k][0]
            bad = out.row_errors[name]
            for i in range(n) if rows is None else rows:
                if i not in bad and (rows is not None or values[name][i] is None):
                    bad[i] = error
            if rows is not None:
                return
            for fd, w in list(busy.items()):
                if w.task.fn_index == k:
                    retire(fd, w)
            for t in [t for t in tasks if t.fn_index == k]:
                tasks.remove(t)

        def retire(fd: int, w: _Worker) -> None:
            poller.unregister(fd)
            del busy[fd]
            pool.retire(w)

        def finish(fd: int, w: _Worker) -> None:
            last[w.task.fn_index] = time.monotonic()
            poller.unregister(fd)
            del busy[fd]
            w.task = None

        def next_task() -> _Task | None:
            """The first waiting task that may start: async ones (waiting on I/O) need no free slot."""
            sync_busy = sum(not is_async[w.task.fn_index] for w in busy.values())
            for t in tasks:
                if is_async[t.fn_index] or sync_busy < self.workers:
                    tasks.remove(t)
                    return t
            return None

        past_deadline = False
        try:
            while tasks or busy:
                now = time.monotonic()
                if now >= deadline and not past_deadline:  # only batch calls stop here
                    past_deadline = True
                    for w in list(busy.values()):
                        if w.task.mode == "batch":
                            fail(
                                w.task.fn_index,
                                f"timed out after {self.timeout_s:g} s (worker process killed)",
                            )
                    for t in [t for t in tasks if t.mode == "batch"]:
                        fail(t.fn_index, f"timed out after {self.timeout_s:g} s (worker process killed)")
                while tasks:
                    task = next_task()
                    if task is None:
                        break
                    rows = task.rows
                    kwargs = {k: [v[i] for i in rows] if k in row_keys else v for k, v in columns.items()}
                    chunk = ([prompts[i] for i in rows], [completions[i] for i in rows], kwargs, row_keys)
                    try:
                        frame = encode_frame((task.fn_index, task.mode, *chunk))
                    except Exception as e:  # noqa: BLE001 - unpicklable columns: reported, not raised
                        fail(task.fn_index, f"its arguments cannot be sent to a worker process ({e})")
                        continue
                    idle = [w for w in pool.live if w.task is None]
                    try:
                        w = idle[0] if idle else pool.spawn(lambda: _Worker([fn for _, fn, _ in self.functions]))
                    except OSError as e:
                        fail(task.fn_index, f"no worker process could be started ({e})")
                        continue
                    try:
                        w.send(frame)
                    except OSError as e:  # it died while idle: replace it and try again
                        pool.retire(w)
                        task.attempts += 1
                        if task.attempts < 3:
                            tasks.appendleft(task)
                        else:
                            fail(task.fn_index, f"its worker processes die before they can read it ({e})")
                        continue
                    task.started = w.item_started = time.monotonic()
                    first.setdefault(task.fn_index, task.started)
                    w.task = task
                    busy[w.from_child] = w
                    poller.register(w.from_child, select.POLLIN)
                if not busy:
                    break  # only tasks left after the deadline: reported below
                now = time.monotonic()
                wake = math.inf if past_deadline else deadline
                for w in busy.values():
                    if w.task.mode != "batch" and w.warming:
                        wake = min(wake, w.warming_started + self.warm_up_timeout_s)
                    elif w.task.mode != "batch":
                        wake = min(wake, w.item_started + self.completion_timeout_s)
                for fd, _ in poller.poll(max(0.0, wake - now) * 1000):
                    w = busy.get(fd)
                    if w is None:
                        continue
                    replies = w.read_replies()
                    task = w.task
                    name = self.functions[task.fn_index][0]
                    if replies is None:
                        if task.mode == "chunk":  # one at a time in a new worker: the culprit alone fails
                            fell_back.add(task.fn_index)
                            retire(fd, w)
                            tasks.appendleft(_Task(task.fn_index, "items", task.rows))
                        elif task.mode == "items":  # that completion fails; the others go on in a new worker
                            row = task.rows[task.done]
                            rest = task.rows[task.done + 1 :]
                            retire(fd, w)
                            fail(task.fn_index, "its worker process died on it (killed or exited)", [row])
                            if rest:
                                tasks.appendleft(_Task(task.fn_index, "items", rest))
                            last[task.fn_index] = time.monotonic()
                        else:
                            retire(fd, w)
                            fail(task.fn_index, "its worker process died (killed or exited)")
                        continue
                    for reply in replies:
                        if reply == WARMING:  # set-up: no completion's budget runs until READY
                            w.warming, w.warming_started = True, time.monotonic()
                            continue
                        if reply == READY:
                            w.warming, w.item_started = False, time.monotonic()
                            continue
                        row_values, row_errors, logged = reply
                        rows = [task.rows[task.done]] if task.mode == "items" else task.rows
                        if task.mode == "chunk":  # the slowest chunk's seconds per completion sizes the next
                            per_item = (time.monotonic() - w.item_started) / len(rows)
                            item_seconds[task.fn_index] = max(item_seconds.get(task.fn_index, 0.0), per_item)
                        for i, v, e in zip(rows, row_values, row_errors):
                            values[name][i] = v
                            if e is not None:
                                out.row_errors[name][i] = e
                        out.logs[name].append(logged)
                        task.done += len(rows)
                        w.item_started = time.monotonic()
                    if fd in busy and task.done == len(task.rows):
                        finish(fd, w)
                now = time.monotonic()
                for fd, w in list(busy.items()):
                    task = w.task
                    if task.mode != "batch" and w.warming:
                        if now >= w.warming_started + self.warm_up_timeout_s:  # not the completion's fault
                            rest = task.rows[task.done :]
                            last[task.fn_index] = now
                            retire(fd, w)
                            if task.warm_retries < 1:  # once more, in a fresh worker
                                tasks.appendleft(_Task(task.fn_index, task.mode, rest, warm_retries=1))
                            else:
                                fail(
                                    task.fn_index,
                                    f"not scored: its worker process was still setting up (forking, or the "
                                    f"function's warm_up such as math-verify's process start) after "
                                    f"{self.warm_up_timeout_s:g} s, twice; the machine may be overloaded",
                                    rest,
                                )
                        continue
                    if task.mode == "chunk" and now >= w.item_started + self.completion_timeout_s:
                        fell_back.add(task.fn_index)
                        retire(fd, w)  # past one completion's budget: each alone now, with its own budget
                        tasks.appendleft(_Task(task.fn_index, "items", task.rows))
                        continue
                    if task.mode == "items" and now >= w.item_started + self.completion_timeout_s:
                        name = self.functions[task.fn_index][0]
                        values[name][task.rows[task.done]] = 0.0
                        timeouts[name] += 1
                        rest = task.rows[task.done + 1 :]
                        last[task.fn_index] = now
                        retire(fd, w)
                        if rest:
                            tasks.appendleft(_Task(task.fn_index, "items", rest))
        except BaseException:  # KeyboardInterrupt (a second Ctrl-C) and the like: stop the work
            for fd, w in list(busy.items()):
                retire(fd, w)
            raise
        # The batch deadline: whatever is still running or waiting is stopped.
        for fd, w in list(busy.items()):
            task = w.task
            if task.mode != "batch":
                tasks.appendleft(_Task(task.fn_index, "items", task.rows[task.done :]))
            else:
                fail(task.fn_index, f"timed out after {self.timeout_s:g} s (worker process killed)")
            if fd in busy:
                retire(fd, w)
        for task in list(tasks):  # fail() removes tasks
            name = self.functions[task.fn_index][0]
            if task.mode == "batch":
                fail(task.fn_index, f"timed out after {self.timeout_s:g} s (worker process killed)")
            else:
                for i in task.rows:
                    values[name][i] = 0.0
                timeouts[name] += len(task.rows)
        end = time.monotonic()
        for k, (name, fn, _) in enumerate(self.functions):
            if not _in_process(fn):
                out.seconds[name] = (last.get(k, end) - first[k]) if k in first else 0.0
        for k in range(len(self.functions)):  # a function whose chunk fell back starts small again next call
            if k in item_seconds and k not in fell_back:
                self._item_seconds[k] = item_seconds[k]
            else:
                self._item_seconds.pop(k, None)

    # --- threads --------------------------------------------------------------------------------
    def _run_threads(self, prompts, completions, columns, out: _Outcome) -> None:
        """isolation="thread": each function in a thread; a timed-out one is abandoned (a daemon
        thread that keeps running: Python cannot stop it), its late result ignored."""
        n = len(completions)
        row_keys = frozenset(k for k, v in columns.items() if _per_row(v, n))
        boxes, threads = {}, {}
        start = time.monotonic()
        for name, fn, _ in self.functions:
            if _in_process(fn):
                continue  # run by _run_in_process
            box: dict = {}
            # Copies: a function that mutates its inputs must not change what the next one sees.
            kwargs = {k: list(v) if isinstance(v, (list, tuple)) else v for k, v in columns.items()}
            args = (fn, list(prompts), list(completions), kwargs, row_keys, box, start)
            t = threading.Thread(target=_thread_call, args=args, name=f"reward-{name}", daemon=True)
            t.start()
            boxes[name], threads[name] = box, t
        for name, _, _ in self.functions:
            if name not in threads:
                continue
            threads[name].join(max(0.0, start + self.timeout_s - time.monotonic()))
            box = boxes[name]
            if threads[name].is_alive():
                error = f"timed out after {self.timeout_s:g} s (thread abandoned; it cannot be killed)"
                out.row_errors[name] = dict.fromkeys(range(n), error)
                out.seconds[name] = self.timeout_s
                continue
            out.seconds[name] = box["seconds"]
            row_values, row_errors, logged = box["result"]
            out.values[name] = row_values
            out.row_errors[name] = {i: e for i, e in enumerate(row_errors) if e is not None}
            out.logs[name].append(logged)


def _in_process(fn: Callable) -> bool:
    return bool(getattr(fn, "in_process", False))


@dataclass
class _Outcome:
    """What one batch's functions produced, filled in by _run_processes / _run_threads."""

    values: dict[str, list[float | None]]
    row_errors: dict[str, dict[int, str]]
    seconds: dict[str, float]
    timeouts: dict[str, int]
    logs: dict[str, list[tuple[dict, dict]]]


def _thread_call(
    fn: Callable, prompts: list, completions: list, kwargs: dict, row_keys: frozenset, box: dict, start: float
) -> None:
    box["result"] = _call_rows(fn, prompts, completions, kwargs, row_keys)
    box["seconds"] = time.monotonic() - start
