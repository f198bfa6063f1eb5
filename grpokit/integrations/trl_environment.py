"""TRL's ``environment_factory`` (GRPOTrainer(..., environment_factory=Env)) as a grpokit environment:
rollout.environment = "trl:module:Env" (what the TRL call writes; grpokit.rollout.episodes.ENVIRONMENT_KINDS).

TRL's contract, kept:

    class Env:
        def reset(self, **row) -> str | None:       # the row's columns; a string is appended to the prompt's last message
            ...
        def guess(self, word: str) -> str:           # every public method is a tool (type hints, a docstring)
            \"\"\"...\"\"\"
        def get_reward(self) -> float:               # optional: the episode's reward, named after the class, weight 1
            ...

    def reward(environments, **kwargs):              # reward functions may read the episodes' environments
        return [env.reward for env in environments]

Each episode has its own instance, made and reset in the episode's environment worker (grpokit.rollout.envs), and
its tools run there too, on that instance, so their effects are the instance's state as in TRL. A model turn's tool
calls (read with rollout.tool_parser, hermes by default) are run in order; each result comes back as a tool
message, ``str(result)`` as TRL writes it (a list of content parts as it is), a failure as TRL's ``{'error': ...}``;
a turn without a call ends the episode. ``async def`` methods are awaited.

What reward functions get as ``environments`` is a copy of each episode's instance at its end: an object of the
class (its methods work) holding the instance's attributes that can be pickled (a client's socket cannot; reading
such an attribute raises AttributeError, which fails that reward function by name). The instance itself lives in
the worker, which ends with the episode.

Not TRL's: the G episodes of a row must start from the same messages (grpokit's rule: they share one prompt),
so a ``reset`` whose returned text depends on anything but the row fails the group's other episodes, named;
hidden state may differ (a secret word drawn per instance). TRL's ``tools=`` beside an environment factory is
refused by the TRL call (give them as the class's methods), and rows need their prompt column.
"""

from __future__ import annotations

import inspect
import pickle
import sys
from collections.abc import Callable
from typing import Any

from grpokit.core.errors import ConfigError
from grpokit.core.user_code import load_module
from grpokit.rollout.envs import EnvStep
from grpokit.rollout.tools import get_parser, tool_schema
from grpokit.rollout.tools.runner import awaited

RESERVED = ("reset", "get_reward")
"""Public methods of a TRL environment that are not tools."""


def trl_tools(cls: type) -> list[str]:
    """The names of ``cls``'s tools, as TRL lists them: its public functions but reset and get_reward."""
    return [
        name
        for name, _ in inspect.getmembers(cls, predicate=inspect.isfunction)
        if name not in RESERVED and not name.startswith("_")
    ]


class TRLEpisode:
    """One episode of a TRL environment (see the module docstring); :func:`environment_factory` makes a subclass
    with the factory, its tools' schemas, its reward and the tool-call parser."""

    trl_factory: Callable[[], Any] = staticmethod(lambda: None)
    trl_class: type = object
    tool_names: tuple[str, ...] = ()
    tool_schemas: list[dict] = []
    rewards: list[tuple[str, float]] = []
    parser: Callable = staticmethod(get_parser("hermes"))
    prompt_column: str = "prompt"
    environment_column: str | None = None  # a dict of factories: the column naming each row's (not passed to reset)
    snapshots: bool = True  # reward functions get a copy of the instance (``state``) as ``environments``

    def __init__(self):
        self.env = self.trl_factory()

    def reset(self, row: dict) -> list[dict]:
        kwargs = {k: v for k, v in row.items() if k != self.environment_column}
        observation = self.env.reset(**kwargs)
        prompt = row.get(self.prompt_column)
        if prompt is None:
            raise ValueError(f"the row has no {self.prompt_column!r} column; grpokit takes the prompt from the row")
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
        if observation is not None:
            if not isinstance(observation, str):
                raise ValueError(f"reset returned a {type(observation).__name__}; TRL's reset returns a str or None")
            last = messages[-1]
            messages[-1] = {**last, "content": str(last.get("content") or "") + observation}
        return messages

    def step(self, text: str) -> EnvStep:
        calls = self.parser(text)
        if not calls:
            return EnvStep([], None, done=True)
        messages, errors = [], 0
        for call in calls:
            name = call.name or "unknown"
            try:
                if call.error is not None:
                    raise ValueError(call.error)
                if name not in self.tool_names:
                    raise ValueError(f"Tool {name} not found.")  # TRL's words
                result = awaited(getattr(self.env, name)(**call.arguments))
            except Exception as e:  # noqa: BLE001 - TRL gives the model the error and goes on
                errors += 1
                result = {"error": str(e)}
            content = result if isinstance(result, list) else str(result)
            messages.append({"role": "tool", "name": name, "content": content})
        return EnvStep(messages, None, done=False, tool_calls=len(calls), tool_errors=errors)

    def finish(self, last_text: str | None) -> dict[str, float | None]:
        """The environment's get_reward(), named after its class, when it has one."""
        if not self.rewards:
            return {}
        return {self.rewards[0][0]: float(awaited(self.env.get_reward()))}

    def state(self) -> Any:
        """A copy of the instance for the reward functions' ``environments``: an object of its class (made without
        calling __init__) holding the attributes that can be pickled."""
        copy = object.__new__(type(self.env))
        kept = {}
        for key, value in vars(self.env).items():
            try:
                pickle.dumps(value)
            except Exception:  # noqa: BLE001 - a socket, a lock, a client: left out
                continue
            kept[key] = value
        copy.__dict__.update(kept)
        return copy

    def close(self) -> None:
        closer = getattr(self.env, "close", None)
        if callable(closer):
            closer()


def environment_factory(target: str, spec: str, rollout_cfg=None) -> type[TRLEpisode]:
    """The environment of 'trl:module:Env' or 'trl:file.py:Env' (grpokit.rollout.episodes.ENVIRONMENT_KINDS): a
    TRLEpisode subclass over the factory, its methods' schemas (each a tool: type hints and a docstring, checked
    here), its get_reward as the reward named after the class, calls read with ``rollout_cfg.tool_parser``."""
    parser_name = getattr(rollout_cfg, "tool_parser", None) or "hermes"
    environment_column = getattr(rollout_cfg, "environment_column", None) if isinstance(
        getattr(rollout_cfg, "environment", None), dict) else None  # fmt: skip
    key = (spec, parser_name, environment_column)
    if key not in _ADAPTERS:  # once per process: a file loaded again would make another class of the same name
        _ADAPTERS[key] = _adapter(target, spec, parser_name, environment_column)
    return _ADAPTERS[key]


_ADAPTERS: dict[tuple, type[TRLEpisode]] = {}
"""The adapters made in this process, by (spec, parser, environment column)."""


def _adapter(target: str, spec: str, parser_name: str, environment_column: str | None) -> type[TRLEpisode]:
    where = f"rollout.environment={spec!r}"
    module_name, sep, attr = target.rpartition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"{where}: name TRL's environment factory as trl:package.module:Env or trl:file.py:Env")
    module = load_module(module_name, attr, where, prefix="grpokit_user_env")
    # a file's module is registered by its name, so that the copies of instances (``state``) pickle by reference to
    # their class in the episode's worker and load back in the trainer and the reward workers (all forked after)
    sys.modules.setdefault(module.__name__, module)
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ConfigError(f"{where}: {attr} is not a class or function in {module_name}")
    try:
        probe = factory()  # TRL probes one instance too: its class names the tools
    except Exception as e:
        raise ConfigError(f"{where}: making an environment failed: {type(e).__name__}: {e}") from e
    cls = type(probe)
    if not callable(getattr(probe, "reset", None)):
        raise ConfigError(f"{where}: {cls.__name__} has no reset method; TRL's environments define reset(**kwargs)")
    closer = getattr(probe, "close", None)
    if callable(closer):
        closer()
    names = trl_tools(cls)
    schemas = []
    for name in names:
        try:
            schemas.append(tool_schema(getattr(probe, name)))
        except ConfigError as e:
            raise ConfigError(f"{where}: the tool {cls.__name__}.{name}: {e}") from e
    rewards = [(cls.__name__, 1.0)] if callable(getattr(probe, "get_reward", None)) else []
    attributes = {
        "trl_factory": staticmethod(factory),
        "trl_class": cls,
        "tool_names": tuple(names),
        "tool_schemas": schemas,
        "rewards": rewards,
        "parser": staticmethod(get_parser(parser_name)),
        "environment_column": environment_column,
        "__module__": __name__,
    }
    return type(f"TRL{cls.__name__}", (TRLEpisode,), attributes)
