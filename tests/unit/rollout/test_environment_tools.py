"""Environments that offer tools (grpokit.rollout.envs.EnvironmentWithTools): each model turn's calls run in
the tool workers first, then the environment's step sees the turn and the calls' results; the tool messages
come back before the environment's, and only the model's tokens are trained. On the tiny real Qwen2 of
tool_model, with the environment in its own forked worker (EnvPool) as in the trainer."""

import os
import time

import pytest
from episode_parts import count_digits, digit_parser, segments
from tool_model import tool_model

from grpokit.rollout.envs import EnvironmentWithTools, EnvPool, EnvStep, ToolEnvironment
from grpokit.rollout.generation import FastGenerator
from grpokit.rollout.multiturn import ChatDelta, run_episodes
from grpokit.rollout.tools import ToolCall, ToolRunner, load_tools

ROWS = [{"prompt": "what is 1+2"}, {"prompt": "hi"}]


def nap(seconds: float) -> str:
    """Sleeps, as a tool stuck in a loop would.

    Args:
        seconds: how long
    """
    time.sleep(seconds)
    return "woke"


def big() -> str:
    """Returns 5,000 characters."""
    return "x" * 5000


class Teller:
    """Offers count_digits; answers each turn with what its step saw (the turn's tool results) and rewards
    the number of calls; done after 3 steps. Its step runs in the environment's worker process."""

    tools = [count_digits]

    def reset(self, row):
        self.turn = 0
        return [{"role": "user", "content": row["prompt"]}]

    def step(self, text, tool_results):
        self.turn += 1
        seen = ",".join(f"{r['name']}={r['content']}" for r in tool_results)
        return EnvStep([{"role": "user", "content": f"saw [{seen}]"}], float(len(tool_results)), self.turn >= 3)


def episodes(model, tok, envs, tools, rows=ROWS, group_size=2, **kw):
    settings = dict(max_turns=3, max_new_tokens=16, max_episode_tokens=200, temperature=1.0, seed=5)
    settings.update(kw)
    return run_episodes(
        FastGenerator(), model, tok, ChatDelta(tok, [t.schema for t in tools]), envs, rows,
        group_size=group_size, eos_token_ids=[tok.eos_token_id], pad_token_id=tok.pad_token_id, **settings,
    )  # fmt: skip


@pytest.mark.slow
def test_the_calls_run_first_and_the_environments_step_sees_them_in_its_worker():
    model, tok = tool_model()
    tools = load_tools(Teller.tools)
    runner = ToolRunner(tools, timeout_s=5.0, workers=2)
    pool = EnvPool(Teller, timeout_s=10.0)
    try:
        envs = [EnvironmentWithTools(h, runner, digit_parser, 2000) for h in pool.environments(8)]
        batch = episodes(model, tok, envs, tools, group_size=4, max_new_tokens=24)
        env_pids = {w.pid for w in pool.workers.live}
    finally:
        runner.close()
        pool.close()
    assert len(env_pids) == 8 and os.getpid() not in env_pids  # each episode's environment in its own process
    prompt = tok.decode(batch.rollout.prompt_ids[0][batch.rollout.prompt_mask[0].bool()])
    assert prompt.startswith("<|user|>tools: count")  # the environment's tool, told to the model ("_": not in the vocabulary)
    calls = with_digits = without = 0
    for i, ep in enumerate(batch.episodes):
        assert ep.failed is None, ep.failed
        msgs, k, rewards = ep.completion, 0, []
        while k < len(msgs):
            turn = msgs[k]
            assert turn["role"] == "assistant"
            k += 1
            if k == len(msgs):  # a last turn cut at max_new_tokens: never stepped
                assert ep.truncated
                break
            expected = []
            if any(c.isdigit() for c in turn["content"]):
                expected.append({"role": "tool", "name": "count_digits", "content": str(count_digits(turn["content"]))})
            seen = ",".join(f"count_digits={m['content']}" for m in expected)
            expected.append({"role": "user", "content": f"saw [{seen}]"})  # the step saw the results
            assert msgs[k : k + len(expected)] == expected, (i, msgs)
            k += len(expected)
            rewards.append(float(len(expected) - 1))
            calls += len(expected) - 1
            with_digits += len(expected) == 2
            without += len(expected) == 1
        assert ep.turn_rewards[: len(rewards)] == rewards
        # only the model's tokens are trained: its turns, in order, are the mask's 1-runs
        mask = batch.rollout.completion_mask[i].tolist()
        ids = batch.rollout.completion_ids[i].tolist()
        model_runs = [tok.decode(ids[s:e], skip_special_tokens=True) for v, s, e in segments(mask) if v == 1]
        assert model_runs == [m["content"] for m in msgs if m["role"] == "assistant"]
        context = tok.decode([t for t, m in zip(ids, mask) if m == 0], skip_special_tokens=True)
        last_turn = max(k for k, m in enumerate(msgs) if m["role"] == "assistant")
        for m in msgs[:last_turn]:  # (what answers the last turn is never read: the episode ended)
            if m["role"] != "assistant":
                text = f"result: {m['content']}" if m["role"] == "tool" else m["content"]
                assert tok.decode(tok(text, add_special_tokens=False).input_ids) in context  # (as the vocabulary spells it)
    assert with_digits > 0 and without > 0  # both kinds of turn happened
    assert batch.metrics["tools/calls"] == calls == sum(ep.tool_calls for ep in batch.episodes)


class Patient:
    """Offers nap; counts its steps; ends after its first step, saying whether the call it saw failed."""

    tools = [nap]
    steps = 0

    def reset(self, row):
        return [{"role": "user", "content": row["prompt"]}]

    def step(self, text, tool_results):
        self.steps += 1
        return EnvStep([{"role": "user", "content": f"error {tool_results[0]['error']}"}], 0.5, done=True)


def nap_parser(text: str) -> list[ToolCall]:
    return [ToolCall("nap", {"seconds": 30})]


@pytest.mark.slow
def test_a_call_past_its_timeout_is_an_error_the_step_sees_and_one_past_the_episodes_time_ends_it_unstepped():
    model, tok = tool_model()
    tools = load_tools(Patient.tools)
    runner = ToolRunner(tools, timeout_s=0.5, workers=4)
    try:
        games = [Patient() for _ in range(4)]
        envs = [EnvironmentWithTools(g, runner, nap_parser, 2000) for g in games]
        batch = episodes(model, tok, envs, tools, max_new_tokens=32, max_turns=2)
        stepped = [ep for g, ep in zip(games, batch.episodes) if g.steps]
        assert stepped
        for ep in stepped:
            assert ep.completion[1:] == [
                {"role": "tool", "name": "nap", "content": "Error: nap did not finish within 0.5 s"},
                {"role": "user", "content": "error True"},
            ]
            assert ep.tool_timeouts == 1 and ep.turn_rewards == [0.5] and not ep.over_budget
        # the episode's time (0.3 s) runs out inside the call: the episode ends there, the step never runs
        games = [Patient() for _ in range(4)]
        envs = [EnvironmentWithTools(g, runner, nap_parser, 2000) for g in games]
        t0 = time.monotonic()
        batch = episodes(model, tok, envs, tools, max_new_tokens=32, max_turns=2, episode_budget_s=0.3)
        assert time.monotonic() - t0 < 20
    finally:
        runner.close()
    ended = [ep for ep in batch.episodes if any(m["role"] == "tool" for m in ep.completion)]  # the stepped ones
    assert ended and all(ep.over_budget and ep.truncated and ep.turn_rewards == [None] for ep in ended)
    assert sum(g.steps for g in games) == 0


class Broken:
    tools = [count_digits]

    def reset(self, row):
        return [{"role": "user", "content": row["prompt"]}]

    def step(self, text, tool_results):
        return {"messages": [], "reward": 1.0}


def test_an_answer_that_is_not_an_envstep_fails_the_episode_named():
    model, tok = tool_model()
    tools = load_tools(Broken.tools)
    runner = ToolRunner(tools, timeout_s=5.0)
    try:
        envs = [EnvironmentWithTools(Broken(), runner, digit_parser, 2000) for _ in range(4)]
        batch = episodes(model, tok, envs, tools, env_name="quiz.py:Broken", max_new_tokens=32)
    finally:
        runner.close()
    stepped = [ep for ep in batch.episodes if ep.failed is not None]
    assert stepped and all(
        "environment quiz.py:Broken: step returned a dict, not an EnvStep" in ep.failed for ep in stepped
    )


def test_a_cut_tool_result_says_how_much_was_left_out():
    """The runner cuts a result at max_result_chars with a note; the episode keeps that note (it was cut a
    second time before, its note then counting the first note's characters: "[cut: 31 more characters]")."""
    model, tok = tool_model()
    tools = load_tools([big])
    runner = ToolRunner(tools, timeout_s=5.0, max_result_chars=100)
    try:
        envs = [ToolEnvironment(runner, lambda text: [ToolCall("big", {})]) for _ in range(2)]
        batch = episodes(model, tok, envs, tools, rows=ROWS[:1], max_turns=2, max_new_tokens=32,
                         max_message_chars=100)  # fmt: skip
    finally:
        runner.close()
    results = [m["content"] for ep in batch.episodes for m in ep.completion if m["role"] == "tool"]
    assert results and all(r == "x" * 100 + "... [cut: 4900 more characters]" for r in results)
