"""Training on multi-turn episodes (grpokit.rollout.episodes): tools and environments through GRPOTrainer, every
preset's path, micro-batch invariance with tool tokens in the batch, named errors before the model loads. The
tool, its parser, the rewards and the Countdown game are tests/episode_parts.py's (configs name that module)."""

import json

import pytest
import torch
from episode_parts import Countdown, count_digits, parity, turns_reward, used_tool
from tool_model import TOOLS_TEMPLATE, tool_model

from grpokit.config.schema import load_config
from grpokit.core.errors import ConfigError, EnvironmentFailedError
from grpokit.rollout.envs import EnvStep
from grpokit.rollout.tools import ToolDefinitionError
from grpokit.trainers.grpo import GRPOTrainer

ROWS = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(4) for b in range(4)]


def no_doc(text: str) -> int:
    return 0


def make_cfg(tmp_path, *extra):
    return load_config(
        None,
        [
            f"train.output_dir={tmp_path / 'run'}",
            "train.steps=2",
            "train.samples_every=1",
            "train.stop_after_flat_steps=0",
            "rollout.group_size=4",
            "rollout.prompts_per_step=2",
            "rollout.max_new_tokens=8",
            "rollout.max_turns=3",
            "rollout.tool_parser=episode_parts:digit_parser",
            "rollout.tools=[episode_parts:count_digits]",
            "optim.lr=3e-3",
            "model.device=cpu",
            "algo.preset=grpo",
            "eval.enabled=false",
            *extra,
        ],
    )


def make_trainer(tmp_path, *extra, rewards=(("used_tool", used_tool, 1.0),)):
    model, tok = tool_model()
    return GRPOTrainer(
        make_cfg(tmp_path, *extra),
        model=model,
        tokenizer=tok,
        train_rows=ROWS,
        reward_functions=list(rewards),
    )


@pytest.mark.parametrize(
    "extra",
    [
        ("algo.preset=grpo",),
        ("algo.preset=dapo", "algo.max_sampling_rounds=8", "train.accuracy_reward=used_tool"),
        ("algo.preset=ppo", "optim.mini_batches=2"),
        ("algo.preset=grpo", "lora.enabled=true", "lora.r=4", "algo.beta=0.04", "rollout.engine=hf"),
    ],
    ids=["grpo", "dapo", "ppo", "lora-kl-hf"],
)
def test_tool_episodes_train_under_each_preset(tmp_path, extra):
    rewards = [("used_tool", used_tool, 1.0)] + (
        [("parity", parity, 1.0)] if "algo.preset=dapo" in extra else []
    )
    trainer = make_trainer(tmp_path, *extra, rewards=rewards)
    trainer.train()
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    lines = [line for line in lines if "loss" in line]
    assert len(lines) == 2
    last = lines[-1]
    for key in (
        "episode/turns_mean",
        "tools/calls",
        "tools/errors",
        "tools/timeouts",
        "masked_token_frac",
        "time/tools",
    ):
        assert key in last, key
    assert sum(line["tools/calls"] for line in lines) > 0  # (a step's model may have stopped calling)
    assert all(0 <= line["masked_token_frac"] < 1 for line in lines) and lines[0]["masked_token_frac"] > 0
    assert torch.isfinite(torch.tensor(last["loss"]))
    # the step's rollout record (grpokit.rollout.record) holds whole episodes: tool tokens with loss_mask 0
    import pyarrow.parquet as pq

    record = pq.read_table(tmp_path / "run" / "rollouts" / "step_000001.parquet").to_pylist()
    assert any(0 in row["loss_mask"] and 1 in row["loss_mask"] for row in record)
    assert all(len(row["tokens"]) == len(row["loss_mask"]) >= row["length"] for row in record)
    # the trainer scores the ids the sampler generated, in the same context, turn after turn
    assert lines[0]["sampler_logprob_diff/max"] < 1e-4
    if "lora.enabled=true" in extra:
        assert last["kl"] >= 0
    if extra == ("algo.preset=grpo",):  # resume from the final checkpoint and take one more step
        model, tok = tool_model()
        resumed = GRPOTrainer(
            make_cfg(tmp_path, *extra, "train.steps=3"), model=model, tokenizer=tok, train_rows=ROWS,
            reward_functions=[("used_tool", used_tool, 1.0)], resume=True,
        )  # fmt: skip
        assert resumed.step == 2
        assert resumed.train()["steps"] == 3


def test_environment_turn_rewards_drive_grpo_process(tmp_path):
    trainer = make_trainer(
        tmp_path,
        "rollout.tools=[]",
        "rollout.environment=episode_parts:Countdown",
        "algo.preset=grpo_process",
        "train.samples_every=0",
        rewards=[("turns_reward", turns_reward, 1.0)],
    )
    batch, _, _ = trainer.sampler.sample_batch(trainer.step)
    assert batch.step_rewards is not None
    for steps, rewards in zip(batch.step_rewards, batch.per_function["turns_reward"]):
        # each rewarded turn is a step (0 or 1) at its last token, then the outcome (here their sum) at the end
        assert all(score in (0.0, 1.0) for _, score in steps[:-1])
        assert steps[-1][1] == rewards == sum(score for _, score in steps[:-1])
        assert [t for t, _ in steps] == sorted(t for t, _ in steps)
    assert max(len(steps) for steps in batch.step_rewards) >= 3
    metrics = trainer.train_step()
    assert metrics["advantage/abs_mean"] > 0 and metrics["episode/turns_mean"] > 1


class Quiz:
    """An environment that offers count_digits (its class's tools): each turn's calls run first, then its
    step sees them and rewards the turn 1 when it called; done after 2 steps."""

    tools = [count_digits]

    def __init__(self):
        self.turn = 0

    def reset(self, row):
        return [{"role": "user", "content": row["prompt"]}]

    def step(self, text, tool_results):
        self.turn += 1
        return EnvStep([{"role": "user", "content": f"{len(tool_results)} call(s)"}], float(bool(tool_results)),
                       done=self.turn >= 2)  # fmt: skip


class Duplicate(Quiz):
    tools = ["episode_parts:count_digits"]


class NotAList(Quiz):
    tools = "count_digits"


class Undocumented(Quiz):
    tools = [no_doc]


@pytest.mark.slow
def test_an_environment_offering_tools_trains_and_says_so(tmp_path, capsys):
    """rollout.environment whose class has tools (and rollout.tools left empty): the model is told about the
    tool, its calls run in the tool workers and the environment's step sees them (refused before: "set
    rollout.tools or rollout.environment, not both", and an environment's tools were never read)."""
    trainer = make_trainer(
        tmp_path, "rollout.tools=[]", "rollout.environment=test_multiturn_training:Quiz", "train.steps=1",
        "rollout.max_new_tokens=24", "rollout.max_episode_tokens=96",
        rewards=[("turns_reward", turns_reward, 1.0)],
    )  # fmt: skip
    trainer.train()
    err = capsys.readouterr().err
    line = next(line for line in err.splitlines() if line.startswith("prompts: "))
    assert line.endswith(
        "with the environment test_multiturn_training:Quiz and the tools ['count_digits'] (data.template does not apply)"
    )
    metrics = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert metrics["tools/calls"] > 0 and metrics["episode/turns_mean"] > 1
    rows = [json.loads(line) for line in (tmp_path / "run" / "samples" / "step_000001.jsonl").read_text().splitlines()]
    called = [r["completion"] for r in rows if "1 call(s)" in r["completion"]]
    assert called and all("result: " in c for c in called)  # the tool's result, then the environment's message


def test_an_environments_tools_are_checked_before_the_model_loads(tmp_path):
    missing = [f"model.name_or_path={tmp_path / 'no_such_model'}"]
    cases = [
        ("rollout.environment=test_multiturn_training:Duplicate: its tools and rollout.tools both have a tool "
         "named 'count_digits'", ["rollout.environment=test_multiturn_training:Duplicate"]),
        ("its tools attribute is a str", ["rollout.tools=[]", "rollout.environment=test_multiturn_training:NotAList"]),
        ("rollout.environment=test_multiturn_training:Undocumented: its tools[0]: tool 'no_doc'",
         ["rollout.tools=[]", "rollout.environment=test_multiturn_training:Undocumented"]),
    ]  # fmt: skip
    for words, extra in cases:
        with pytest.raises(ToolDefinitionError) as e:
            GRPOTrainer(
                make_cfg(tmp_path, *missing, *extra), train_rows=ROWS, reward_functions=[("u", used_tool, 1.0)]
            )
        assert words in str(e.value), str(e.value)


class Flaky(Countdown):
    """Countdown whose step raises on the row "0+1=" (its episodes fail; the other row's go on)."""

    def reset(self, row):
        self.row = row
        return super().reset(row)

    def step(self, text):
        if self.row["prompt"] == "0+1=":
            return EnvStep([], float(int("seven")))
        print("ENV-PRINTS-THIS")  # kept from the trainer's streams
        return super().step(text)


@pytest.mark.slow
def test_environment_failures_stop_the_run_only_under_the_failure_fraction_rule(tmp_path, capfd):
    rows = [{"prompt": "0+0=", "answer": "0"}, {"prompt": "0+1=", "answer": "1"}]

    def trainer(frac):
        model, tok = tool_model()
        cfg = make_cfg(
            tmp_path / str(frac), "rollout.tools=[]", "rollout.environment=test_multiturn_training:Flaky",
            "train.samples_every=0", f"train.max_reward_failure_frac={frac}", "rollout.max_new_tokens=16",
        )  # fmt: skip
        return GRPOTrainer(cfg, model=model, tokenizer=tok, train_rows=rows,
                           reward_functions=[("turns_reward", turns_reward, 1.0)])  # fmt: skip

    strict = trainer(0.0)
    with pytest.raises(EnvironmentFailedError) as e:  # the user's code, exit 3 (issue 48: was TrainingError)
        strict.train_step()
    message = str(e.value)
    for words in ("environment test_multiturn_training:Flaky", "of 8 (allowed: 0 of them) episodes",
                  "step raised ValueError: invalid literal for int()", "'0+1='", "max_reward_failure_frac"):  # fmt: skip
        assert words in message, message
    strict.sampler.episodes.close()
    tolerant = trainer(0.5)
    batch, _, _ = tolerant.sampler.sample_batch(tolerant.step)
    failing = [k for k, row in enumerate(batch.rows) if row["prompt"] == "0+1="]
    assert len(failing) == 4 and all(batch.rewards[k] == 0 for k in failing)
    assert max(batch.rewards.tolist()) > 0  # the other row's episodes keep their scores
    tolerant.sampler.episodes.take_metrics()  # (that round's counts: the step below samples its own)
    metrics = tolerant.train_step()  # (a turn cut at max_new_tokens is never stepped: 1 to 4 failures)
    assert 1 <= metrics["episodes/failed"] <= 4 and metrics["episode/turns_mean"] > 1
    tolerant.sampler.episodes.close()
    out, err = capfd.readouterr()
    assert "ENV-PRINTS-THIS" not in out + err


def test_micro_batch_split_leaves_the_multi_turn_gradient_unchanged(tmp_path):
    results = {}
    for micro in (16, 3):
        trainer = make_trainer(
            tmp_path / f"m{micro}", f"optim.micro_batch_size={micro}", "train.samples_every=0"
        )
        grads = []
        trainer.learner.optimizer.register_step_pre_hook(
            lambda *_, g=grads, m=trainer.model: g.extend(p.grad.detach().clone() for p in m.parameters())
        )
        results[micro] = (grads, trainer.train_step())
    (g_one, m_one), (g_split, m_split) = results[16], results[3]
    assert m_one["masked_token_frac"] > 0 and m_one["reward/total/std"] > 0  # tool tokens and a signal
    assert len(g_one) == len(g_split) > 0
    for a, b in zip(g_one, g_split):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert m_one["loss"] == pytest.approx(m_split["loss"], rel=1e-5, abs=1e-7)


def test_bad_tools_and_environments_fail_before_the_model_loads(tmp_path):
    missing = [f"model.name_or_path={tmp_path / 'no_such_model'}"]  # loading it would fail differently
    cases = [
        (ToolDefinitionError, "no_doc", ["rollout.tools=[test_multiturn_training:no_doc]"]),
        (ToolDefinitionError, "rollout.tool_parser='xml'", ["rollout.tool_parser=xml"]),
        (ConfigError, "rollout.max_turns=0", ["rollout.max_turns=0"]),
        (ConfigError, "importing module 'nope' failed", ["rollout.tools=[]", "rollout.environment=nope:Env"]),
    ]
    for error, words, extra in cases:
        with pytest.raises(error) as e:
            GRPOTrainer(
                make_cfg(tmp_path, *missing, *extra),
                train_rows=ROWS,
                reward_functions=[("u", used_tool, 1.0)],
            )
        assert words in str(e.value), str(e.value)


def test_a_template_without_tools_is_a_named_error(tmp_path):
    model, tok = tool_model()
    tok.chat_template = TOOLS_TEMPLATE.replace("{% if tools %}", "{% if false %}")
    with pytest.raises(ConfigError, match="ignores tools"):
        GRPOTrainer(
            make_cfg(tmp_path),
            model=model,
            tokenizer=tok,
            train_rows=ROWS,
            reward_functions=[("u", used_tool, 1.0)],
        )


def test_evaluation_runs_greedy_episodes(tmp_path):
    model, tok = tool_model()
    trainer = GRPOTrainer(
        make_cfg(tmp_path), model=model, tokenizer=tok, train_rows=ROWS, eval_rows=ROWS[:6],
        reward_functions=[("used_tool", used_tool, 1.0)],
    )  # fmt: skip
    examples = []
    result = trainer.held_out_metrics(examples)
    assert result["num_examples"] == 6 and result["episode/turns_mean"] >= 1
    # the accuracy reward is "called a tool": its share and the calls per episode agree
    assert (result["accuracy"] > 0) == (result["tools/calls_per_episode"] > 0)
    assert examples and isinstance(examples[0]["completion"], str)


@pytest.mark.slow
def test_evaluation_of_episodes_shows_its_progress_on_stderr(tmp_path, capsys):
    model, tok = tool_model()
    trainer = GRPOTrainer(
        make_cfg(tmp_path), model=model, tokenizer=tok, train_rows=ROWS, eval_rows=ROWS[:5],
        reward_functions=[("used_tool", used_tool, 1.0)],
    )  # fmt: skip
    capsys.readouterr()
    trainer.evaluate()
    captured = capsys.readouterr()
    assert [line.split(" (")[0] for line in captured.err.splitlines() if line.startswith("eval: ")] == [
        "eval: greedy 5/5 episodes"
    ]
    assert "eval:" not in captured.out


@pytest.mark.slow
def test_the_run_says_its_prompts_go_through_the_chat_template_with_the_tools(tmp_path, capsys):
    """Episodes render every prompt with the chat template: the start line says so, not data.template's
    "string prompts fed as is (plain)" (issue 38)."""
    trainer = make_trainer(tmp_path, "train.steps=1")
    trainer.train()
    err = capsys.readouterr().err
    line = next(line for line in err.splitlines() if line.startswith("prompts: "))
    assert line == (
        f"prompts: multi-turn episodes: {len(ROWS)} prompt(s) through the tokenizer's chat template, a string "
        "as one user message, with the tools ['count_digits'] (data.template does not apply)"
    )


def test_the_episode_budget_must_fit_the_models_positions(tmp_path):
    from grpokit.run.preflight import check_positions

    cfg = make_cfg(tmp_path, "rollout.max_turns=4", "rollout.max_new_tokens=64")  # budget 4 x 64 = 256
    with pytest.raises(
        ConfigError, match="rollout.max_episode_tokens=256 is beyond the model's 200 positions"
    ):
        check_positions(cfg, {"max_position_embeddings": 200}, "m")
    check_positions(
        make_cfg(tmp_path, "rollout.max_episode_tokens=150"), {"max_position_embeddings": 200}, "m"
    )


def test_python_api_takes_functions_and_saves_their_names(tmp_path):
    cfg = make_cfg(tmp_path, "rollout.tools=[]", "train.samples_every=0")
    cfg.rollout.tools = [count_digits]  # TRL's way: the function itself
    model, tok = tool_model()
    trainer = GRPOTrainer(
        cfg, model=model, tokenizer=tok, train_rows=ROWS, reward_functions=[("u", used_tool, 1.0)]
    )
    assert cfg.rollout.tools == ["episode_parts:count_digits"]  # what config.yaml will hold
    batch, _, _ = trainer.sampler.sample_batch(trainer.step)
    assert batch.rollout.context_mask is not None
    cfg = make_cfg(tmp_path, "rollout.tools=[]")
    cfg.rollout.environment = Countdown
    GRPOTrainer(cfg, model=model, tokenizer=tok, train_rows=ROWS, reward_functions=[("u", used_tool, 1.0)])
    assert cfg.rollout.environment == "episode_parts:Countdown"
