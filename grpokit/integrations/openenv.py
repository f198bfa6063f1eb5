"""OpenEnv (pip install 'grpokit[openenv]'): an environment served over OpenEnv's protocol plays grpokit's
multi-turn rollout. Each episode opens its own session (OpenEnv's WebSocket /ws: the server makes an
environment for it), resets it, sends each model turn as an action and reads back the observation, the
reward and done, through OpenEnv's own client (openenv.core.GenericEnvClient, dictionaries, no package of
the environment needed); the session closes when the episode ends.

    rollout:
      environment: openenv:http://127.0.0.1:8000      # actions {"message": the turn's text}
      # or your mapping of text and observations: my_env.py:Echo, a subclass of OpenEnvironment
      env_timeout_s: 30                               # one reset or step; past it only that episode fails

The episode's environment runs in grpokit's environment worker (grpokit.rollout.envs), so a server that
refuses, drops the session, answers an error or does not answer within rollout.env_timeout_s fails that
episode alone (counted in episodes/failed, scored 0), as grpokit's own environments do. The step's reward is
the turn's reward (turn_rewards; the reward function ``openenv_reward`` sums an episode's), done ends it.

    class Echo(OpenEnvironment):
        base_url = "http://127.0.0.1:8000"
        action_field = "message"                      # the action {action_field: text}; or override action()
        def observation_messages(self, observation, reward, done):   # what the model reads next
            return [{"role": "user", "content": observation["echoed_message"]}]
"""

from __future__ import annotations

import json
from typing import Any

from grpokit.core.errors import ConfigError
from grpokit.rollout.envs import EnvStep, first_messages


class OpenEnvironment:
    """A grpokit environment over an OpenEnv server (see the module docstring). Override ``reset_arguments``,
    ``action``, ``first_observation_messages`` and ``observation_messages`` to map rows, turns and
    observations; the defaults: reset with the row's ``seed``/``episode_id`` columns if any, the action
    {action_field: text}, the row's prompt then the reset observation's text as the first messages, each
    observation's text as a user message (a lone string field as is, else the observation as JSON)."""

    base_url: str = ""
    action_field: str = "message"
    prompt_column: str = "prompt"
    connect_timeout_s: float = 10.0
    message_timeout_s: float = 60.0  # the client's own bound; rollout.env_timeout_s cuts sooner

    def __init__(self):
        if not self.base_url:
            raise ConfigError(f"{type(self).__name__}: set base_url, the OpenEnv server (http://host:port)")
        self.client = None

    def reset_arguments(self, row: dict) -> dict:
        return {k: row[k] for k in ("seed", "episode_id") if k in row}

    def action(self, text: str) -> dict:
        return {self.action_field: text}

    def observation_text(self, observation: Any) -> str:
        if isinstance(observation, dict):
            texts = [v for k, v in observation.items() if isinstance(v, str) and k != "metadata"]
            if len(texts) == 1:
                return texts[0]
        return json.dumps(observation, default=str)

    def first_observation_messages(self, row: dict, observation: Any) -> list[dict]:
        messages = first_messages(row, self.prompt_column) if self.prompt_column in row else []
        text = self.observation_text(observation)
        return messages + ([{"role": "user", "content": text}] if text and text != "{}" else [])

    def observation_messages(self, observation: Any, reward: float | None, done: bool) -> list[dict]:
        return [{"role": "user", "content": self.observation_text(observation)}]

    def reset(self, row: dict) -> list[dict]:
        from openenv.core import GenericEnvClient

        client = GenericEnvClient(
            base_url=self.base_url,
            connect_timeout_s=self.connect_timeout_s,
            message_timeout_s=self.message_timeout_s,
        )
        self.client = client.sync()
        self.client.connect()
        result = self.client.reset(**self.reset_arguments(row))
        return self.first_observation_messages(row, result.observation)

    def step(self, text: str) -> EnvStep:
        result = self.client.step(self.action(text))
        done = bool(result.done)
        return EnvStep(
            self.observation_messages(result.observation, result.reward, done), result.reward, done
        )

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None


def environment_factory(target: str, spec: str, rollout_cfg=None) -> type[OpenEnvironment]:
    """The environment of 'openenv:URL' (grpokit.rollout.episodes.ENVIRONMENT_KINDS): OpenEnvironment on URL
    (``rollout_cfg``: not read)."""
    try:
        import openenv.core  # noqa: F401 - the client, checked before any episode
    except ImportError as e:
        raise ConfigError(
            f"rollout.environment={spec!r} needs OpenEnv ({e}); pip install 'grpokit[openenv]'"
        ) from e
    if not target.startswith(("http://", "https://", "ws://", "wss://")):
        raise ConfigError(
            f"rollout.environment={spec!r}: give the server's address, e.g. openenv:http://127.0.0.1:8000"
        )
    return type("OpenEnvironment", (OpenEnvironment,), {"base_url": target, "__module__": __name__})


def openenv_reward(prompts, completions, turn_rewards, **kwargs) -> list[float | None]:
    """An episode's reward: the sum of the rewards its environment gave per turn (None: none given)."""
    out = []
    for rewards in turn_rewards:
        given = [r for r in rewards if r is not None]
        out.append(float(sum(given)) if given else None)
    return out
