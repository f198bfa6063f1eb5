"""Run several reward functions on a batch, weight them, and survive their failures.

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
    GPU itself cannot run in a forked child: use `isolation="thread"` (the functions then run in
    threads and a timed-out one is abandoned, still running, as before).
The cost is ~1 ms per call and batch (pickling and pipes), plus one fork (a few ms) at start and
after each kill; see BENCHMARKS.md.

Time limits. `timeout_s` bounds the whole batch. A function marked `per_completion = True` (the
built-in math_accuracy; set the attribute on your own element-wise function to opt in) is called
on one completion at a time, spread over the workers, and each completion has its own budget,
`completion_timeout_s`: a completion that runs past it scores 0, is counted in
`reward/<name>/timeouts`, and its worker is killed and replaced; the other completions keep their
values. Any other function is called once on the whole batch (so functions that compare the
completions of a batch keep their meaning) and fails as a whole when it runs past `timeout_s`.

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
apply to this completion" and contributes 0.

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

import asyncio
import collections
import ctypes
import inspect
import logging
import math
import os
import pickle
import select
import signal
import struct
import threading
import time
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from numbers import Real

log = logging.getLogger("grpokit.rewards")


@dataclass
class TrainerState:
    """What a reward function gets as `trainer_state` (the fields of transformers' TrainerState that
    a reward can use, e.g. for a curriculum: `trainer_state.global_step / trainer_state.max_steps`)."""

    global_step: int = 0
    """Optimizer steps done before this batch (0 at the first step)."""
    max_steps: int = 0
    """Steps the run is set to do (train.steps)."""
    epoch: float = 0.0
    """Passes over the training prompts so far (fractional)."""


@dataclass
class RewardResult:
    total: list[float]
    """Weighted sum per completion; None (not applicable) and failed completions contribute 0."""
    per_function: dict[str, list[float | None]]
    """Each function's values (None where it does not apply or failed; 0.0 for a completion that timed out)."""
    errors: dict[str, str | None]
    """The first thing that went wrong per function, None when it was fine."""
    failed: dict[str, bool]
    """True when the function produced no value at all: it failed on every completion."""
    seconds: dict[str, float] = field(default_factory=dict)
    """Wall time per function (timeout_s for a timed-out one)."""
    timeouts: dict[str, int] = field(default_factory=dict)
    """Completions that ran past completion_timeout_s and scored 0, per function."""
    row_errors: dict[str, dict[int, str]] = field(default_factory=dict)
    """Per function, the completions (by index) it failed on and why."""
    logged: dict[str, float] = field(default_factory=dict)
    """log_metric(name, value) calls as reward/<function>/<name>, averaged over the batch's calls."""
    extra: dict[str, list] = field(default_factory=dict)
    """log_extra(column, values) calls, concatenated per column."""

    COUNTERS = ("failed", "failed_rows", "timeouts", "seconds")
    """reward/<name>/<counter> metrics that count or cost per call: they add up over several calls
    (the trainer's dynamic-sampling rounds), where means and logged values are averaged."""

    def metrics(self) -> dict[str, float]:
        """reward/<name>/{mean,std,applicable,failed,failed_rows,timeouts,seconds}, reward/total/{mean,std}
        and reward/<name>/<metric> for each metric the function logged with log_metric. mean and std are over applicable (non-None) values and
        left out when there are none; failed is 1 when the function failed on every completion."""
        out: dict[str, float] = {}
        for name, values in self.per_function.items():
            vals = [v for v in values if v is not None]
            if vals:
                out[f"reward/{name}/mean"] = _mean(vals)
                out[f"reward/{name}/std"] = _std(vals)
            out[f"reward/{name}/applicable"] = len(vals) / len(values) if values else 0.0
            out[f"reward/{name}/failed"] = float(self.failed[name])
            out[f"reward/{name}/failed_rows"] = float(len(self.row_errors.get(name, {})))
            out[f"reward/{name}/timeouts"] = float(self.timeouts.get(name, 0))
            out[f"reward/{name}/seconds"] = self.seconds.get(name, 0.0)
        if self.total:
            out["reward/total/mean"] = _mean(self.total)
            out["reward/total/std"] = _std(self.total)
        out.update(self.logged)
        return out

    def failure(self, max_failure_frac: float, prompts: list | None, completions: list) -> str | None:
        """Why this batch's reward failures must stop the run, or None when they may be tolerated.

        A function stops it when it failed on every completion (timeouts included), or on more than
        `max_failure_frac` of them (0 = on any). The message names the function, how many rows failed,
        the first failing row's reason, prompt and completion."""
        n = len(completions)
        problems = []
        for name, rows in self.row_errors.items():
            bad = len(rows)
            if not bad and not (n and self.timeouts.get(name, 0) == n):
                continue
            if bad and bad + self.timeouts.get(name, 0) < n and bad / max(n, 1) <= max_failure_frac:
                continue
            if not bad:
                problems.append(
                    f"reward function {name!r} timed out on all {n} completions "
                    f"(each past its per-completion budget); they all score 0"
                )
                continue
            row = min(rows)
            prompt = prompts[row] if prompts is not None else None
            allowed = f"(allowed: {max_failure_frac:g} of them)"
            share = f"every one of the {n}" if bad == n else f"{bad} of {n} {allowed}"
            problems.append(
                f"reward function {name!r} failed on {share} completions; first failing row {row}: "
                f"{rows[row]}\n  prompt: {_excerpt(prompt)}\n  completion: {_excerpt(completions[row])}"
            )
        return "\n".join(problems) or None


def _excerpt(item: object, limit: int = 300) -> str:
    text = repr(item)
    return text if len(text) <= limit else text[:limit] + "...'"


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _std(xs: list[float]) -> float:
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))


def _check(values: object, n: int) -> tuple[list[float | None], list[str | None]]:
    """(values, per-row errors) from a reward function's return value. A value that is not a number
    or None, or not finite, fails its row; a return value of the wrong shape raises ValueError."""
    if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__len__"):
        raise ValueError(f"returned {type(values).__name__}, expected a list of {n} floats or None")
    values = list(values.tolist() if hasattr(values, "tolist") else values)
    if len(values) != n:
        raise ValueError(f"returned {len(values)} values for {n} completions")
    out: list[float | None] = []
    errors: list[str | None] = []
    for v in values:
        if v is None or (isinstance(v, Real) and math.isfinite(float(v))):
            out.append(None if v is None else float(v))
            errors.append(None)
            continue
        out.append(None)
        if not isinstance(v, Real):
            errors.append(f"returned {type(v).__name__} {str(v)[:40]!r}, not a number or None")
        else:
            errors.append(f"returned {float(v)}")
    return out, errors


class _Logs:
    """What a function passes to log_metric / log_extra during one call."""

    def __init__(self) -> None:
        self.metrics: dict[str, list[float]] = {}
        self.extra: dict[str, list] = {}

    def log_metric(self, name: str, value: float) -> None:
        self.metrics.setdefault(str(name), []).append(float(value))

    def log_extra(self, column: str, values: list) -> None:
        self.extra.setdefault(str(column), []).extend(list(values))

    def picklable(self) -> tuple[dict, dict]:
        try:
            pickle.dumps(self.extra)
            return self.metrics, self.extra
        except Exception:  # noqa: BLE001 - extra columns that cannot cross the pipe become text
            return self.metrics, {k: [str(v) for v in vs] for k, vs in self.extra.items()}


def _describe(e: BaseException) -> str:
    return f"raised {type(e).__name__}: {str(e)[:500]}"


async def _await(awaitable: object) -> object:
    return await awaitable


def _invoke(fn: Callable, prompts: list, completions: list, kwargs: dict) -> object:
    """fn's return value; an async function's (or a returned awaitable) awaited to its end."""
    out = fn(prompts=prompts, completions=completions, **kwargs)
    if inspect.isawaitable(out):
        out = asyncio.run(_await(out))
    return out


def _call_rows(
    fn: Callable, prompts: list, completions: list, kwargs: dict, row_keys: frozenset
) -> tuple[list[float | None], list[str | None], tuple[dict, dict]]:
    """(values, per-row errors, (metrics, extra) logged) of one call, never raising. A call that raises
    is retried one row at a time (concurrently for an async function), so a bad row costs that row."""
    n = len(completions)  # before the call: a function may mutate its arguments
    logs = _Logs()
    logging_kwargs = {"log_metric": logs.log_metric, "log_extra": logs.log_extra}
    rows = [
        ([prompts[i]], [completions[i]], {k: [v[i]] if k in row_keys else v for k, v in kwargs.items()})
        for i in range(n)
    ]  # sliced before the call, which may mutate the columns
    try:
        values = _invoke(fn, prompts, completions, {**kwargs, **logging_kwargs})
    except BaseException as e:  # noqa: BLE001 - reported by the runner, never swallowed
        error = _describe(e)
        if n <= 1:
            return [None] * n, [error] * n, logs.picklable()
        out: list[float | None] = []
        errors: list[str | None] = []
        for value, row_error in _rows_alone(fn, rows):
            out.append(value)
            errors.append(row_error)
        return out, errors, logs.picklable()
    try:
        out, errors = _check(values, n)
    except Exception as e:  # noqa: BLE001
        return [None] * n, [str(e)] * n, logs.picklable()
    return out, errors, logs.picklable()


def _rows_alone(fn: Callable, rows: list) -> list[tuple[float | None, str | None]]:
    """Each row scored alone (after the whole call raised): (value, None) or (None, why it failed)."""
    ignore = {"log_metric": lambda *a: None, "log_extra": lambda *a: None}  # logged by the batch call only

    def outcome(result: object) -> tuple[float | None, str | None]:
        if isinstance(result, BaseException):
            return None, _describe(result)
        try:
            values, errors = _check(result, 1)
        except Exception as e:  # noqa: BLE001
            return None, str(e)
        return values[0], errors[0]

    if inspect.iscoroutinefunction(fn):

        async def gather() -> list:
            async def one(p, c, kw):
                return await fn(prompts=p, completions=c, **kw, **ignore)

            return await asyncio.gather(*(one(p, c, kw) for p, c, kw in rows), return_exceptions=True)

        try:
            return [outcome(r) for r in asyncio.run(gather())]
        except BaseException as e:  # noqa: BLE001
            return [(None, _describe(e))] * len(rows)
    results = []
    for p, c, kw in rows:
        try:
            results.append(outcome(_invoke(fn, p, c, {**kw, **ignore})))
        except BaseException as e:  # noqa: BLE001
            results.append((None, _describe(e)))
    return results


def _is_async(fn: Callable) -> bool:
    call = type(fn).__call__ if not inspect.isfunction(fn) and not inspect.ismethod(fn) else None
    return inspect.iscoroutinefunction(fn) or (call is not None and inspect.iscoroutinefunction(call))


# --- worker processes -------------------------------------------------------------------------------
_HEADER = struct.Struct("<Q")
_WORKER_FDS: set[int] = set()
"""Parent-side pipe ends of every live worker of every runner: a new child closes them, so that
no worker holds another's pipe open."""
_PR_SET_PDEATHSIG = 1


def _frame(obj: object) -> bytes:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(data)) + data


def _write_frame(fd: int, obj: object) -> None:
    _write_all(fd, _frame(obj))


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _read_exact(fd: int, n: int) -> bytes | None:
    chunks, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _serve(functions: list[Callable], requests: int, replies: int) -> None:
    """The worker's loop: a task is (function index, mode, prompts, completions, kwargs, the keys of
    the per-row columns); "batch" answers once, "items" calls the function on each completion alone
    (with its row of each per-row column) and answers after each."""
    while True:
        header = _read_exact(requests, _HEADER.size)
        if header is None:
            return
        task = pickle.loads(_read_exact(requests, _HEADER.unpack(header)[0]))
        fn_index, mode, prompts, completions, kwargs, row_keys = task
        fn = functions[fn_index]
        if mode == "batch":
            _write_frame(replies, _call_rows(fn, prompts, completions, kwargs, row_keys))
            continue
        for i in range(len(completions)):
            one = {k: [v[i]] if k in row_keys else v for k, v in kwargs.items()}
            _write_frame(replies, _call_rows(fn, [prompts[i]], [completions[i]], one, row_keys))


def _per_row(value: object, n: int) -> bool:
    return isinstance(value, (list, tuple)) and len(value) == n


class _Worker:
    """One forked worker process and its two pipes (parent side)."""

    def __init__(self, functions: list[Callable]):
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        parent = os.getpid()
        with warnings.catch_warnings():  # Python >= 3.12 warns on fork with threads (torch has some):
            # the child runs only the reward code and never the trainer's threads' work.
            warnings.filterwarnings("ignore", message=".*fork", category=DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # the child: never returns
            status = 0
            try:
                os.setpgid(0, 0)  # its own group: killpg reaches what it starts; Ctrl-C does not reach it
                try:
                    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
                except (OSError, AttributeError):
                    pass
                if os.getppid() != parent:
                    os._exit(0)
                for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE):
                    signal.signal(sig, signal.SIG_DFL)
                for fd in (*_WORKER_FDS, req_w, rep_r):
                    try:
                        os.close(fd)
                    except OSError:
                        pass
                _serve(functions, req_r, rep_w)
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
        self.pid, self.to_child, self.from_child = pid, req_w, rep_r
        _WORKER_FDS.update((req_w, rep_r))
        self.buffer = bytearray()
        self.task: _Task | None = None
        self.item_started = 0.0

    def send(self, frame: bytes) -> None:
        _write_all(self.to_child, frame)

    def read_replies(self) -> list | None:
        """The complete replies that have arrived (call when readable); None when the worker died."""
        chunk = os.read(self.from_child, 1 << 20)
        if not chunk:
            return None
        self.buffer += chunk
        out = []
        while len(self.buffer) >= _HEADER.size:
            size = _HEADER.unpack_from(self.buffer)[0]
            if len(self.buffer) < _HEADER.size + size:
                break
            out.append(pickle.loads(bytes(self.buffer[_HEADER.size : _HEADER.size + size])))
            del self.buffer[: _HEADER.size + size]
        return out

    def kill(self) -> None:
        """SIGKILL the worker's process group (the worker and whatever it started), reap it, close pipes."""
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
            _WORKER_FDS.discard(fd)
            try:
                os.close(fd)
            except OSError:
                pass


def _kill_all(workers: list[_Worker], owner: int) -> None:
    if os.getpid() != owner:  # a fork of the owner: those workers are not its own
        return
    for w in workers:
        w.kill()
    workers.clear()


@dataclass
class _Task:
    fn_index: int
    mode: str  # "batch" | "items"
    rows: list[int]  # indices into the batch
    started: float = 0.0
    done: int = 0  # replies received ("items")
    attempts: int = 0  # workers found dead when it was sent


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
        self.workers = max(1, workers or min(4, os.cpu_count() or 1))
        self.isolation = isolation if hasattr(os, "fork") else "thread"
        self._pool: list[_Worker] = []
        self._pool_pid = os.getpid()
        self._finalizer = weakref.finalize(self, _kill_all, self._pool, self._pool_pid)

    def close(self) -> None:
        """Stop the worker processes (they are also stopped when the runner is garbage-collected)."""
        _kill_all(self._pool, self._pool_pid)

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
                "%d of %d completion(s) got None from every reward function and score 0 (first: row %d); "
                "make sure at least one function applies to every row",
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
        )

    # --- processes ------------------------------------------------------------------------------
    def _run_processes(self, prompts, completions, columns, out: _Outcome) -> None:
        if self._pool_pid != os.getpid():  # we are a fork of the runner's process: its workers are not ours
            self._pool, self._pool_pid = [], os.getpid()
            self._finalizer = weakref.finalize(self, _kill_all, self._pool, self._pool_pid)
        values, timeouts = out.values, out.timeouts
        n = len(completions)
        start = time.monotonic()
        deadline = start + self.timeout_s
        tasks: collections.deque[_Task] = collections.deque()
        is_async = [_is_async(fn) for _, fn, _ in self.functions]
        for k, (_, fn, _) in enumerate(self.functions):
            if getattr(fn, "per_completion", False):
                size = max(1, min(32, math.ceil(n / (4 * self.workers))))
                tasks.extend(_Task(k, "items", list(range(a, min(n, a + size)))) for a in range(0, n, size))
            else:
                tasks.append(_Task(k, "batch", list(range(n))))
        row_keys = frozenset(k for k, v in columns.items() if _per_row(v, n))
        first: dict[int, float] = {}
        last: dict[int, float] = {}
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
            w.kill()
            self._pool.remove(w)

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

        try:
            while tasks or busy:
                now = time.monotonic()
                while tasks and now < deadline:
                    task = next_task()
                    if task is None:
                        break
                    rows = task.rows
                    kwargs = {k: [v[i] for i in rows] if k in row_keys else v for k, v in columns.items()}
                    chunk = ([prompts[i] for i in rows], [completions[i] for i in rows], kwargs, row_keys)
                    try:
                        frame = _frame((task.fn_index, task.mode, *chunk))
                    except Exception as e:  # noqa: BLE001 - unpicklable columns: reported, not raised
                        fail(task.fn_index, f"its arguments cannot be sent to a worker process ({e})")
                        continue
                    idle = [w for w in self._pool if w.task is None]
                    try:
                        w = idle[0] if idle else _Worker([fn for _, fn, _ in self.functions])
                    except OSError as e:
                        fail(task.fn_index, f"no worker process could be started ({e})")
                        continue
                    if not idle:
                        self._pool.append(w)
                    try:
                        w.send(frame)
                    except OSError as e:  # it died while idle: replace it and try again
                        w.kill()
                        self._pool.remove(w)
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
                wake = deadline
                for w in busy.values():
                    if w.task.mode == "items":
                        wake = min(wake, w.item_started + self.completion_timeout_s)
                for fd, _ in poller.poll(max(0.0, wake - now) * 1000):
                    w = busy.get(fd)
                    if w is None:
                        continue
                    replies = w.read_replies()
                    task = w.task
                    name = self.functions[task.fn_index][0]
                    if replies is None:
                        if task.mode == "items":  # that completion fails; the others go on in a new worker
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
                    for row_values, row_errors, logged in replies:
                        rows = task.rows if task.mode == "batch" else [task.rows[task.done]]
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
                    if task.mode == "items" and now >= w.item_started + self.completion_timeout_s:
                        name = self.functions[task.fn_index][0]
                        values[name][task.rows[task.done]] = 0.0
                        timeouts[name] += 1
                        rest = task.rows[task.done + 1 :]
                        last[task.fn_index] = now
                        retire(fd, w)
                        if rest:
                            tasks.appendleft(_Task(task.fn_index, "items", rest))
                if now >= deadline:
                    break
        except BaseException:  # KeyboardInterrupt (a second Ctrl-C) and the like: stop the work
            for fd, w in list(busy.items()):
                retire(fd, w)
            raise
        # The batch deadline: whatever is still running or waiting is stopped.
        for fd, w in list(busy.items()):
            task = w.task
            if task.mode == "items":
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
        for k, (name, _, _) in enumerate(self.functions):
            out.seconds[name] = (last.get(k, end) - first[k]) if k in first else 0.0

    # --- threads --------------------------------------------------------------------------------
    def _run_threads(self, prompts, completions, columns, out: _Outcome) -> None:
        """isolation="thread": each function in a thread; a timed-out one is abandoned (a daemon
        thread that keeps running: Python cannot stop it), its late result ignored."""
        n = len(completions)
        row_keys = frozenset(k for k, v in columns.items() if _per_row(v, n))
        boxes, threads = {}, {}
        start = time.monotonic()
        for name, fn, _ in self.functions:
            box: dict = {}
            # Copies: a function that mutates its inputs must not change what the next one sees.
            kwargs = {k: list(v) if isinstance(v, (list, tuple)) else v for k, v in columns.items()}
            args = (fn, list(prompts), list(completions), kwargs, row_keys, box, start)
            t = threading.Thread(target=_thread_call, args=args, name=f"reward-{name}", daemon=True)
            t.start()
            boxes[name], threads[name] = box, t
        for name, _, _ in self.functions:
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
