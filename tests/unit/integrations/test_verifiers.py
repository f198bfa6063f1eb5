"""verifiers environments (issue 53 item 2): a local verifiers environment (tests/vf_envs.py: single-turn with a
rubric of two weighted functions, a tool one, a multi-turn game) plays grpokit's rollout with its dataset as the
rows and its rubric's functions as rewards, the model's tokens trained and the tool's masked, and mixes with
grpokit's own environments in one run."""

from __future__ import annotations

import json
import signal

import pytest

verifiers = pytest.importorskip("verifiers", reason="verifiers is not installed (pip install 'grpokit[verifiers]')")
pytest.importorskip("datasets", reason="the verifiers environments' datasets need datasets (the dev extra)")

from grpokit.integrations import verifiers as vf_integration  # noqa: E402

if not vf_integration.supported(verifiers.__version__):
    pytest.skip(
        f"verifiers {verifiers.__version__} is not one grpokit supports (0.3.x)", allow_module_level=True
    )

from episode_parts import count_digits, segments  # noqa: E402
from tool_model import tool_model  # noqa: E402

from grpokit.config.schema import load_config, resolve_algo  # noqa: E402
from grpokit.core.errors import ConfigError  # noqa: E402
from grpokit.data.prompts import load_prompts  # noqa: E402
from grpokit.rollout.episodes import EpisodeSampler, environment_rewards  # noqa: E402
from grpokit.rollout.generation import FastGenerator  # noqa: E402
from grpokit.trainers.grpo import GRPOTrainer  # noqa: E402

SINGLE = "verifiers:vf_envs:single_turn"
TOOLS = "verifiers:vf_envs:tool_env"


def factory(spec: str, *settings: str):
    cfg = load_config(None, [f"rollout.environment={spec}", *settings])
    return EpisodeSampler(cfg, [], resolve_algo(cfg)), cfg


def test_a_single_turn_environment_gives_its_rows_and_each_rubric_function_is_a_reward_with_its_weight():
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    rows = load_prompts(SINGLE)
    assert [(r["answer"], r["example_id"]) for r in rows] == [("5", 0), ("8", 1), ("7", 2), ("6", 3)]
    assert rows[0]["prompt"] == [
        {"role": "system", "content": "Answer with a number."}, {"role": "user", "content": "2+3"}
    ]  # fmt: skip
    assert [r["answer"] for r in load_prompts(SINGLE + "?dataset=eval")] == ["5", "8"]
    assert load_prompts("verifiers:vf_envs:single_turn?system_prompt=Be brief.")[0]["prompt"][0]["content"] == "Be brief."
    # a verifiers Environment sets SIGINT/SIGTERM handlers of its own when made: the trainer's are kept
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers

    # a run's config: the environment's rubric alone gives the rewards (rewards: [] is refused without one)
    with pytest.raises(ConfigError, match="at least one reward function is needed"):
        load_config(None, ["rewards=[]"])
    cfg = load_config(None, [f"data.train={SINGLE}", f"rollout.environment={SINGLE}", "rewards=[]"])
    functions, _ = GRPOTrainer.reward_functions(cfg, resolve_algo(cfg), None)
    assert [(name, weight) for name, _, weight in functions] == [
        ("correct_answer", 1.0), ("has_digit", 0.5), ("num_turns", 0.0)
    ]  # fmt: skip

    sampler, cfg = factory(SINGLE)
    try:
        env_class = sampler.factory
        # the rubric's functions with their weights; MultiTurnEnv's own num_turns metric at weight 0
        assert env_class.rewards == [("correct_answer", 1.0), ("has_digit", 0.5), ("num_turns", 0.0)]
        rewards = environment_rewards(cfg.rollout)
        assert [(name, weight) for name, _, weight in rewards] == env_class.rewards
        scores = []
        for text in ("It is 5.", "It is 6.", "no idea"):
            env = env_class()
            assert env.reset(rows[0]) == rows[0]["prompt"]
            step = env.step(text)
            assert (step.messages, step.done) == ([], True)  # one turn, then the rollout ends
            scores.append(env.finish(None))
            env.close()
        assert scores == [
            {"correct_answer": 1.0, "has_digit": 1.0, "num_turns": 1.0},
            {"correct_answer": 0.0, "has_digit": 1.0, "num_turns": 1.0},
            {"correct_answer": 0.0, "has_digit": 0.0, "num_turns": 1.0},
        ]
        # each reward reads its own score from the episodes' env_scores; the total is the rubric's weighting
        values = {name: fn([None] * 4, [None] * 4, env_scores=[*scores, None]) for name, fn, _ in rewards}
        assert values["correct_answer"] == [1.0, 0.0, 0.0, None]  # None: an episode without scores
        total = [sum(w * (values[n][k] or 0.0) for n, _, w in rewards) for k in range(3)]
        assert total == [1.5, 0.5, 0.0]
    finally:
        sampler.close()


def test_a_tool_environment_runs_the_calls_it_reads_and_a_game_gives_turn_rewards_and_its_last_word():
    rows = load_prompts(TOOLS)
    sampler, _ = factory(TOOLS)
    try:
        env_class = sampler.factory
        assert [t["function"]["name"] for t in env_class.tool_schemas] == ["count_digits"]  # told to the model
        env = env_class()
        assert env.reset(rows[0]) == [{"role": "user", "content": "2+3"}]
        call = 'Counting.<tool_call>\n{"name": "count_digits", "arguments": {"text": "a1b22"}}\n</tool_call>'
        step = env.step(call)
        assert (step.messages, step.done, step.tool_calls) == (
            [{"role": "tool", "content": "3", "tool_call_id": "call_0_0"}], False, 1
        )  # fmt: skip
        step = env.step("It is 5.")  # no call: the answer ends ToolEnv's rollout
        assert (step.messages, step.done, step.tool_calls) == ([], True, 0)
        assert env.finish(None) == {
            "used_tool": 1.0, "has_digit": 1.0, "num_turns": 2.0, "total_tool_calls": 1.0, "count_digits_calls": 1.0
        }  # fmt: skip
        # a call that cannot be read stays text (vLLM's parser leaves it so): no call, the episode ends
        env = env_class()
        env.reset(rows[0])
        assert env.step("<tool_call>{not json</tool_call>").done
        assert env.finish(None)["used_tool"] == 0.0
        # a turn cut at max_new_tokens is the rollout's last answer (truncated, its call not run), scored
        env = env_class()
        env.reset(rows[0])
        env.step(call)
        assert env.finish("It is 7 and " + call[:-5]) == {
            "used_tool": 1.0, "has_digit": 1.0, "num_turns": 2.0, "total_tool_calls": 1.0, "count_digits_calls": 1.0
        }  # fmt: skip
    finally:
        sampler.close()

    sampler, _ = factory("verifiers:vf_envs:game")
    try:
        env = sampler.factory()
        env.reset(rows[1])
        steps = [env.step(text) for text in ("a1", "b", "c3")]
        assert [(s.messages, s.reward, s.done) for s in steps] == [
            ([{"role": "user", "content": "turn 1"}], 1.0, False),
            ([{"role": "user", "content": "turn 2"}], 0.0, False),
            ([{"role": "user", "content": "game over"}], 1.0, True),  # its final_env_response
        ]
        assert env.finish(None) == {"has_digit": 1.0, "turns_played": 3.0, "num_turns": 3.0}
        env = sampler.factory()
        env.reset(rows[1])
        env.step("a1")
        assert env.finish(None)["turns_played"] == 1.0  # grpokit ended it (max_turns): scored as it stands
    finally:
        sampler.close()


def test_in_a_rollout_the_models_tokens_are_trained_the_tools_masked_and_each_episode_scored():
    """The tiny model's every turn calls count_digits (rollout.tool_parser=episode_parts:every_turn_calls);
    verifiers' ToolEnv runs it in the episode's worker and its result is rendered and masked."""
    model, tok = tool_model()
    sampler, cfg = factory(
        TOOLS, "rollout.tool_parser=episode_parts:every_turn_calls", "rollout.max_turns=2",
        "rollout.max_new_tokens=16", "rollout.group_size=2",
    )  # fmt: skip
    try:
        sampler.check_tokenizer(tok)
        shown = tok.decode(sampler.envs[TOOLS].delta.prompt_ids([{"role": "user", "content": "x"}]))
        assert tok.decode(tok.encode("tools: count_digits", add_special_tokens=False)) in shown  # told to the model
        rows = load_prompts(TOOLS)[:2]
        batch = sampler.rollout(FastGenerator(), model, tok, rows, seed=3, eos_token_ids=[tok.eos_token_id])
        r = batch.rollout
        stepped = 0  # turns that ended with the EOS: the environment was stepped on each (its call run)
        for k, ep in enumerate(batch.episodes):
            assert ep.failed is None
            turns = [m for m in ep.completion if m["role"] == "assistant"]
            results = [m for m in ep.completion if m["role"] == "tool"]
            # each stepped turn's call ran in verifiers' ToolEnv: its result is the digits of the turn's text
            assert [m["content"] for m in results] == [str(count_digits(t["content"])) for t in turns[: len(results)]]
            runs = segments(r.completion_mask[k][r.context_mask[k].bool()].tolist())
            assert [v for v, _, _ in runs] == [1, 0] * len(results) + [1] * (len(turns) > len(results))
            ended = 0  # this episode's turns that ended with the EOS: a cut turn calls nothing
            for (_, start, end), turn in zip(runs[::2], turns):  # the model's tokens are its turns' tokens
                assert tok.decode(r.completion_ids[k, start:end], skip_special_tokens=True) == turn["content"]
                ended += int(r.completion_ids[k, end - 1]) == tok.eos_token_id
            stepped += ended
            assert ep.env_scores == {
                "used_tool": float(bool(results)), "has_digit": ep.env_scores["has_digit"],
                "num_turns": float(len(turns)), "total_tool_calls": float(ended), "count_digits_calls": float(ended),
            }  # fmt: skip
            assert ep.env_scores["has_digit"] == float(any(c.isdigit() for c in turns[-1]["content"]))
        assert batch.metrics["tools/calls"] == stepped
        # held-out greedy episodes are scored by the rubric's functions too (evaluate's env_scores column):
        # verifiers' num_turns counts the turns grpokit played, a cut one included
        accuracy_fn = dict((n, f) for n, f, _ in environment_rewards(cfg.rollout))["num_turns"]
        metrics = sampler.evaluate(FastGenerator(), model, tok, rows, accuracy_fn, eos_token_ids=[tok.eos_token_id])
        assert metrics["greedy_score"] == metrics["episode/turns_mean"] >= 1
    finally:
        sampler.close()


def test_verifiers_environments_train_beside_grpokits_own_each_row_its_own_with_its_rubric(tmp_path):
    """Two verifiers environments (single-turn, tools) and grpokit's own (env_parts:Chat) in one run through
    rollout.environment's mapping and the environment column; 2 steps of the tiny model."""
    from env_parts import chat_digit

    model, tok = tool_model()
    cfg = load_config(
        None,
        [f"rollout.environment={{math: {SINGLE}, tools: {TOOLS}, chat: env_parts:Chat}}",
         "rollout.tool_parser=episode_parts:every_turn_calls", "rollout.group_size=2",
         f"train.output_dir={tmp_path / 'run'}", "train.steps=2", "train.stop_after_flat_steps=0",
         "rollout.prompts_per_step=3", "rollout.max_turns=2", "rollout.max_new_tokens=12", "model.device=cpu",
         "eval.enabled=false", "optim.lr=3e-3", "data.shuffle=false"],
    )  # fmt: skip
    math_rows = [dict(r, environment="math") for r in load_prompts(SINGLE)[:2]]
    tool_rows = [dict(r, environment="tools") for r in load_prompts(TOOLS)[:2]]
    chat_rows = [{"prompt": "hi", "environment": "chat"}] * 2
    rows = [x for triple in zip(math_rows, tool_rows, chat_rows) for x in triple]
    trainer = GRPOTrainer(
        cfg, model=model, tokenizer=tok, train_rows=rows, reward_functions=[("chat_digit", chat_digit, 1.0)]
    )
    assert trainer.reward_weights == {
        "chat_digit": 1.0, "math.correct_answer": 1.0, "math.has_digit": 0.5, "tools.used_tool": 1.0,
        "tools.has_digit": 0.5, "math.num_turns": 0.0, "tools.num_turns": 0.0, "tools.total_tool_calls": 0.0,
        "tools.count_digits_calls": 0.0,
    }  # fmt: skip
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    assert trainer.train()["steps"] == 2
    assert any((before[k] != v).any() for k, v in trainer.model.state_dict().items())  # it trained
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in lines if "env/math/episodes" in m]
    assert len(steps) == 2
    for m in steps:
        assert m["env/math/episodes"] == m["env/tools/episodes"] == m["env/chat/episodes"] == 2.0
        assert m["env/math/failed"] == m["env/tools/failed"] == 0.0
        # each environment's rewards on its own rows alone (a third each), every one of them scored
        for name in ("math.correct_answer", "math.has_digit", "tools.used_tool", "chat_digit"):
            assert m[f"reward/{name}/applicable"] == pytest.approx(1 / 3)
        assert m["reward/math.num_turns/mean"] == 1.0  # single-turn
        assert 1.0 <= m["reward/tools.num_turns/mean"] <= 2.0  # cut by rollout.max_turns


def test_what_grpokit_cannot_run_is_named(monkeypatch):
    with pytest.raises(ConfigError, match="scores a group of rollouts together"):
        factory("verifiers:vf_envs:group_scored")
    with pytest.raises(vf_integration.UnsupportedVerifiersError, match="not a verifiers Environment of the classic"):
        factory("verifiers:vf_envs:not_an_environment")
    with pytest.raises(ConfigError, match="no installed package provides the verifiers environment 'no-such-env'"):
        factory("verifiers:no-such-env")
    with pytest.raises(ConfigError, match="dataset='test' must be train"):
        load_prompts(SINGLE + "?dataset=test")
    row = load_prompts(SINGLE)[0]
    sampler, _ = factory("verifiers:vf_envs:forgetful")
    try:
        env = sampler.factory()
        env.reset(row)
        with pytest.raises(ValueError, match="rewrites earlier turns"):
            env.step("1")  # its next request drops the model's turn: not one transcript
        env.close()
    finally:
        sampler.close()
    sampler, _ = factory(TOOLS)
    try:
        other_tools = {"tool_defs": [{"name": "search", "description": "find", "parameters": {"type": "object"}}]}
        image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}]
        for bad, words in ((dict(row, info=other_tools), r"the row's tools \['search'\] are not the environment's"),
                           (dict(row, prompt=image), "holds image_url content")):  # fmt: skip
            env = sampler.factory()
            with pytest.raises(ValueError, match=words):
                env.reset(bad)
            env.close()
    finally:
        sampler.close()
    monkeypatch.setattr(verifiers, "__version__", "0.4.0")
    with pytest.raises(vf_integration.UnsupportedVerifiersError, match=r"verifiers 0.4.0 is installed.*>=0.3,<0.4"):
        factory("verifiers:vf_envs:single_turn?system_prompt=other")
