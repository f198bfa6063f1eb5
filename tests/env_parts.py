"""Environments for the tests of episodes kept apart (tests/unit/rollout/test_env_isolation.py) and of an
environment per row: module-level, so that configs name them env_parts:... and forked or spawned workers
import them."""

from __future__ import annotations

import subprocess
import sys

from grpokit.rollout.envs import EnvStep

_VAULT: list[str] = []  # what `store` kept, in the process that ran it
_TALLY: list[int] = []  # what `tally` counted (a shared tool: every episode's calls)
_RESETS: list[int] = []  # resets this worker process served


def store(value: str) -> str:
    """Keeps a value.

    Args:
        value: what to keep
    """
    _VAULT.append(value)
    return "kept"


def fetch() -> str:
    """Everything kept so far, joined by commas."""
    return ",".join(_VAULT)


def tally() -> int:
    """Counts its calls."""
    _TALLY.append(1)
    return len(_TALLY)


class Vault:
    """Offers store and fetch (per episode) and tally (shared by name); each step ends the episode after
    the calls of three turns. Its reset says how many resets its process served before."""

    tools = [store, fetch, tally]
    shared_tools = ["tally"]

    def reset(self, row):
        _RESETS.append(1)
        self.turns = 0
        return [{"role": "user", "content": f"{row['prompt']} (resets before: {len(_RESETS) - 1})"}]

    def step(self, text, tool_results):
        self.turns += 1
        return EnvStep([{"role": "user", "content": "go on"}], None, self.turns >= 3)


def start_sleeper() -> int:
    """A process in a session of its own (outside the worker's process group), as a server or a daemon
    would be; its pid."""
    return subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True,
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    ).pid  # fmt: skip


def spawn_daemon() -> int:
    """Starts a process in its own session and returns its pid."""
    return start_sleeper()


class Spawner:
    """Starts a process in its own session at reset and says its pid; offers spawn_daemon, which does too."""

    tools = [spawn_daemon]

    def reset(self, row):
        return [{"role": "user", "content": f"pid {start_sleeper()}"}]

    def step(self, text, tool_results):
        return EnvStep([{"role": "user", "content": "ok"}], 1.0, True)


class Closer:
    """Writes the row's file at close(): the hook an episode's end calls in its worker."""

    def reset(self, row):
        self.path = row["path"]
        return [{"role": "user", "content": "hi"}]

    def step(self, text):
        return EnvStep([], 1.0, True)

    def close(self):
        with open(self.path, "w") as f:
            f.write("closed")


class Chat:
    """grpokit's own environment for the runs with an environment per row: one step, then done."""

    def reset(self, row):
        return [{"role": "user", "content": row["prompt"]}]

    def step(self, text):
        return EnvStep([], None, True)


def chat_digit(prompts, completions, environment, **kwargs):
    """Chat's own reward: 1 when the model's first turn holds a digit; None (does not apply) on other rows."""
    return [
        float(any(c.isdigit() for c in completion[0]["content"])) if env == "chat" else None
        for completion, env in zip(completions, environment)
    ]
