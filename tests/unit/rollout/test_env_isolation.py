"""Episodes kept apart (issue 51 item 5): no value one episode stores is read by another, unless the
environment names the tool shared; and nothing an environment or its tools start outlives its episode, the
run, or the process that made the workers. Through the trainer's own EpisodeSampler, its environments driven
by hand (no model needed: the turns are written here)."""

from __future__ import annotations

import os
import signal
import time

import pytest
from processes import alive, gone_within

from grpokit.config.schema import load_config, resolve_algo
from grpokit.rollout.episodes import EpisodeSampler


def sampler(environment: str, **settings) -> EpisodeSampler:
    overrides = [f"rollout.environment={environment}", "rollout.tool_workers=2", "rollout.group_size=2"]
    cfg = load_config(None, overrides + [f"rollout.{k}={v}" for k, v in settings.items()])
    return EpisodeSampler(cfg, [], resolve_algo(cfg))


def call(name: str, **arguments) -> str:
    import json

    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def test_a_value_an_environments_tool_stores_is_never_read_by_another_episode_but_a_shared_tool_is():
    """Vault's store/fetch keep a module global in the process that runs them. Each of 8 episodes (4 rows x 2,
    over two rollouts) stores its own secret, then fetches: it must read its own secret alone. The old code
    ran them on the run's 2 kept tool workers, so an episode read others' secrets (half the calls, the
    issue's attack). tally, named in shared_tools, counts every episode's calls."""
    s = sampler("env_parts:Vault")
    rows = [{"prompt": f"row {k}"} for k in range(4)]
    fetched, counts = [], []
    try:
        for rollout in range(2):
            envs = s.environments(rows, 2)
            for i, env in enumerate(envs):
                first = env.reset(rows[i // 2])
                assert first[0]["content"].endswith("(resets before: 0)")  # a fresh worker per episode
                secret = f"secret-{rollout}-{i}"
                assert env.step(call("store", value=secret)).messages[0]["content"] == "kept"
                fetched.append((secret, env.step(call("fetch")).messages[0]["content"]))
                counts.append(int(env.step(call("tally")).messages[0]["content"]))
            s.end_episodes()
    finally:
        s.close()
    assert all(got == secret for secret, got in fetched), fetched
    assert max(counts) > 1  # shared: a worker of the run counted past one episode's call (per episode: all 1)


def test_an_environments_module_state_starts_afresh_in_every_episode_even_on_a_reused_handle():
    s = sampler("env_parts:Vault")
    rows = [{"prompt": "a"}]
    try:
        for _ in range(3):  # the same handle serves an episode per rollout
            (env, _) = s.environments(rows, 2)
            assert env.reset(rows[0])[0]["content"] == "a (resets before: 0)"
            s.end_episodes()
        env = s.environments(rows, 2)[0]  # and two resets on one handle without end_episodes between them
        env.reset(rows[0])
        assert env.reset(rows[0])[0]["content"] == "a (resets before: 0)"
    finally:
        s.close()


def test_unknown_tools_are_named_with_every_tool_the_episode_has():
    s = sampler("env_parts:Vault")
    try:
        env = s.environments([{"prompt": "x"}], 2)[0]
        env.reset({"prompt": "x"})
        text = env.step(call("open_door")).messages[0]["content"]
    finally:
        s.close()
    assert text == "Error: there is no tool 'open_door'; the tools are ['fetch', 'store', 'tally']"


@pytest.mark.parametrize("ending", ["end_episodes", "close", "timeout"])
def test_what_an_environment_and_its_tools_start_in_sessions_of_their_own_dies_with_the_episode(ending):
    """Spawner starts a process in its own session at reset and through its tool. The old workers were
    killed with their process group, which such a process has left: it outlived the run."""
    s = sampler("env_parts:Spawner", env_timeout_s=2)
    pids = []
    try:
        env = s.environments([{"prompt": "x"}], 2)[0]
        pids.append(int(env.reset({"prompt": "x"})[0]["content"].split()[1]))
        pids.append(int(env.step(call("spawn_daemon")).messages[0]["content"]))
        assert all(alive(p) for p in pids)
        if ending == "end_episodes":
            s.end_episodes()
        elif ending == "close":
            s.close()
        else:  # what a timeout does: the environment's worker killed alone, while the run goes on
            env.env.kill()
            assert gone_within(pids[0])
            s.end_episodes()
    finally:
        s.close()
    assert all(gone_within(p) for p in pids), [p for p in pids if alive(p)]


def test_what_an_environment_starts_dies_when_the_process_that_made_its_worker_is_killed():
    """The asynchronous sampler's case: the process that owns the episodes (the sampler process) is
    SIGKILLed, no close runs; the keeper above each worker kills the tree."""
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the stand-in sampler process: starts an episode, says the pids, waits to be killed
        try:
            os.close(read)
            s = sampler("env_parts:Spawner")
            env = s.environments([{"prompt": "x"}], 2)[0]
            pid = int(env.reset({"prompt": "x"})[0]["content"].split()[1])
            tool_pid = int(env.step(call("spawn_daemon")).messages[0]["content"])
            os.write(write, f"{pid} {tool_pid}\n".encode())
            time.sleep(300)
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        pids = [int(p) for p in f.readline().split()]
    assert len(pids) == 2 and all(alive(p) for p in pids)
    os.kill(child, signal.SIGKILL)
    os.waitpid(child, 0)
    # 60 s: the keeper's kill is immediate, but a loaded 2-core machine (CI's xdist workers) has seen it take 20
    assert all(gone_within(p, 60.0) for p in pids), [p for p in pids if alive(p)]


def test_an_environments_close_runs_in_its_worker_when_the_episode_ends(tmp_path):
    s = sampler("env_parts:Closer")
    rows = [{"prompt": "x", "path": str(tmp_path / "a")}]
    try:
        for env in s.environments(rows, 2):
            env.reset(rows[0])
        assert not (tmp_path / "a").exists()
        s.end_episodes()
    finally:
        s.close()
    assert (tmp_path / "a").read_text() == "closed"
