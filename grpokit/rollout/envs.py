"""Environments for multi-turn rollouts: what answers the model between its turns.
(Over 500 lines: the environment protocol, its checks and the per-episode worker processes that run it
(EnvProcess, EnvPool) belong together: the checks run inside the workers.)

The protocol (one instance per episode, made by a factory with no arguments, TRL's ``environment_factory``):

    class Env:
        def reset(self, row: dict) -> list[dict]:      # the dataset row -> the first messages
            ...
        def step(self, text: str) -> EnvStep:          # the model's turn (decoded) -> what comes back
            ...

``EnvStep.messages`` are appended to the conversation (rendered by the chat template; role "tool" for
tool results, "user" for a game's or a simulated user's reply, or "system"); ``reward`` is an optional
per-turn reward (it reaches reward functions as the ``turn_rewards`` column and drives ``grpo_process``,
each turn a step); ``done`` ends the episode. An empty ``messages`` list ends it too. ``reset`` must give
the same messages for the same row (the G episodes of a group share their prompt).

An environment may also score the episode as a whole (verifiers' rubrics, grpokit.integrations.verifiers):

        def finish(self, last_text: str | None) -> dict[str, float | None]:   # once the episode is over
            ...

``finish`` is called in the episode's worker once the episode has ended (done, max_turns, the token or time
budget; never after the environment failed, nor when its worker was stopped by a time budget): ``last_text``
is the model's last turn when the environment was not stepped on it (cut at max_new_tokens or by the episode's
token budget), else None. What it returns, {name: score or None} (checked: :func:`check_scores`), reaches reward
functions as the column ``env_scores``; a factory's ``rewards`` attribute, [(name, weight)], makes each name a
reward of the run (grpokit.rollout.episodes.environment_rewards).

What an environment answers is checked (:func:`check_first`, :func:`check_step`): a list of messages, each
a dict with a known role and string fields; a reward None or a finite number; ``done`` a bool. Their text
is data (invalid Unicode replaced; a step's message cut at ``max_chars``). In the trainer each episode's
environment lives in its own forked worker (:class:`EnvPool`), each ``reset``/``step`` within a time
budget; a raise, a hang, a crash or a wrong answer fails that episode with a message naming the
environment, the method and the row (grpokit.rollout.multiturn).

:class:`ToolEnvironment` is the environment of tool use: the model's turn is parsed for tool calls
(grpokit.rollout.tools.parsers), each runs on a :class:`~grpokit.rollout.tools.ToolRunner`, and the results come back
as ``tool`` messages; a turn without a call is the answer and ends the episode.

An environment can offer tools too (verl's tool agent loop with an interaction, verifiers' ToolEnv): its
class's ``tools`` attribute (functions or names, as ``rollout.tools``) and ``rollout.tools`` are described
to the model; :class:`EnvironmentWithTools` runs each turn's calls on the tool runner, then steps the
environment, which sees the turn and, when its ``step`` takes a ``tool_results`` argument, the calls and
what they gave. The tool messages come first, the environment's after; the episode goes on while either
answered something and the environment has not said done.

Episodes are kept apart: no value one episode stores is read by another. Each episode's environment is
made in a worker forked for that episode alone (its module's globals and class attributes start as the
trainer's, never as another episode left them), and the tools an environment offers run on workers of the
episode's own (:class:`EpisodeTools`), killed when the episode ends, except those the environment names
in its ``shared_tools`` attribute, which run on the run's tool workers beside ``rollout.tools`` (a cache, an
index loaded once). An environment may have ``close()``: it is called in its worker when the episode ends
(a session to end, a file to remove). Every worker has a keeper (grpokit.rollout.tools.runner): whatever an
environment or a tool starts is killed with it, at any depth, when the episode ends, the run closes, or the
process that made the workers (the trainer, the asynchronous sampler's process) dies.

A worker killed from outside grpokit is said so, named with its pid and the signal (grpokit.rollout.tools.runner:
``Worker.report``): a SIGTERM or SIGINT sent to it stops the run after its step, as one sent to the trainer does;
its episode, which cannot go on without it, ends there, cut (:class:`WorkerLost`: truncated, as when its time runs
out, never a failure of the environment); so does a SIGKILL's (the OOM killer's), a SIGHUP's or a SIGQUIT's, the
run going on with a line. A reset whose worker is killed so is made again on a fresh worker. A worker that ends by
another signal (a crash: SIGSEGV, SIGABRT) fails its episode, as one that exits does.
"""

from __future__ import annotations

import functools
import inspect
import math
import numbers
import os
import pickle
import signal
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from grpokit.core.chat_text import clean_text, cut_text
from grpokit.core.workers import OutputTail, WorkerPool, read_frame, write_frame
from grpokit.rollout.tools.parsers import ToolCall
from grpokit.rollout.tools.runner import ToolResult, ToolRunner, Worker, stop_workers
from grpokit.rollout.tools.spec import Tool, echo

FIRST_ROLES = ("system", "developer", "user", "assistant", "tool", "ipython")
"""Roles the first messages (reset) may have ("ipython": Llama 3's role of tool results)."""
STEP_ROLES = ("user", "tool", "ipython", "system")
"""Roles an environment's answer may have: never "assistant" (the model's turns are its own tokens)."""


@dataclass
class EnvStep:
    """What the environment answers to one model turn."""

    messages: list[dict] = field(default_factory=list)
    reward: float | None = None
    done: bool = False
    tool_calls: int = 0  # counted by the tool environment for the step metrics
    tool_errors: int = 0
    tool_timeouts: int = 0
    over_budget: bool = False  # set by the tool environment: the episode's or the step's time ran out


@dataclass
class Finished:
    """What ``finish`` gave, with the environment's ``state()`` when it has one (TRL's environments: the copy of the
    instance reward functions read as ``environments``, grpokit.integrations.trl_environment)."""

    scores: dict | None
    state: object = None


def finish_environment(env: object, last_text: str | None) -> object:
    """``env.finish(last_text)`` (None without one), with ``env.state()`` as a :class:`Finished` when it has that."""
    scores = env.finish(last_text) if callable(getattr(env, "finish", None)) else None
    return Finished(scores, env.state()) if callable(getattr(env, "state", None)) else scores


class Environment(Protocol):
    def reset(self, row: dict) -> list[dict]: ...

    def step(self, text: str) -> EnvStep: ...


def first_messages(row: dict, prompt_column: str, system_prompt: str | None = None) -> list[dict]:
    """The row's prompt as chat messages: a string becomes one user message; a system prompt goes first."""
    prompt = row[prompt_column]
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
    if system_prompt is not None and messages[0]["role"] not in ("system", "developer"):
        messages.insert(0, {"role": "system", "content": system_prompt})
    return messages


class EpisodeTools:
    """The tools one episode may call, with ToolRunner's ``call(call, budget_s)`` and ``tools``: ``own`` (the
    environment's tools it has not named shared) on a runner of the episode's own, whose worker is forked on
    the episode's first call and killed by :meth:`close` when the episode ends, so that no value a tool keeps
    crosses episodes; every other tool on ``shared``, the run's runner (rollout.tools and the environment's
    ``shared_tools``). ``settings``: ToolRunner's keywords (timeout_s, max_result_chars, memory_mb)."""

    def __init__(self, shared: ToolRunner | None, own: list[Tool], settings: dict):
        self.shared = shared
        self.own = ToolRunner(own, workers=1, **settings) if own else None
        self.tools = {**(shared.tools if shared else {}), **(self.own.tools if self.own else {})}

    def call(self, call: ToolCall, budget_s: float | None = None) -> ToolResult:
        name = call.name if isinstance(call, ToolCall) else None
        if isinstance(call, ToolCall) and call.error is None and name not in self.tools:
            return ToolResult(f"Error: there is no tool {echo(name)}; the tools are {sorted(self.tools)}", error=True)
        if self.own is not None and (name in self.own.tools or self.shared is None):
            return self.own.call(call, budget_s)
        return self.shared.call(call, budget_s)

    def workers(self) -> list[Worker]:
        """The episode's own live tool workers (to stop several episodes' at once: stop_workers)."""
        return self.own.workers.live if self.own is not None else []

    def close(self) -> None:
        """Kill the episode's own tool workers (and everything they started); the shared runner stays."""
        if self.own is not None:
            self.own.close()


class ToolEnvironment:
    """Tool use as an environment: calls in the model's turn are run and their results sent back."""

    def __init__(
        self,
        runner: ToolRunner,
        parser: Callable[[str], list[ToolCall]],
        prompt_column: str = "prompt",
        system_prompt: str | None = None,
    ):
        self.runner, self.parser = runner, parser
        self.prompt_column, self.system_prompt = prompt_column, system_prompt

    def reset(self, row: dict) -> list[dict]:
        return first_messages(row, self.prompt_column, self.system_prompt)

    def step(self, text: str) -> EnvStep:
        return self.step_until(text, None)

    def step_until(self, text: str, deadline: float | None) -> EnvStep:
        """The step, its calls run within what is left before ``deadline`` (time.monotonic; None: no
        limit but each call's): a call the deadline stops or keeps from starting ends the episode
        (``over_budget``). A parser that raises is an error message to the model, not a crash."""
        out, results = run_calls(self.runner, self.parser, text, deadline)
        if not results:
            return EnvStep(done=True)  # an answer without a call ends the episode
        return out


def run_calls(
    runner: ToolRunner, parser: Callable[[str], list[ToolCall]], text: str, deadline: float | None
) -> tuple[EnvStep, list[dict]]:
    """The tool calls in a model turn, run one after the other on ``runner`` within what is left before
    ``deadline``: an EnvStep of their ``tool`` messages and counts (``over_budget`` when the deadline
    stopped a call or kept it from starting; the calls after it are not run), and per call run
    {"name", "arguments", "content", "error"} (what an environment's step sees as ``tool_results``).
    A parser that raises, or gives something else than ToolCalls, is an error message to the model."""
    try:
        calls = parser(text)
        if not isinstance(calls, list):
            raise TypeError(f"it returned a {type(calls).__name__}, not a list of ToolCall")
    except Exception as e:  # noqa: BLE001 - the model's text broke the parser: the model reads it
        calls = [ToolCall(None, error=f"the tool calls could not be read ({type(e).__name__})")]
    out, results = EnvStep(), []
    for call in calls:
        left = None if deadline is None else deadline - time.monotonic()
        if not isinstance(call, ToolCall):
            call = ToolCall(None, error=f"the parser gave a {type(call).__name__}, not a ToolCall")
        result = runner.call(call, left)
        known = isinstance(call.name, str) and call.name in runner.tools
        out.messages.append(
            {"role": "tool", "name": call.name if known else "unknown", "content": result.content}
        )
        results.append(
            {
                "name": call.name if known else None,
                "arguments": call.arguments if known else None,
                "content": result.content,
                "error": bool(result.error),
            }
        )
        out.tool_calls += int(not result.over_budget or result.timed_out)
        out.tool_errors += int(result.error and (not result.over_budget or result.timed_out))
        out.tool_timeouts += int(result.timed_out)
        if result.over_budget:
            out.over_budget = True
            break
    return out, results


def takes_tool_results(step: Callable) -> bool:
    """Whether an environment's ``step`` takes the turn's tool results (a ``tool_results`` argument, or
    ``**kwargs``); one that does not is called with the turn's text alone."""
    try:
        params = inspect.signature(step).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "tool_results" or p.kind is p.VAR_KEYWORD for p in params)


def step_environment(env: object, text: str, tool_results: list[dict] | None) -> object:
    """``env.step(text)``, or ``env.step(text, tool_results=...)`` when its step takes them (an empty list
    when no tools are offered)."""
    if takes_tool_results(env.step):
        return env.step(text, tool_results=tool_results or [])
    return env.step(text)


class EnvironmentWithTools:
    """An environment that offers tools. Each model turn: its calls run on ``runner`` (the tool workers,
    as for rollout.tools; errors, timeouts and cut results are messages the model reads), then the
    environment steps, seeing the turn's text and, when its step takes ``tool_results``, the calls run
    (:func:`run_calls`). What comes back: the tool messages, then the environment's (checked,
    :func:`check_step`), the environment's reward and ``done``. An episode whose time ran out during
    the calls ends there, the environment not stepped.

    ``env``: an :class:`EnvProcess` (the trainer: its own killable worker) or an environment object
    (stepped in the caller's thread). ``reset(row, until)`` / ``step(text, until)``, as EnvProcess."""

    def __init__(
        self, env: object, runner: ToolRunner, parser: Callable[[str], list[ToolCall]], max_chars: int | None
    ):
        self.env, self.runner, self.parser, self.max_chars = env, runner, parser, max_chars

    def reset(self, row: dict, until: float | None = None) -> object:
        if isinstance(self.env, EnvProcess):
            return self.env.reset(row, until)
        return self.env.reset(row)

    def finish(self, last_text: str | None, until: float | None = None) -> object:
        if isinstance(self.env, EnvProcess):
            return self.env.finish(last_text, until)
        return self.env.finish(last_text)

    def step(self, text: str, until: float | None = None) -> EnvStep:
        calls, results = run_calls(self.runner, self.parser, text, until)
        if calls.over_budget:
            return calls
        if isinstance(self.env, EnvProcess):
            value = self.env.step(text, until, tool_results=results)
        else:
            value = step_environment(self.env, text, results)
        try:
            answer = check_step(value, self.max_chars)
        except ValueError as e:
            raise EnvFailure(f"step {e}") from None
        return EnvStep(
            calls.messages + answer.messages,
            answer.reward,
            answer.done,
            calls.tool_calls + answer.tool_calls,
            calls.tool_errors + answer.tool_errors,
            calls.tool_timeouts + answer.tool_timeouts,
            over_budget=answer.over_budget,
        )


class EnvFailure(Exception):
    """One episode's environment failed (raised, hung, crashed, answered something that is not an answer)."""


class WorkerLost(TimeoutError):
    """One episode's environment worker was killed from outside grpokit (a signal of CUT_BY): the episode ends
    there as when its time runs out (a TimeoutError: truncated; counted in episodes/worker_lost), not as a failure
    of the environment."""


CUT_BY = (signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
"""Signals that come from outside an environment's code (a user's kill, the OOM killer's SIGKILL): a worker they
kill cuts its episode (WorkerLost); any other signal is the environment crashing (EnvFailure)."""


def check_messages(value: object, roles: tuple[str, ...], max_chars: int | None) -> list[dict]:
    """``value`` as a list of messages with their text as data, or ValueError saying what is wrong: each
    message a dict with a role of ``roles`` and string values (content, name, ...); text cleaned of invalid
    Unicode and cut at ``max_chars`` (None: not cut)."""
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"gave a {type(value).__name__} where a list of messages was expected")
    out = []
    for k, m in enumerate(value):
        if not isinstance(m, dict):
            raise ValueError(f"message {k} is a {type(m).__name__}, not a dict with 'role' and 'content'")
        role = m.get("role")
        if role not in roles:
            shown = repr(role) if isinstance(role, str) else f"a {type(role).__name__}"
            raise ValueError(f"message {k} has the role {shown[:60]}, which is not one of {list(roles)}")
        if not isinstance(m.get("content"), str):
            raise ValueError(
                f"message {k} ({role}) has content of type {type(m.get('content')).__name__}, not str"
            )
        clean = {"role": role}
        for key, v in m.items():
            if key == "role":
                continue
            if not isinstance(key, str) or not isinstance(v, str):
                raise ValueError(
                    f"message {k} ({role}): the value of {str(key)[:40]!r} is a {type(v).__name__}, not str"
                )
            v = clean_text(v)
            clean[key] = cut_text(v, max_chars) if max_chars is not None and key == "content" else v[:200]
        out.append(clean)
    return out


def check_first(value: object) -> list[dict]:
    """The first messages a reset gave, checked (:func:`check_messages`), or ValueError."""
    messages = check_messages(value, FIRST_ROLES, None)
    if not messages:
        raise ValueError("gave no messages")
    return messages


def check_step(value: object, max_chars: int | None) -> EnvStep:
    """The EnvStep a step gave, checked: its messages (:func:`check_messages`, roles STEP_ROLES), a reward
    None or a finite number, done a bool, the counters integers; or ValueError saying what is wrong."""
    if not isinstance(value, EnvStep):
        raise ValueError(f"returned a {type(value).__name__}, not an EnvStep")
    messages = check_messages([] if value.messages is None else value.messages, STEP_ROLES, max_chars)
    reward = value.reward
    if reward is not None:
        if isinstance(reward, bool) or not isinstance(reward, numbers.Real):
            raise ValueError(f"gave a reward of type {type(reward).__name__}; a reward is a number or None")
        try:
            reward = float(reward)
        except (OverflowError, ValueError, TypeError):
            raise ValueError(f"gave a reward ({type(reward).__name__}) that is not a finite float") from None
        if not math.isfinite(reward):
            raise ValueError(f"gave the reward {reward}; a reward must be finite")
    done = value.done
    if not (isinstance(done, (bool, numbers.Integral)) and done in (0, 1)) and type(done).__name__ != "bool_":
        raise ValueError(f"gave done of type {type(done).__name__}, not a bool")  # (numpy's bool_ is one)
    counts = (value.tool_calls, value.tool_errors, value.tool_timeouts)
    if not all(isinstance(c, numbers.Integral) and c >= 0 for c in counts):
        raise ValueError("gave tool_calls/tool_errors/tool_timeouts that are not counts (integers >= 0)")
    return EnvStep(messages, reward, bool(done), *map(int, counts), over_budget=value.over_budget is True)


def check_scores(value: object) -> dict[str, float | None]:
    """The scores a ``finish`` gave, checked: a dict of str names to finite numbers or None; or ValueError."""
    if not isinstance(value, dict):
        raise ValueError(f"returned a {type(value).__name__}, not a dict {{name: score}}")
    out: dict[str, float | None] = {}
    for name, score in value.items():
        if not isinstance(name, str):
            raise ValueError(f"gave a score named by a {type(name).__name__}, not a str")
        if score is None:
            out[name] = None
            continue
        if isinstance(score, bool) or not isinstance(score, numbers.Real) or not math.isfinite(float(score)):
            raise ValueError(f"gave the score {name}={str(score)[:40]}, not a finite number or None")
        out[name] = float(score)
    return out


def describe_error(e: BaseException) -> str:
    """ "Type: message (at file:line in function)", cut, for a failure message."""
    try:
        text = f"{type(e).__name__}: {e}"
    except Exception:  # noqa: BLE001 - str(e) raised
        text = type(e).__name__
    frames = traceback.extract_tb(e.__traceback__)
    if frames:
        last = frames[-1]
        text += f" (at {os.path.basename(last.filename)}:{last.lineno} in {last.name})"
    return cut_text(clean_text(text), 500)


def _serve_environment(factory: Callable[[], object], requests: int, replies: int) -> None:
    """An environment worker's loop: ("reset", row) makes a fresh environment and resets it, ("step", (text,
    tool_results)) steps it (:func:`step_environment`), ("finish", last_text) calls its ``finish`` (None when it
    has none), ("close", None) calls its ``close()`` if it has one; the reply ("ok", value, printed) or ("error",
    method, reason, printed)."""
    output = OutputTail(2000)
    env = None
    while True:
        request = read_frame(requests)
        if request is None:
            return
        op, arg = request
        method = "step"
        try:
            if op == "reset":
                method, env = "its factory", None
                env = factory()
                method = "reset"
                value = env.reset(arg)
            elif op == "close":
                method, value = "close", None
                if env is not None and callable(getattr(env, "close", None)):
                    env.close()
            elif env is None:
                raise RuntimeError(f"{op} before reset")
            elif op == "finish":
                method = "finish"
                value = finish_environment(env, arg)
            else:
                text, tool_results = arg
                value = step_environment(env, text, tool_results)
            data = pickle.dumps(("ok", value, output.take()))
        except BaseException as e:  # noqa: BLE001 - SystemExit and all: that episode fails, named
            data = pickle.dumps(("error", method, describe_error(e), output.take(0.2)))
        write_frame(replies, _Raw(data))


class _Raw(bytes):
    """Already pickled (so that an unpicklable value is an error reply, not a dead worker)."""

    def __reduce__(self):
        return (pickle.loads, (bytes(self),))


class EnvProcess:
    """One episode's environment in its own forked worker: ``reset(row)`` forks a fresh worker (a worker
    serves one episode: the one that served the last reset is retired first) and makes and resets the
    environment there (the factory), ``step(text)`` steps it, each within ``timeout_s`` (or less: ``until``);
    past it the worker is killed with what it started. A raise, a hang, a crash or an
    answer that cannot be sent back raises :class:`EnvFailure`; a stop at ``until`` before ``timeout_s``
    raises TimeoutError (the episode's or the step's time ran out). The answer is not checked here."""

    def __init__(self, pool: EnvPool):
        self.pool = pool
        self.worker: Worker | None = None
        self.printed = ""
        self.served = False  # the worker has served a reset: the next reset gets a fresh one

    def reset(self, row: dict, until: float | None = None) -> object:
        """The environment made and reset on a fresh worker; made again on another when that one is killed from
        outside (WorkerLost: a reset starts from nothing)."""
        try:
            return self._call("reset", row, until)
        except WorkerLost:
            return self._call("reset", row, until)

    def step(self, text: str, until: float | None = None, tool_results: list[dict] | None = None) -> object:
        """The environment's step on the turn's text (and, when it offers tools, the turn's tool results)."""
        return self._call("step", (text, tool_results), until)

    def finish(self, last_text: str | None, until: float | None = None) -> object:
        """The environment's ``finish(last_text)`` (see the module docstring); None when the episode's worker
        was stopped (a time budget, a failure): nothing is left to score."""
        if self.worker is None:
            return None
        return self._call("finish", last_text, until)

    def _call(self, op: str, arg: object, until: float | None) -> object:
        if op == "reset" and self.served:
            self.kill()  # one episode per worker: nothing the last one stored is there
        if self.worker is None:
            if op == "step":
                raise EnvFailure("step: its worker was replaced after a failure; the episode cannot go on")
            self.worker = self.pool.spawn()
        self.served = self.served or op == "reset"
        timeout = self.pool.timeout_s
        cut = until is not None and until - time.monotonic() < timeout
        if cut:
            timeout = until - time.monotonic()
            if timeout <= 0:
                raise TimeoutError
        try:
            reply = self.worker.call(op, arg, timeout)
        except TimeoutError:
            self.kill()
            if cut:
                raise
            raise EnvFailure(
                f"{op}: did not finish within {self.pool.timeout_s:g} s (rollout.env_timeout_s)"
            ) from None
        except Exception as e:  # noqa: BLE001 - a reply that cannot be read back
            self.kill()
            raise EnvFailure(
                f"{op}: its answer could not be read back ({type(e).__name__}: {str(e)[:200]})"
            ) from None
        if reply is None:
            worker, lost = self.worker, self.worker.lost()
            self.kill()
            if lost is None:
                raise EnvFailure(f"{op}: its worker process died (it exited or was killed)")
            name = signal.Signals(lost).name
            if lost in CUT_BY:
                again = "a fresh worker makes it again" if op == "reset" else "its episode ends there, cut (truncated)"
                worker.report(f"{again}; the run goes on")
                raise WorkerLost(f"{op}: its worker was killed by {name}")
            worker.report("its episode fails")
            raise EnvFailure(f"{op}: its worker process was killed by {name}")
        self.printed = reply[-1]
        if reply[0] == "ok":
            return reply[1]
        tail = f"; it printed: {reply[3][-300:]!r}" if reply[3].strip() else ""
        raise EnvFailure(f"{reply[1]} raised {reply[2]}{tail}")

    def kill(self) -> None:
        if self.worker is not None:
            self.pool.workers.retire(self.worker)
            self.worker = None
        self.served = False


def finishes(env: object) -> bool:
    """Whether an episode's environment has ``finish``: an :class:`EnvProcess` when its factory (a class) has
    one, :class:`EnvironmentWithTools` when the environment it wraps does, another object by its own."""
    if isinstance(env, EnvProcess):
        return callable(getattr(env.pool.factory, "finish", None))
    if isinstance(env, EnvironmentWithTools):
        return finishes(env.env)
    return not isinstance(env, ToolEnvironment) and callable(getattr(env, "finish", None))


class EnvPool:
    """The trainer's environment workers: one per episode, forked at its reset and killed when it ends
    (``end_episodes``), a timeout or a crash. ``environments(n)``: n handles for a rollout's episodes.
    ``close_timeout_s``: the time an environment's ``close()`` gets when its episode ends."""

    def __init__(self, factory: Callable[[], object], timeout_s: float, close_timeout_s: float = 10.0):
        if timeout_s <= 0:
            raise ValueError("timeout_s must be > 0")
        self.factory, self.timeout_s = factory, timeout_s
        self.close_timeout_s = min(timeout_s, close_timeout_s)
        self._handles: list[EnvProcess] = []
        self._lock = threading.Lock()  # the handles
        self.workers = WorkerPool("envs")  # forked on its thread (episodes step in threads), killed at close

    def spawn(self) -> Worker:
        serve = functools.partial(_serve_environment, self.factory)
        return self.workers.spawn(functools.partial(Worker, serve, "environment worker"))

    def environments(self, n: int) -> list[EnvProcess]:
        with self._lock:
            while len(self._handles) < n:
                self._handles.append(EnvProcess(self))
            return self._handles[:n]

    def end_episodes(self) -> None:
        """The episodes are over: each environment's ``close()`` (when it has one; all at once, within
        ``close_timeout_s``), then every worker killed with what it started (their keepers at once)."""
        with self._lock:
            handles = [h for h in self._handles if h.worker is not None]
        if callable(getattr(self.factory, "close", None)):
            deadline = time.monotonic() + self.close_timeout_s
            sent = []
            for h in handles:
                try:
                    write_frame(h.worker.to_child, ("close", None), deadline)
                    sent.append(h)
                except (OSError, TimeoutError):
                    pass
            for h in sent:  # (what close() gave is not needed: the worker is killed next either way)
                try:
                    read_frame(h.worker.from_child, deadline)
                except (OSError, TimeoutError, pickle.UnpicklingError, EOFError):
                    pass
        workers = [h.worker for h in handles]
        for h in handles:
            h.worker, h.served = None, False
        stop_workers(workers)
        for w in workers:
            self.workers.retire(w)  # (already killed: only forgotten)

    def close(self) -> None:
        """Kill every worker (call when done; the pool also does when it is collected)."""
        if os.getpid() != self.workers.owner:
            return
        with self._lock:
            handles, self._handles = self._handles, []
        for h in handles:
            h.worker = None  # killed with the rest just below
        self.workers.close()
