"""TRL's environment_factory as a grpokit environment (grpokit.integrations.trl_environment), its parts alone: the
first messages, the tools run on the instance with TRL's results and errors, get_reward, the copy reward functions
get, and what cannot be used named before any model loads."""

from __future__ import annotations

import asyncio
import pickle
import threading
from types import SimpleNamespace

import pytest

from grpokit.core.errors import ConfigError
from grpokit.integrations.trl_environment import environment_factory


class Counter:
    """A TRL environment: reset(**row) says the start, add and fetch are tools, get_reward scores."""

    def __init__(self):
        self.total, self.seen, self.lock = 0, None, threading.Lock()

    def reset(self, **row):
        self.total, self.seen = int(row.get("start", 0)), sorted(row)
        return f" (start at {self.total})"

    def add(self, n: int) -> int:
        """Add to the total.

        Args:
            n: how much
        """
        self.total += n
        return self.total

    async def fetch(self, key: str) -> list:
        """Fetch content parts.

        Args:
            key: what to fetch
        """
        await asyncio.sleep(0)
        return [{"type": "text", "text": key}]

    def _helper(self):
        return None

    def get_reward(self) -> float:
        return float(self.total == 5)


class Undocumented:
    def reset(self, **row):
        return None

    def act(self, x):
        return x


class NoReset:
    def act(self, x: int) -> int:
        """Act.

        Args:
            x: a number
        """
        return x


def call(name: str, **arguments) -> str:
    import json

    return f'<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'


def test_an_episode_runs_trls_contract_on_its_own_instance():
    Env = environment_factory(f"{__name__}:Counter", f"trl:{__name__}:Counter")
    assert sorted(t["function"]["name"] for t in Env.tool_schemas) == ["add", "fetch"]  # not reset, get_reward, _helper
    assert Env.rewards == [("Counter", 1.0)]
    env = Env()
    first = env.reset({"prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": "count"}], "start": 2})
    assert first == [{"role": "system", "content": "s"}, {"role": "user", "content": "count (start at 2)"}]
    assert env.env.seen == ["prompt", "start"]  # every column, as TRL passes them
    step = env.step("thinking " + call("add", n=3) + call("fetch", key="k") + call("nope") + call("add", n="x"))
    assert step.done is False and (step.tool_calls, step.tool_errors) == (4, 2)
    assert [m["content"] for m in step.messages] == [
        "5",
        [{"type": "text", "text": "k"}],  # a list of content parts stays a list, as in TRL
        "{'error': 'Tool nope not found.'}",  # TRL's words
        str({"error": "unsupported operand type(s) for +=: 'int' and 'str'"}),  # the tool's own error, as TRL
    ]
    assert all(m["role"] == "tool" for m in step.messages)
    assert env.env.total == 5 and env.finish(None) == {"Counter": 1.0}
    assert env.step("the answer is 5").done is True  # a turn without a call ends it
    copy = pickle.loads(pickle.dumps(env.state()))
    assert isinstance(copy, Counter) and copy.total == 5 and not hasattr(copy, "lock") and copy.add(1) == 6


def test_a_string_prompt_and_a_dict_of_environments_column():
    rollout = SimpleNamespace(environment={"counter": f"trl:{__name__}:Counter"}, environment_column="environment",
                              tool_parser="hermes")  # fmt: skip
    Env = environment_factory(f"{__name__}:Counter", f"trl:{__name__}:Counter", rollout)
    env = Env()
    assert env.reset({"prompt": "go", "environment": "counter"}) == [{"role": "user", "content": "go (start at 0)"}]
    assert env.env.seen == ["prompt"]  # the column that picks the environment is not passed to reset


@pytest.mark.parametrize(
    ("target", "message"),
    [
        (f"{__name__}:Undocumented", r"the tool Undocumented.act: .*docstring"),
        (f"{__name__}:NoReset", "NoReset has no reset method"),
        (f"{__name__}:Missing", "Missing"),
        ("nothing", "name TRL's environment factory as trl:package.module:Env"),
    ],
)
def test_what_cannot_be_an_environment_is_named(target, message):
    with pytest.raises(ConfigError, match=message):
        environment_factory(target, f"trl:{target}")
