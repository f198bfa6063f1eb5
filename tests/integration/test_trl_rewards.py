"""TRL-style reward functions run unchanged (issue 13): the calling convention of TRL's GRPOTrainer
(`_calculate_rewards`, checked against its source) and no silent failure of a reward function.

The nine functions below are copies of the examples of TRL's GRPO documentation ("Using a custom
reward function", docs/source/grpo_trainer.md) and of trl/rewards/*.py, changed only where the
documentation's example is written for plain-text data and this data is conversational."""

import asyncio
import json
import math
import re

import pytest
from tiny_model import make_tiny_model, save_tiny_model

from grpokit.config.schema import load_config
from grpokit.core.errors import TrainingError
from grpokit.rewards import RewardRunner, resolve_reward
from grpokit.scoring.completions import as_completions
from grpokit.scoring.runner import TrainerState
from grpokit.trainers.grpo import GRPOTrainer

CHAT_ROWS = [
    {
        "prompt": [{"role": "user", "content": f"what is {a}+{b}?"}],
        "solution": str(a + b),
        "task": "math" if (a + b) % 2 == 0 else "chat",
    }
    for a in range(4)
    for b in range(4)
]


# --- the documentation's examples -----------------------------------------------------------------
def token_length_reward(completion_ids, **kwargs):  # Example 1
    """Reward function that assigns higher scores to longer completions (in terms of token count)."""
    return [float(len(ids)) for ids in completion_ids]


def format_reward_func(completions, **kwargs):  # Example 2 (conversational)
    """Reward function that checks if the completion has a specific format."""
    pattern = r"^<think>.*?</think><answer>.*?</answer>$"
    completion_contents = [completion[0]["content"] for completion in completions]
    matches = [re.match(pattern, content) for content in completion_contents]
    return [1.0 if match else 0.0 for match in matches]


def boxed_reward_func(completions, solution, **kwargs):  # Example 3, on chat completions
    matches = [re.search(r"\\boxed\{(.*?)\}", completion[0]["content"]) for completion in completions]
    contents = [match.group(1) if match else "" for match in matches]
    return [1.0 if c == gt else 0.0 for c, gt in zip(contents, solution)]


def math_reward_func(prompts, completions, task, **kwargs):  # Example 4: None where it does not apply
    rewards = []
    for prompt, completion, t in zip(prompts, completions, task):
        if t == "math":
            correct = prompt[-1]["role"] == "user" and completion[0]["content"].strip() != ""
            rewards.append(1.0 if correct else -1.0)
        else:
            rewards.append(None)
    return rewards


async def async_reward_func(prompts, completions, **kwargs):  # Example 5
    await asyncio.sleep(0.01)
    return [1.0 if completion else 0.0 for completion in completions]


def logging_reward_func(completions, solution, log_extra=None, log_metric=None, **kwargs):  # Example 6
    extracted = [re.search(r"\d+", c[0]["content"]) for c in completions]
    extracted = [m.group(0) if m else None for m in extracted]
    rewards = [1.0 if e == gt else 0.0 for e, gt in zip(extracted, solution)]
    if log_extra:
        log_extra("golden_answer", list(solution))
        log_extra("extracted_answer", [e or "[none]" for e in extracted])
    if log_metric:
        log_metric("accuracy", sum(rewards) / len(rewards))
    return rewards


def curriculum_reward_func(completions, trainer_state, **kwargs):  # trainer_state, as documented
    progress = trainer_state.global_step / max(trainer_state.max_steps, 1)
    return [progress * len(c[0]["content"]) for c in completions]


# --- copies of trl/rewards/format_rewards.py and accuracy_rewards.py ---------------------------------
def think_format_reward(completions: list[list[dict[str, str]]], **kwargs) -> list[float]:
    pattern = r"^<think>(?!.*<think>)(.*?)</think>.*$"
    completion_contents = [completion[0]["content"] for completion in completions]
    matches = [re.match(pattern, content, re.DOTALL | re.MULTILINE) for content in completion_contents]
    return [1.0 if match else 0.0 for match in matches]


def accuracy_reward(completions, solution, log_extra=None, **kwargs):
    from math_verify import LatexExtractionConfig, parse, verify
    from math_verify.parser import NormalizationConfig

    contents = [completion[0]["content"] for completion in completions]
    rewards = []
    for content, sol in zip(contents, solution, strict=True):
        gold_parsed = parse(sol, parsing_timeout=10)
        if len(gold_parsed) != 0:
            answer_parsed = parse(
                content,
                extraction_config=[
                    LatexExtractionConfig(
                        normalization_config=NormalizationConfig(units=True),
                        boxed_match_priority=0,
                        try_extract_without_anchor=False,
                    )
                ],
                extraction_mode="first_match",
                parsing_timeout=10,
            )
            reward = float(verify(gold_parsed, answer_parsed, timeout_seconds=5))
        else:
            reward = None
        rewards.append(reward)
    if log_extra is not None:
        log_extra("solution", list(solution))
    return rewards


NINE = [
    token_length_reward,
    format_reward_func,
    boxed_reward_func,
    math_reward_func,
    async_reward_func,
    logging_reward_func,
    curriculum_reward_func,
    think_format_reward,
    accuracy_reward,
]


def make_cfg(tmp_path, *extra):
    return load_config(
        None,
        [
            f"train.output_dir={tmp_path / 'run'}",
            "train.steps=2",
            "train.samples_every=0",
            "rollout.group_size=4",
            "rollout.prompts_per_step=2",
            "rollout.max_new_tokens=6",
            "data.template=chat",
            "model.device=cpu",
            "eval.enabled=false",
            *extra,
        ],
    )


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_nine_trl_documentation_rewards_train_on_chat_data(tmp_path):
    """Every function gets TRL's arguments and produces a value (or its None) on every row: one that
    received the wrong shape would raise, and any failure stops the run (the default is strict)."""
    model, tok = make_tiny_model("qwen2", seed=0)
    funcs = [(fn.__name__, fn, 1.0) for fn in NINE]
    trainer = GRPOTrainer(
        make_cfg(tmp_path), model=model, tokenizer=tok, train_rows=CHAT_ROWS, reward_functions=funcs
    )
    trainer.train()
    lines = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert len(lines) == 2
    for line in lines:
        for fn in NINE:
            name = fn.__name__
            assert line[f"reward/{name}/failed_rows"] == 0.0 and line[f"reward/{name}/failed"] == 0.0
            if name != "math_reward_func":
                assert line[f"reward/{name}/applicable"] == 1.0, name
        assert line["reward/logging_reward_func/accuracy"] == pytest.approx(
            line["reward/logging_reward_func/mean"]
        )
    # math_reward_func applies to the "math" rows only: None elsewhere, never a failure
    assert 0.0 < sum(line["reward/math_reward_func/applicable"] for line in lines) < 2.0
    # trainer_state.global_step: 0 at the first step, 1 at the second
    assert lines[0]["reward/curriculum_reward_func/mean"] == 0.0
    assert lines[1]["reward/curriculum_reward_func/mean"] > 0.0


def test_evaluation_scores_chat_data_with_a_trl_accuracy_reward(tmp_path):
    model, tok = make_tiny_model("qwen2", seed=0)
    cfg = make_cfg(tmp_path, "eval.num_samples=2", "train.accuracy_reward=accuracy_reward")
    broken = []  # once it holds True, the accuracy reward fails on every row (a missing column)

    def accuracy(completions, **kwargs):
        if broken:
            raise KeyError("solution")
        return accuracy_reward(completions, **kwargs)

    funcs = [("accuracy_reward", accuracy, 1.0)]
    trainer = GRPOTrainer(
        cfg, model=model, tokenizer=tok, train_rows=CHAT_ROWS, eval_rows=CHAT_ROWS[:3], reward_functions=funcs
    )
    assert trainer.evaluate()["num_examples"] == 3.0  # accuracy_reward reads completion[0]["content"]
    broken.append(True)  # failing on every row of the evaluation stops it with the reason
    with pytest.raises(ValueError, match=r"evaluation: .*every one of the 3 .*raised KeyError: 'solution'"):
        trainer.evaluate()


def test_completions_and_prompts_reach_functions_in_trls_shapes():
    """Chat prompt -> [{"role": "assistant", "content": text}]; a string prompt -> the string; the
    prompts as given; every column, completion_ids, trainer_state, log_metric, log_extra."""
    seen = []

    def spy(prompts, completions, completion_ids, trainer_state, log_metric, log_extra, **kwargs):
        seen.append((prompts, completions, completion_ids, trainer_state.global_step, sorted(kwargs)))
        return [1.0] * len(completions)

    chat = [{"role": "user", "content": "1+1?"}]
    prompts = [chat, "2+2="]
    completions = as_completions(prompts, ["2", "4"])
    assert completions == [[{"role": "assistant", "content": "2"}], "4"]
    columns = {
        "solution": ["2", "4"],
        "completion_ids": [[5], [7]],
        "trainer_state": TrainerState(global_step=7),
    }
    res = RewardRunner([("spy", spy, 1.0)], isolation="thread")(prompts, completions, columns)
    assert res.per_function["spy"] == [1.0, 1.0]
    assert seen == [(prompts, completions, [[5], [7]], 7, ["solution"])]


def test_builtin_rewards_read_chat_completions_as_text():
    texts = ["<think>\n1+1 is 2\n</think>\n<answer>\n2\n</answer>", "the answer is \\boxed{4}"]
    chat = as_completions([[{"role": "user", "content": "q"}]] * 2, texts)
    columns = {"answer": ["2", "4"], "completion_ids": [[1, 2, 3], [4, 5]]}
    params = {"length_penalty": {"max_len": 5}, "overlong_penalty": {"max_len": 6, "buffer_len": 2}}
    for name in ("math_accuracy", "format_strict", "format_lenient", "language_consistency", *params):
        fn = resolve_reward(name, **params.get(name, {}))
        plain = RewardRunner([(name, fn, 1.0)], isolation="thread")(None, texts, columns)
        messages = RewardRunner([(name, fn, 1.0)], isolation="thread")(None, chat, columns)
        assert messages.per_function == plain.per_function and not plain.row_errors[name], name
    assert plain.per_function  # the loop ran


def test_trls_own_reward_functions_run_unchanged():
    rewards = pytest.importorskip("trl.rewards")
    pytest.importorskip("math_verify")
    texts = ["<think>\nsum\n</think>\nthe answer is $\\boxed{4}$", "no idea"]
    completions = as_completions([[{"role": "user", "content": "2+2?"}]] * 2, texts)
    funcs = [
        ("think_format_reward", rewards.think_format_reward, 1.0),
        ("accuracy_reward", rewards.accuracy_reward, 1.0),
    ]
    with RewardRunner(funcs) as runner:
        res = runner(None, completions, {"solution": ["$4$", "$4$"], "completion_ids": [[1], [2]]})
    assert res.per_function == {"think_format_reward": [1.0, 0.0], "accuracy_reward": [1.0, 0.0]}


PLAIN_ROWS = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(4) for b in range(4)]


def test_a_reward_failing_on_every_row_stops_the_cli_with_its_reason(tmp_path, capsys):
    from grpokit.cli.main import main

    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in PLAIN_ROWS))
    (tmp_path / "my_rewards.py").write_text(
        "def brevity(completions, **kwargs):\n    return [len(c) / 10 for c in completions]\n\n"
        "def broken(completions, answer, **kwargs):\n    raise KeyError('solution')\n"
    )
    (tmp_path / "cfg.yaml").write_text(
        "rewards:\n"
        f"  - name: {tmp_path / 'my_rewards.py'}:brevity\n"
        f"  - name: {tmp_path / 'my_rewards.py'}:broken\n"
    )
    args = [
        "train",
        "--config",
        str(tmp_path / "cfg.yaml"),
        f"model.name_or_path={save_tiny_model(tmp_path / 'model')}",
        f"data.train={tmp_path / 'data.jsonl'}",
        f"train.output_dir={tmp_path / 'run'}",
        "train.steps=2",
        "data.template=plain",
        "train.accuracy_reward=brevity",  # two rewards, neither a verifier: say which
        "rollout.max_new_tokens=4",
        "rollout.group_size=2",
        "rollout.prompts_per_step=2",
        "eval.enabled=false",
        "train.tensorboard=false",
    ]
    code = main(args)
    err = capsys.readouterr().err
    assert code != 0, err
    assert "'broken' failed on every one of the 4 completions" in err
    assert "first failing row 0: raised KeyError: 'solution'" in err and "prompt: '" in err


@pytest.mark.slow
def test_nan_rewards_stop_the_run_or_count_within_the_allowed_share(tmp_path):
    def nan_everywhere(completions, **kwargs):
        return [math.nan] * len(completions)

    def nan_on_odd_answers(completions, answer, **kwargs):
        return [math.inf if int(a) % 2 else 1.0 for a in answer]

    def trainer(fn, *extra):
        model, tok = make_tiny_model("qwen2", seed=0)
        folder = tmp_path / f"{fn.__name__}{len(extra)}"
        cfg = make_cfg(folder, "data.template=plain", "rollout.prompts_per_step=4", *extra)
        funcs = [(fn.__name__, fn, 1.0)]
        return GRPOTrainer(cfg, model=model, tokenizer=tok, train_rows=PLAIN_ROWS, reward_functions=funcs)

    with pytest.raises(TrainingError, match=r"'nan_everywhere' failed on every one of the 16 .*returned nan"):
        trainer(nan_everywhere, "train.max_reward_failure_frac=1").train()
    with pytest.raises(TrainingError, match=r"'nan_on_odd_answers' failed on \d+ of 16 .*: returned inf"):
        trainer(nan_on_odd_answers, "train.steps=20").train()  # strict by default: a few rows are enough
    trainer(nan_on_odd_answers, "train.max_reward_failure_frac=0.9", "train.stop_after_flat_steps=0").train()
    lines = read_jsonl(tmp_path / "nan_on_odd_answers2" / "run" / "metrics.jsonl")
    assert len(lines) == 2 and all(line["reward/nan_on_odd_answers/failed_rows"] % 4 == 0 for line in lines)
