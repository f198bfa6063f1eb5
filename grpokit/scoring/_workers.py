"""Calling one reward function, never raising (the TRL calling convention; see `grpokit.scoring.runner`),
and the forked worker processes that run the calls: the pickled frames on their pipes, the worker's
loop, starting and killing a worker. Used by `RewardRunner`; nothing here is public."""

from __future__ import annotations

import asyncio
import inspect
import math
import os
import pickle
import time
from collections.abc import Callable
from dataclasses import dataclass
from numbers import Real

from grpokit.core.workers import FRAME_HEADER, fork_worker, read_frame, write_all, write_frame
from grpokit.scoring._keeper import become_keeper
from grpokit.scoring._keeper import stop as stop_keeper
from grpokit.scoring.completions import to_text
from grpokit.scoring.steps import check_char_steps


def _check(values: object, n: int, texts: list[str] | None = None) -> tuple[list, list[str | None]]:
    """(values, per-row errors) from a reward function's return value. A value that is not a number
    or None, or not finite, fails its row; a return value of the wrong shape raises ValueError.
    texts: the completions' texts when the function returns process rewards (`step_rewards = True`,
    see grpokit.rewards.process): each value is then a list of (char_end, score), checked against them."""
    if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__len__"):
        raise ValueError(f"returned {type(values).__name__}, expected a list of {n} floats or None")
    values = list(values.tolist() if hasattr(values, "tolist") else values)
    if len(values) != n:
        raise ValueError(f"returned {len(values)} values for {n} completions")
    out: list[float | None] = []
    errors: list[str | None] = []
    for k, v in enumerate(values):
        if texts is not None and v is not None:  # process rewards: steps, checked against the text
            try:
                out.append(check_char_steps(v, len(texts[k])))
                errors.append(None)
            except ValueError as e:
                out.append(None)
                errors.append(str(e))
            continue
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
    texts = [to_text(c) for c in completions] if getattr(fn, "step_rewards", False) else None
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
        for value, row_error in _rows_alone(fn, rows, texts):
            out.append(value)
            errors.append(row_error)
        return out, errors, logs.picklable()
    try:
        out, errors = _check(values, n, texts)
    except Exception as e:  # noqa: BLE001
        return [None] * n, [str(e)] * n, logs.picklable()
    return out, errors, logs.picklable()


def _rows_alone(fn: Callable, rows: list, texts: list[str] | None = None) -> list[tuple[object, str | None]]:
    """Each row scored alone (after the whole call raised): (value, None) or (None, why it failed)."""
    ignore = {"log_metric": lambda *a: None, "log_extra": lambda *a: None}  # logged by the batch call only

    def outcome(result: object, row: int) -> tuple[object, str | None]:
        if isinstance(result, BaseException):
            return None, _describe(result)
        try:
            values, errors = _check(result, 1, None if texts is None else [texts[row]])
        except Exception as e:  # noqa: BLE001
            return None, str(e)
        return values[0], errors[0]

    if inspect.iscoroutinefunction(fn):

        async def gather() -> list:
            async def one(p, c, kw):
                return await fn(prompts=p, completions=c, **kw, **ignore)

            return await asyncio.gather(*(one(p, c, kw) for p, c, kw in rows), return_exceptions=True)

        try:
            return [outcome(r, i) for i, r in enumerate(asyncio.run(gather()))]
        except BaseException as e:  # noqa: BLE001
            return [(None, _describe(e))] * len(rows)
    results = []
    for i, (p, c, kw) in enumerate(rows):
        try:
            results.append(outcome(_invoke(fn, p, c, {**kw, **ignore}), i))
        except BaseException as e:  # noqa: BLE001
            results.append((None, _describe(e)))
    return results


def _is_async(fn: Callable) -> bool:
    call = type(fn).__call__ if not inspect.isfunction(fn) and not inspect.ismethod(fn) else None
    return inspect.iscoroutinefunction(fn) or (call is not None and inspect.iscoroutinefunction(call))


# --- worker processes -------------------------------------------------------------------------------
_WORKER_FDS: set[int] = set()
"""Parent-side pipe ends of every live worker of every runner: a new child closes them, so that
no worker holds another's pipe open."""


WARMING = "warming"
"""A frame a worker sends before slow set-up (a `warm_up` hook starting processes): until READY
follows, no completion's budget runs (the runner gives set-up its own limit, warm_up_timeout_s)."""
READY = "ready"
"""A frame a worker sends when it is ready: first when it starts, then after each WARMING. A
completion's budget starts with it."""


def _warm(fn: Callable, replies: int) -> None:
    """Call fn's `warm_up(starting)` hook if it has one (math_accuracy: start math-verify's process).
    The hook calls `starting()` just before slow work, which sends WARMING; READY follows when it
    returns. A hook that raises is ignored here: the function's own call then fails with its reason."""
    hook = getattr(fn, "warm_up", None)
    if hook is None:
        return
    announced = False

    def starting() -> None:
        nonlocal announced
        if not announced:
            write_frame(replies, WARMING)
            announced = True

    try:
        hook(starting)
    except Exception:  # noqa: BLE001, S110 - the call that follows reports it on its rows
        pass
    if announced:
        write_frame(replies, READY)


def _serve(functions: list[Callable], requests: int, replies: int, warm: bool = False) -> None:
    """The worker's loop: a task is (function index, mode, prompts, completions, kwargs, the keys of
    the per-row columns); "batch" and "chunk" answer once, "items" calls the function on each
    completion alone (with its row of each per-row column) and answers after each. READY first, when the worker is
    up (with ``warm``: after every function's warm_up hook has run); before each call, the hook again (see _warm:
    a warm hook returns at once)."""
    if warm:  # started ahead of the first batch (RewardRunner.start): set up before saying READY
        for fn in functions:
            hook = getattr(fn, "warm_up", None)
            if hook is not None:
                try:
                    hook(lambda: None)
                except Exception:  # noqa: BLE001, S110 - the function's own call reports it on its rows
                    pass
    write_frame(replies, READY)
    while True:
        task = read_frame(requests)
        if task is None:
            return
        fn_index, mode, prompts, completions, kwargs, row_keys = task
        fn = functions[fn_index]
        if mode in ("batch", "chunk"):  # one call, one answer
            _warm(fn, replies)
            write_frame(replies, _call_rows(fn, prompts, completions, kwargs, row_keys))
            continue
        for i in range(len(completions)):
            _warm(fn, replies)
            one = {k: [v[i]] if k in row_keys else v for k, v in kwargs.items()}
            write_frame(replies, _call_rows(fn, [prompts[i]], [completions[i]], one, row_keys))


def _per_row(value: object, n: int) -> bool:
    return isinstance(value, (list, tuple)) and len(value) == n


class _Worker:
    """One forked worker process and its two pipes (parent side)."""

    def __init__(self, functions: list[Callable], warm: bool = False):
        def serve(parent: int, requests: int, replies: int) -> None:
            become_keeper(parent, (requests, replies))  # this process stays as the keeper; its child serves
            _serve(functions, requests, replies, warm)

        self.pid, self.to_child, self.from_child = fork_worker(serve, _WORKER_FDS)
        _WORKER_FDS.update((self.to_child, self.from_child))
        self.buffer = bytearray()
        self.task: _Task | None = None
        self.item_started = 0.0
        self.warming = True
        """Between fork (or a WARMING frame) and READY: setting up, no completion's budget runs."""
        self.warming_started = time.monotonic()

    def send(self, frame: bytes) -> None:
        write_all(self.to_child, frame)

    def read_replies(self) -> list | None:
        """The complete replies that have arrived (call when readable); None when the worker died."""
        chunk = os.read(self.from_child, 1 << 20)
        if not chunk:
            return None
        self.buffer += chunk
        out = []
        while len(self.buffer) >= FRAME_HEADER.size:
            size = FRAME_HEADER.unpack_from(self.buffer)[0]
            if len(self.buffer) < FRAME_HEADER.size + size:
                break
            out.append(pickle.loads(bytes(self.buffer[FRAME_HEADER.size : FRAME_HEADER.size + size])))
            del self.buffer[: FRAME_HEADER.size + size]
        return out

    def kill(self) -> None:
        """Stop the worker and everything it started, at any depth (its keeper kills the tree, see
        grpokit.scoring._keeper), reap the keeper, close the pipes."""
        stop_keeper(self.pid)
        for fd in (self.to_child, self.from_child):
            _WORKER_FDS.discard(fd)
            try:
                os.close(fd)
            except OSError:
                pass


@dataclass
class _Task:
    fn_index: int
    mode: str  # "batch" | "chunk" (several completions, one call, one completion's budget) | "items"
    rows: list[int]  # indices into the batch
    started: float = 0.0
    done: int = 0  # replies received ("items")
    attempts: int = 0  # workers found dead when it was sent
    warm_retries: int = 0  # workers killed because their set-up ran past warm_up_timeout_s
