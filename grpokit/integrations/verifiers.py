"""verifiers (pip install 'grpokit[verifiers]'): a Prime Intellect verifiers environment (single-turn,
multi-turn, tool) plays grpokit's multi-turn rollout, with its dataset as the rows and its rubric as the rewards.

    data:
      train: verifiers:my_env.py                   # the environment's dataset (dataset=eval: its eval dataset)
    rollout:
      environment: verifiers:my_env.py             # the same environment; its rubric's functions become rewards
      # or: verifiers:ENV_ID (an installed environment package), verifiers:pkg.module:make_env,
      # verifiers:my_env.py?difficulty=2 (arguments of its load_environment, read as YAML scalars)

Supported: verifiers' classic Environment API, verifiers 0.3.x (SUPPORTED; tested with 0.3.1, whose classic
modules 0.3.0 has with the same code). verifiers 0.4 keeps only verifiers.v1, whose agents call a model
through an OpenAI-compatible endpoint; another version, or a verifiers.v1 environment, is
:class:`UnsupportedVerifiersError`. Environments are loaded from an installed package (verifiers' own
load_environment: the module ENV_ID names) or a local module, never fetched at run time.

How an episode runs (:class:`VerifiersEpisode`, in grpokit's environment worker, one per episode): the
environment's own ``rollout()`` runs on an event loop of the worker's, with a client whose "model" is grpokit:
when the environment asks for the model's turn, ``reset``/``step`` return the messages it added since the last
turn (the prompt first, then its env_response: tool results, a game's reply), and the turn grpokit generated
is its answer, tool calls read with rollout.tool_parser when the environment offers tools (as vLLM's tool
parser would: a call that cannot be read stays text). The model's tokens are generated and trained by grpokit;
what the environment says is rendered by the chat template and masked (grpokit.rollout.multiturn). When the
episode is over, ``finish`` ends the environment's rollout (a turn cut at max_new_tokens is its last answer,
is_truncated, its calls not run; an episode grpokit ended, at rollout.max_turns or a budget, is told so through verifiers'
OverlongPromptError, its prompt_too_long stop), scores it with the rubric (``score_group`` of the one rollout,
then the rubric's cleanup, as verifiers does) and returns each function's score: each becomes a reward of the
run with its rubric weight (grpokit.rollout.episodes.environment_rewards). A reward the environment sets on a
trajectory step is that turn's reward (turn_rewards).

Not supported, each a named error: rubric functions that score a group together (they take states, prompts,
completions...: grpokit scores each episode in its own worker), two rubric functions of one name, an
environment that rewrites earlier turns (a get_prompt_messages whose messages do not extend the last turn's),
content that is not text, a row whose info.tool_defs differ from the environment's tools (the chat template
describes one set of tools per environment). verifiers' sampling_args are not read: rollout.* decide.
"""

from __future__ import annotations

import asyncio
import functools
import json
import signal
import threading
import time
import urllib.parse
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import yaml

from grpokit.core.errors import ConfigError
from grpokit.core.user_code import describe, load_module
from grpokit.rollout.envs import EnvStep
from grpokit.rollout.tools import get_parser
from grpokit.rollout.tools.parsers import OPEN

SUPPORTED = ((0, 3), (0, 4))
"""The verifiers versions whose classic Environment API grpokit drives: from the first (included) to the second."""
GRPOKIT_KEYS = ("dataset",)
"""Query keys grpokit reads itself; the others are the environment's load_environment arguments."""


class UnsupportedVerifiersError(ConfigError):
    """The installed verifiers, or the environment loaded, is not verifiers' classic Environment API (0.3.x)."""


def verifiers_module():
    """``verifiers``, imported, its version checked (:data:`SUPPORTED`); ConfigError when it is missing."""
    try:
        import verifiers
    except ImportError as e:
        raise ConfigError(
            f"verifiers environments need the verifiers package ({e}); pip install 'grpokit[verifiers]'"
        ) from e
    version = str(getattr(verifiers, "__version__", "unknown"))
    if not supported(version):
        low, high = (".".join(map(str, v)) for v in SUPPORTED)
        raise UnsupportedVerifiersError(
            f"verifiers {version} is installed; grpokit runs verifiers' classic Environment API (SingleTurnEnv, "
            f"MultiTurnEnv, ToolEnv with rubrics), which verifiers >={low},<{high} has (0.4 keeps only "
            f"verifiers.v1); pip install 'verifiers>={low},<{high}' (or 'grpokit[verifiers]')"
        )
    return verifiers


def supported(version: str) -> bool:
    """Whether ``version`` (PEP 440) is in :data:`SUPPORTED`."""
    from packaging.version import InvalidVersion, Version

    try:
        release = Version(version).release
    except InvalidVersion:
        return False
    return SUPPORTED[0] <= tuple(release[:2]) < SUPPORTED[1]


@dataclass(frozen=True)
class Source:
    """What 'verifiers:TARGET' names: ``name`` (an environment id, a file.py, or module:function /
    file.py:function), the arguments of its load_environment, and which of its datasets rows come from."""

    name: str
    arguments: str  # JSON of the load_environment arguments, keys sorted (the environment's cache key)
    dataset: str = "train"

    @property
    def kwargs(self) -> dict[str, Any]:
        return json.loads(self.arguments)


def parse_target(target: str, where: str) -> Source:
    """'NAME?key=value&...' -> Source; values are YAML scalars (``n=3`` an int, ``tags=[a,b]`` a list);
    ``dataset`` (train | eval) is grpokit's. ConfigError naming ``where`` otherwise."""
    name, _, query = target.partition("?")
    if not name:
        raise ConfigError(f"{where}: name an environment: verifiers:ENV_ID, verifiers:my_env.py or verifiers:module:fn")
    values: dict[str, Any] = {}
    for pair in filter(None, query.split("&")):
        key, sep, text = pair.partition("=")
        key, text = urllib.parse.unquote(key), urllib.parse.unquote(text)
        if not key or not sep:
            raise ConfigError(f"{where}: {pair!r} is not key=value")
        try:
            values[key] = yaml.safe_load(text)
        except yaml.YAMLError:
            values[key] = text
    dataset = str(values.pop("dataset", "train"))
    if dataset not in ("train", "eval"):
        raise ConfigError(f"{where}: dataset={dataset!r} must be train (the environment's dataset) or eval")
    try:
        arguments = json.dumps(values, sort_keys=True)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: the arguments {values!r} are not plain values ({e})") from None
    return Source(name, arguments, dataset)


_LOADED: dict[tuple[str, str], Any] = {}  # (name, arguments) -> the environment: one per process
_LOADING = threading.Lock()


def load(source: Source, where: str):
    """The verifiers Environment ``source`` names, made once per process (the data and the rollout share it,
    and the episodes' workers, forked from this process, inherit it); the handlers of SIGINT and SIGTERM it
    installs when made (its __post_init__) are put back as they were."""
    key = (source.name, source.arguments)
    with _LOADING:
        if key in _LOADED:
            return _LOADED[key]
        vf = verifiers_module()
        with _signals_kept():
            env = _make(vf, source, where)
        if not isinstance(env, vf.Environment):
            kind = f"{type(env).__module__}.{type(env).__qualname__}"
            v1 = " (verifiers.v1)" if kind.startswith("verifiers.v1") else ""
            raise UnsupportedVerifiersError(
                f"{where} gave a {kind}{v1}, not a verifiers Environment of the classic API (vf.SingleTurnEnv, "
                "vf.MultiTurnEnv, vf.ToolEnv, ...); grpokit runs those"
            )
        _LOADED[key] = env
        return env


def _make(vf, source: Source, where: str):
    """The environment: ``fn(**arguments)`` for module:function / file.py:function, the file's
    load_environment for file.py, verifiers' load_environment for an installed environment's id."""
    name, kwargs = source.name, source.kwargs
    if ":" in name or name.endswith(".py"):
        target, attr = name.rsplit(":", 1) if ":" in name else (name, "load_environment")
        module = load_module(target, attr, where, prefix="grpokit_vf_env")
        make = getattr(module, attr, None)
        if not callable(make):
            raise ConfigError(f"{where}: {target} has no function {attr!r} that makes the environment")
    else:
        import importlib.util

        module_name = name.replace("-", "_").split("/")[-1]  # verifiers' env_module_name
        try:
            found = importlib.util.find_spec(module_name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise ConfigError(
                f"{where}: no installed package provides the verifiers environment {name!r} (module "
                f"{module_name!r}); install it first (pip install, or prime env install), or name a local file "
                "(verifiers:path/to/env.py); grpokit never fetches an environment at run time"
            )
        make = functools.partial(vf.load_environment, name)
    try:
        return make(**kwargs)
    except ConfigError:
        raise
    except (Exception, SystemExit) as e:
        raise ConfigError(f"{where}: making the environment failed: {describe(e)}") from e


@contextmanager
def _signals_kept():
    """SIGINT's and SIGTERM's handlers as they were before the block (a verifiers Environment installs its own
    when made: SIGTERM would exit 143 after its teardown instead of grpokit's stop and exit codes)."""
    saved = {}
    if threading.current_thread() is threading.main_thread():
        saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            if handler is not None:
                signal.signal(sig, handler)


def rubric_functions(rubric, where: str) -> list[tuple[str, float]]:
    """[(name, weight)] of every function of the rubric (a RubricGroup's rubrics in order), the rewards the
    environment brings; ConfigError for a function that scores a group together or a name used twice."""
    out: list[tuple[str, float]] = []

    def walk(r):
        for sub in getattr(r, "rubrics", None) or ():
            walk(sub)
        for fn, weight in zip(getattr(r, "funcs", ()), getattr(r, "weights", ())):
            name = getattr(fn, "__name__", repr(fn))
            if r._is_group_func(fn):
                raise ConfigError(
                    f"{where}: its rubric's function {name!r} scores a group of rollouts together (it takes states, "
                    "prompts, completions, ...); grpokit scores each episode in its own worker, so make it score "
                    "one rollout (state, prompt, completion, answer, ...)"
                )
            if any(name == n for n, _ in out):
                raise ConfigError(
                    f"{where}: its rubric has two functions named {name!r}; verifiers adds their scores under "
                    "one name, so grpokit cannot tell them apart: rename one"
                )
            out.append((name, float(weight)))

    walk(rubric)
    return out


def tool_schemas(env) -> list[dict]:
    """The environment's tools (its tool_defs) as the chat template takes them (OpenAI's function schema)."""
    return [
        {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
        for t in (getattr(env, "tool_defs", None) or ())
    ]


def as_chat(message: Any) -> dict:
    """A verifiers message as grpokit's {"role", "content"} (a tool message keeps its tool_call_id); a string
    prompt's text message is a user message; ValueError for content that is not text."""
    data = message.model_dump() if hasattr(message, "model_dump") else dict(message)
    role = "user" if data.get("role") == "text" else str(data.get("role"))
    content = data.get("content")
    if content is None:
        content = ""
    elif not isinstance(content, str):
        parts = list(content)
        kinds = sorted({str(p.get("type")) for p in parts if p.get("type") != "text"})
        if kinds:
            raise ValueError(f"a {role} message holds {kinds[0]} content; grpokit's episodes are text")
        content = "".join(str(p.get("text", "")) for p in parts)
    out = {"role": role, "content": content}
    if role == "tool" and data.get("tool_call_id") is not None:
        out["tool_call_id"] = str(data["tool_call_id"])
    return out


@functools.cache
def _client_class(vf) -> type:
    """verifiers' Client whose model is grpokit: ``get_response`` hands the request over and waits for
    :meth:`answer`, a response built from the turn grpokit generated (or an error to raise in the rollout)."""

    class GrpokitTurns(vf.Client):
        def __init__(self):
            super().__init__(None)
            self.asked: asyncio.Future | None = None  # resolved when the rollout asks for a turn
            self.pending: asyncio.Future | None = None  # the turn it waits for
            self.prompt, self.tools, self.state = [], None, None

        async def get_response(self, prompt, model, sampling_args, tools=None, **kwargs):
            self.prompt, self.tools, self.state = prompt, tools, kwargs.get("state", self.state)
            self.pending = asyncio.get_running_loop().create_future()
            if self.asked is not None and not self.asked.done():
                self.asked.set_result(True)
            return await self.pending

        def answer(self, response=None, error: BaseException | None = None) -> None:
            pending, self.pending = self.pending, None
            if error is not None:
                pending.set_exception(error)
            else:
                pending.set_result(response)

        # the abstract methods of a client of a real API: never reached (get_response is the whole client)
        def setup_client(self, config):
            return None

        async def to_native_tool(self, tool):
            return tool

        async def to_native_prompt(self, messages):
            return messages, {}

        async def get_native_response(self, prompt, model, sampling_args, tools=None, **kwargs):
            raise NotImplementedError

        async def raise_from_native_response(self, response):
            return None

        async def from_native_response(self, response):
            return response

        async def close(self):
            return None

    return GrpokitTurns


class VerifiersEpisode:
    """One episode of a verifiers environment, grpokit's environment protocol (grpokit.rollout.envs) over the
    environment's own rollout (see the module docstring). :func:`environment_factory` makes a subclass with
    the environment, its rewards and tool schemas, the tool-call parser and where it was named."""

    vf_env: Any = None
    where: str = "verifiers"
    parser: Callable = staticmethod(get_parser("hermes"))
    hermes: bool = True  # the parser is grpokit's hermes: a call's text is left out of the message's content
    rewards: list[tuple[str, float]] = []
    tool_schemas: list[dict] = []

    def __init__(self):
        self.vf = verifiers_module()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.task: asyncio.Task | None = None
        self.client = None
        self.shown: list[dict] = []  # the messages of the environment's last request, as grpokit's dicts
        self.turn = 0
        self.calls = 0  # the tool calls of the turn answered last (the step's tools/calls)

    def reset(self, row: dict) -> list[dict]:
        self.loop = asyncio.new_event_loop()
        self.client = _client_class(self.vf)()
        self.task = self.loop.create_task(self.vf_env.rollout(dict(row), self.client, "grpokit", {}))
        if not self._advance():
            raise RuntimeError(f"the environment's rollout ended before the model's first turn{self._why()}")
        names = sorted(t["function"]["name"] for t in self.tool_schemas)
        asked = sorted(t.name for t in self.client.tools or ())
        if asked != names:
            raise ValueError(
                f"the row's tools {asked} are not the environment's {names} (a row's info.tool_defs): the chat "
                "template describes one set of tools per environment"
            )
        self.shown = [as_chat(m) for m in self.client.prompt]
        return [dict(m) for m in self.shown]

    def step(self, text: str) -> EnvStep:
        self.client.answer(self._response(text, truncated=False))
        asked = self._advance()
        reward = self._turn_reward()
        self.turn += 1
        calls, self.calls = self.calls, 0
        if not asked:  # the rollout ended: its last word, if it has one (final_env_response)
            final = self.task.result().get("final_env_response") or []
            return EnvStep([as_chat(m) for m in final], reward, done=True, tool_calls=calls)
        messages = [as_chat(m) for m in self.client.prompt]
        k = len(self.shown)
        if messages[:k] != self.shown or len(messages) <= k or messages[k]["role"] != "assistant":
            raise ValueError(
                "the environment's next request does not extend the conversation with the model's turn (its "
                "get_prompt_messages rewrites earlier turns); grpokit trains on one transcript per episode"
            )
        self.shown = messages
        return EnvStep(messages[k + 1 :], reward, done=False, tool_calls=calls)

    def finish(self, last_text: str | None) -> dict[str, float | None]:
        """End the environment's rollout (see the module docstring), score it with the rubric and return each
        function's score by name."""
        if self.task is None:
            return {}
        if not self.task.done() and last_text is not None:
            self.client.answer(self._response(last_text, truncated=True))
            self._advance()
        while not self.task.done():  # it asks for another turn: grpokit ended the episode
            self.client.answer(error=self.vf.OverlongPromptError("the episode ended in grpokit (turns or budget)"))
            self._advance()
        state = self.task.result()
        self.loop.run_until_complete(self._score(state))
        metrics = state.get("metrics") or {}
        return {name: metrics.get(name) for name, _ in self.rewards}

    async def _score(self, state) -> None:
        rubric = self.vf_env.rubric
        if self.vf_env.score_rollouts:
            await rubric.score_group([state])
        else:
            await rubric.dummy_score_group([state])
        await rubric.cleanup(state)

    def close(self) -> None:
        if self.loop is not None and not self.loop.is_closed():
            if self.task is not None and not self.task.done():
                self.task.cancel()
                self.loop.run_until_complete(asyncio.gather(self.task, return_exceptions=True))
            self.loop.close()

    def _advance(self) -> bool:
        """Run the environment's rollout until it asks for the model's next turn (True) or ends (False; an
        exception of its own is raised here)."""
        self.client.asked = self.loop.create_future()
        self.loop.run_until_complete(asyncio.wait({self.task, self.client.asked}, return_when=asyncio.FIRST_COMPLETED))
        if self.task.done():
            self.task.result()
            return False
        return True

    def _why(self) -> str:
        error = self.task.result().get("error") if self.task.done() else None
        return f" (its state's error: {describe(error)})" if error is not None else ""

    def _turn_reward(self) -> float | None:
        state = self.task.result() if self.task.done() else self.client.state
        steps = (state or {}).get("trajectory") or []
        reward = steps[self.turn].get("reward") if len(steps) > self.turn else None
        return float(reward) if isinstance(reward, (int, float)) and not isinstance(reward, bool) else None

    def _response(self, text: str, truncated: bool):
        """The turn as verifiers' Response: its tool calls (when the environment offers tools) read with the
        run's parser, those that cannot be read left as text (as vLLM's tool parser leaves them); a turn cut
        short calls nothing (as grpokit's own tool environment runs no call of an unfinished turn)."""
        from verifiers.types import Response, ResponseMessage, ToolCall

        calls = [c for c in self.parser(text) if c.error is None] if self.client.tools and not truncated else []
        content: str | None = text
        if calls and self.hermes and OPEN in text:
            content = text[: text.find(OPEN)] or None
        tool_calls = [
            ToolCall(id=f"call_{self.turn}_{k}", name=c.name, arguments=json.dumps(c.arguments))
            for k, c in enumerate(calls)
        ]
        self.calls = len(tool_calls)
        reason = "length" if truncated else ("tool_calls" if tool_calls else "stop")
        message = ResponseMessage(
            content=content, tool_calls=tool_calls or None, finish_reason=reason, is_truncated=truncated
        )
        return Response(id=f"grpokit-{self.turn}", created=int(time.time()), model="grpokit", message=message)


def environment_factory(target: str, spec: str, rollout_cfg=None) -> type[VerifiersEpisode]:
    """The environment of 'verifiers:TARGET' (grpokit.rollout.episodes.ENVIRONMENT_KINDS): a VerifiersEpisode
    subclass over the loaded environment, its rubric's functions as ``rewards`` and its tools' schemas; tool
    calls read with ``rollout_cfg.tool_parser`` (hermes without one). ``dataset=`` is the data's key, ignored."""
    where = f"rollout.environment={spec!r}"
    env = load(parse_target(target, where), where)
    parser_name = getattr(rollout_cfg, "tool_parser", None) or "hermes"
    attributes = {
        "vf_env": env,
        "where": spec,
        "parser": staticmethod(get_parser(parser_name)),
        "hermes": parser_name == "hermes",
        "rewards": rubric_functions(env.rubric, where),
        "tool_schemas": tool_schemas(env),
        "__module__": __name__,
    }
    return type("VerifiersEnvironment", (VerifiersEpisode,), attributes)


def load_rows(target: str, source: str, prompt_column: str | None, limit: int | None) -> list[dict]:
    """The data loader of 'verifiers:TARGET' (grpokit.data.prompts.SOURCE_KINDS): the environment's dataset
    (``dataset=eval``: its eval dataset) as rows, every column kept (prompt, answer, info, task, example_id);
    the prompt's messages without the keys Arrow filled with None."""
    where = f"data: {source!r}"
    if prompt_column not in (None, "prompt"):
        raise ConfigError(
            f"{where}: a verifiers environment's rows hold their prompt in 'prompt'; set data.prompt_column=prompt"
        )
    src = parse_target(target, where)
    env = load(src, where)
    dataset = env.build_eval_dataset() if src.dataset == "eval" else env.build_dataset()
    if dataset is None:
        raise ConfigError(
            f"{where}: the environment has no {'eval ' if src.dataset == 'eval' else ''}dataset; "
            f"use dataset={'train' if src.dataset == 'eval' else 'eval'} or give rows of your own"
        )
    if limit is not None:
        dataset = dataset.select(range(min(limit, len(dataset))))
    rows = dataset.to_list()
    for row in rows:
        if isinstance(row.get("prompt"), list):
            row["prompt"] = [
                {k: v for k, v in m.items() if v is not None} if isinstance(m, dict) else m for m in row["prompt"]
            ]
    return rows
