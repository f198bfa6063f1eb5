"""Environments for multi-turn rollouts: what answers the model between its turns.

The protocol (one instance per episode, made by a factory with no arguments, TRL's ``environment_factory``):

    class Env:
        def reset(self, row: dict) -> list[dict]:      # the dataset row -> the first messages
            ...
        def step(self, text: str) -> EnvStep:          # the model's turn (decoded) -> what comes back
            ...

``EnvStep.messages`` are appended to the conversation (rendered by the chat template; role "tool" for
tool results, "user" for a game's or a simulated user's reply); ``reward`` is an optional per-turn reward
(it reaches reward functions as the ``turn_rewards`` column and drives ``grpo_process``, each turn a step);
``done`` ends the episode. An empty ``messages`` list ends it too. ``reset`` must give the same messages
for the same row (the G episodes of a group share their prompt).

:class:`ToolEnvironment` is the environment of tool use: the model's turn is parsed for tool calls
(grpokit.rollout.tools.parsers), each runs on a :class:`~grpokit.rollout.tools.ToolRunner`, and the results come back
as ``tool`` messages; a turn without a call is the answer and ends the episode.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from grpokit.rollout.tools.parsers import ToolCall
from grpokit.rollout.tools.runner import ToolRunner


@dataclass
class EnvStep:
    """What the environment answers to one model turn."""

    messages: list[dict] = field(default_factory=list)
    reward: float | None = None
    done: bool = False
    tool_calls: int = 0  # counted by the tool environment for the step metrics
    tool_errors: int = 0
    tool_timeouts: int = 0


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
        calls = self.parser(text)
        if not calls:
            return EnvStep(done=True)  # an answer without a call ends the episode
        out = EnvStep()
        for call in calls:
            result = self.runner.call(call)
            out.messages.append({"role": "tool", "name": call.name or "unknown", "content": result.content})
            out.tool_calls += 1
            out.tool_errors += int(result.error)
            out.tool_timeouts += int(result.timed_out)
        return out
