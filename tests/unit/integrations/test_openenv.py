"""OpenEnv (issue 53 item 3): an environment served over OpenEnv's protocol by a local server on the loopback
(tests/openenv_server.py) plays grpokit's multi-turn rollout and trains; a server that answers an error or
does not answer within rollout.env_timeout_s ends only its episode."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request

import pytest

pytest.importorskip("openenv.core", reason="OpenEnv is not installed (pip install 'grpokit[openenv]')")

from paths import REPO  # noqa: E402
from tool_model import tool_model  # noqa: E402

from grpokit.config.schema import load_config, resolve_algo  # noqa: E402
from grpokit.core.errors import ConfigError  # noqa: E402
from grpokit.integrations.openenv import openenv_reward  # noqa: E402
from grpokit.rollout.envs import EnvFailure  # noqa: E402
from grpokit.rollout.episodes import EpisodeSampler  # noqa: E402
from grpokit.rollout.generation import FastGenerator  # noqa: E402
from grpokit.trainers.grpo import GRPOTrainer  # noqa: E402


@pytest.fixture(scope="module")
def server():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, str(REPO / "tests" / "openenv_server.py"), str(port)])
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            urllib.request.urlopen(f"{url}/health", timeout=2).read()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("the OpenEnv test server did not start") from None
            time.sleep(0.2)
    yield url
    proc.kill()
    proc.wait()


def settings(url, *extra):
    return [f"rollout.environment=openenv:{url}", "rollout.env_timeout_s=4", "rollout.group_size=2", *extra]


def test_an_episode_plays_the_servers_session_and_a_failing_or_hanging_server_fails_only_its_own(server):
    cfg = load_config(None, settings(server, "rollout.max_turns=3", "rollout.max_new_tokens=24"))
    sampler = EpisodeSampler(cfg, [], resolve_algo(cfg))
    try:
        env = sampler.environments([{"prompt": "play", "seed": 1}], 2)[0]
        assert env.reset({"prompt": "play", "seed": 1}) == [
            {"role": "user", "content": "play"}, {"role": "user", "content": "say a digit"}
        ]  # fmt: skip
        step = env.step("4")
        assert (step.messages, step.reward, step.done) == (
            [{"role": "user", "content": "turn 1: a digit"}],
            1.0,
            False,
        )
        step = env.step("none")
        assert (step.messages, step.reward, step.done) == (
            [{"role": "user", "content": "turn 2: no digit"}],
            0.0,
            True,
        )
        for seed, words in (
            (7, "step raised RuntimeError: .*the game broke"),
            (13, "did not finish within 4 s"),
        ):
            env = sampler.environments([{"prompt": "play", "seed": seed}], 2)[0]
            env.reset({"prompt": "play", "seed": seed})
            with pytest.raises(EnvFailure, match=words):
                env.step("4")
        sampler.end_episodes()
        # in a rollout: the episodes of seeds 7 and 13 fail, named; those of seeds 1 and 2 play on
        model, tok = tool_model()
        rows = [{"prompt": "play", "seed": s} for s in (1, 7, 13, 2)]
        batch = sampler.rollout(FastGenerator(), model, tok, rows, seed=0, eos_token_ids=[tok.eos_token_id])
    finally:
        sampler.close()
    failed = [ep.failed for ep in batch.episodes]
    assert [failed[i] for i in (0, 1, 6, 7)] == [None] * 4
    for i in range(2, 6):  # (a first turn cut at max_new_tokens is never stepped: nothing to fail)
        ep = batch.episodes[i]
        assert ep.failed is not None or (ep.truncated and len(ep.turn_ends) == 1), i
    assert any("step raised RuntimeError" in (f or "") for f in failed[2:4])
    assert any("did not finish within 4 s" in (f or "") for f in failed[4:6])
    assert all(f"environment openenv:{server}" in f for f in failed if f)
    for ep in batch.episodes[:2] + batch.episodes[6:]:
        assert ep.messages[:2] == [
            {"role": "user", "content": "play"},
            {"role": "user", "content": "say a digit"},
        ]
        assert len(ep.turn_rewards) >= 1 and ep.turn_rewards[0] in (0.0, 1.0)


def test_an_openenv_environment_trains_and_a_bad_address_is_named(server, tmp_path):
    with pytest.raises(ConfigError, match="give the server's address"):
        EpisodeSampler(
            *(lambda c: (c, [], resolve_algo(c)))(
                load_config(None, ["rollout.environment=openenv:localhost"])
            )
        )
    model, tok = tool_model()
    cfg = load_config(
        None,
        settings(server, f"train.output_dir={tmp_path / 'run'}", "train.steps=2", "train.stop_after_flat_steps=0",
                 "rollout.prompts_per_step=2", "rollout.max_turns=2", "rollout.max_new_tokens=6",
                 "model.device=cpu", "eval.enabled=false", "optim.lr=3e-3"),
    )  # fmt: skip
    rows = [{"prompt": "play", "seed": s} for s in (1, 2, 3, 4)]
    trainer = GRPOTrainer(
        cfg,
        model=model,
        tokenizer=tok,
        train_rows=rows,
        reward_functions=[("openenv_reward", openenv_reward, 1.0)],
    )
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    summary = trainer.train()
    assert summary["steps"] == 2
    assert any((before[k] != v).any() for k, v in trainer.model.state_dict().items())  # it trained


def test_two_environments_in_one_run_each_row_its_own_with_its_own_rewards_and_metrics(server, tmp_path):
    """Issue 53 item 4: the column 'environment' names each row's: grpokit's own (env_parts:Chat) or the OpenEnv
    server's; each scored by its own reward (the other's gives None there) and counted in env/NAME/*."""
    import json

    from env_parts import chat_digit

    model, tok = tool_model()
    cfg = load_config(
        None,
        [f"rollout.environment={{chat: env_parts:Chat, game: openenv:{server}}}", "rollout.env_timeout_s=10",
         "rollout.group_size=2", f"train.output_dir={tmp_path / 'run'}", "train.steps=2",
         "train.stop_after_flat_steps=0", "rollout.prompts_per_step=4", "rollout.max_turns=2",
         "rollout.max_new_tokens=24", "model.device=cpu", "eval.enabled=false", "optim.lr=3e-3",
         "data.shuffle=false"],
    )  # fmt: skip
    rows = [{"prompt": "play", "seed": 1, "environment": "game"}, {"prompt": "hi", "environment": "chat"}] * 2
    trainer = GRPOTrainer(
        cfg, model=model, tokenizer=tok, train_rows=rows,
        reward_functions=[("openenv_reward", openenv_reward, 1.0), ("chat_digit", chat_digit, 1.0)],
    )  # fmt: skip
    trainer.train()
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in lines if "env/game/episodes" in m]
    assert len(steps) == 2
    for m in steps:
        assert m["env/game/episodes"] == m["env/chat/episodes"] == 4.0 and m["env/game/failed"] == 0.0
        assert m["env/chat/turns_mean"] == 1.0  # Chat ends after its one step; the game goes on to max_turns
        # each row scored by its own environment's reward: chat_digit on the chat half alone, the server's
        # reward on game rows alone (those whose first turn was stepped; None where none was given)
        assert m["reward/chat_digit/applicable"] == 0.5 and m["reward/openenv_reward/applicable"] <= 0.5
    assert sum(m["reward/openenv_reward/applicable"] for m in steps) > 0
