"""reasoning-gym (issue 53 item 1): a task by name as the training and held-out data, its own score_answer as
the reward, per-task pass rates in the metrics, a curriculum that raises a task's level from its pass rate.
The learning test: the embedded demo model (grpokit demo --print-model-path, warm-started on "a+b=") trains
on reasoning-gym's basic_arithmetic, written as the demo writes its prompts, and its held-out score rises."""

from __future__ import annotations

import json

import pytest

pytest.importorskip(
    "reasoning_gym", reason="reasoning-gym is not installed (pip install 'grpokit[reasoning-gym]')"
)

from grpo_runs import make_cfg  # noqa: E402
from tiny_model import make_tiny_model  # noqa: E402

from grpokit.config.schema import load_config  # noqa: E402
from grpokit.core.errors import ConfigError  # noqa: E402
from grpokit.data.prompts import load_prompts  # noqa: E402
from grpokit.demos.default import SHIPPED_DIR  # noqa: E402
from grpokit.integrations.reasoning_gym import Curriculum, reasoning_gym_score, task_rows  # noqa: E402
from grpokit.trainers.grpo import GRPOTrainer  # noqa: E402

ADDITION = dict(  # two 1-digit terms, only '+': the demo model's task, as reasoning-gym draws it
    min_terms=2,
    max_terms=2,
    min_digits=1,
    max_digits=1,
    operators=["+"],
    allow_parentheses=False,
    allow_negation=False,
)


def as_demo_prompt(rows: list[dict]) -> list[dict]:
    """The demo model reads "4+1=": reasoning-gym's expression without its spaces."""
    return [{**r, "prompt": r["entry"]["metadata"]["expression"].replace(" ", "") + "="} for r in rows]


def test_a_task_by_name_and_config_is_rows_its_scorer_reads_and_epochs_draw_new_rows():
    rows = load_prompts(
        "reasoning_gym:basic_arithmetic?size=6&seed=3&max_digits=1&min_terms=2&max_terms=2&operators=[+]&allow_parentheses=false&allow_negation=false&epochs=2"
    )
    assert len(rows) == 12 and {r["task"] for r in rows} == {"basic_arithmetic"}
    for r in rows:  # the question as the prompt, the answer the sum
        a, b = (int(x) for x in r["entry"]["metadata"]["expression"].split(" + "))
        assert r["prompt"] == f"Calculate {a} + {b}." and r["answer"] == str(a + b)
    assert [r["prompt"] for r in rows[:6]] != [r["prompt"] for r in rows[6:]]  # epoch 2: drawn anew
    assert rows[:6] == load_prompts(
        "reasoning_gym:basic_arithmetic?size=6&seed=3&max_digits=1&min_terms=2&max_terms=2&operators=[+]&allow_parentheses=false&allow_negation=false"
    )
    # the task's own scorer through the <answer> block the task's prompts ask for
    completions = [
        f"<answer>{rows[0]['answer']}</answer>",
        f"<answer>{int(rows[0]['answer']) + 1}</answer>",
        rows[0]["answer"],
    ]
    logged = {}
    scores = reasoning_gym_score(
        [rows[0]["prompt"]] * 3, completions, task=["basic_arithmetic"] * 3, entry=[rows[0]["entry"]] * 3,
        log_metric=lambda k, v: logged.setdefault(k, []).append(v),
    )  # fmt: skip
    assert scores == [1.0, 0.0, 0.0]  # (no <answer> block: nothing to score)
    assert logged == {"pass/basic_arithmetic": [1.0, 0.0, 0.0], "score/basic_arithmetic": [1.0, 0.0, 0.0]}
    with pytest.raises(ConfigError, match="'basic_arithmetc' is not a reasoning-gym task"):
        load_prompts("reasoning_gym:basic_arithmetc?size=2")
    with pytest.raises(ConfigError, match="size=0 must be an integer >= 1"):
        load_prompts("reasoning_gym:basic_arithmetic?size=0")


def test_a_weighted_mix_from_reasoning_gyms_composite_file(tmp_path):
    mix = tmp_path / "mix.yaml"
    mix.write_text(
        "size: 40\nseed: 2\ndatasets:\n"
        "  - {name: basic_arithmetic, weight: 3, config: {max_digits: 1, min_terms: 2, max_terms: 2}}\n"
        "  - {name: chain_sum, weight: 1, config: {max_digits: 1, min_terms: 2, max_terms: 2}}\n"
    )
    rows = load_prompts(f"reasoning_gym:{mix}")
    tasks = [r["task"] for r in rows]
    assert len(rows) == 40 and set(tasks) == {"basic_arithmetic", "chain_sum"}
    assert tasks.count("basic_arithmetic") > tasks.count("chain_sum")  # weights 3:1


@pytest.mark.slow
def test_the_demo_model_learns_reasoning_gym_addition_and_the_pass_rate_is_logged_per_task(tmp_path):
    train = as_demo_prompt(
        task_rows("basic_arithmetic", size=200, seed=1, configs={"basic_arithmetic": ADDITION})
    )
    held_out = as_demo_prompt(
        task_rows("basic_arithmetic", size=40, seed=7, configs={"basic_arithmetic": ADDITION})
    )
    cfg = load_config(
        None,
        [
            f"model.name_or_path={SHIPPED_DIR}", "model.device=cpu", "model.dtype=float32",
            f"train.output_dir={tmp_path / 'run'}", "train.steps=10", "train.samples_every=0", "train.seed=0",
            "data.template=plain", "data.max_prompt_tokens=16",
            "rollout.group_size=8", "rollout.prompts_per_step=16", "rollout.max_new_tokens=8",
            "algo.preset=grpo", "optim.lr=2e-4", "optim.mini_batches=2", "optim.warmup_steps=2",
            "optim.max_grad_norm=1.0", "eval.every=0", "eval.num_samples=1",
        ],
    )  # fmt: skip
    trainer = GRPOTrainer(
        cfg,
        train_rows=train,
        eval_rows=held_out,
        reward_functions=[("reasoning_gym_score", reasoning_gym_score, 1.0)],
    )
    summary = trainer.train()
    before, after = summary["eval_accuracy_before"], summary["eval_accuracy_after"]
    assert after >= before + 0.15, (before, after)  # 40 held-out problems: 6 more solved at least
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in lines if "reward/reasoning_gym_score/pass/basic_arithmetic" in m]
    assert len(steps) == 10  # every step's pass rate of the task, the share of its samples that scored 1
    assert all(
        m["reward/reasoning_gym_score/pass/basic_arithmetic"] == m["reward/reasoning_gym_score/mean"]
        for m in steps
    )


def test_the_curriculum_raises_a_tasks_level_from_its_pass_rate_and_redraws_its_rows_alone(tmp_path):
    rows = task_rows({"basic_arithmetic": 1, "chain_sum": 1}, size=16, seed=4,
                     configs={"basic_arithmetic": ADDITION, "chain_sum": {"max_digits": 1}})  # fmt: skip
    model, tok = make_tiny_model("qwen2", seed=0)
    chain_before = [r for r in rows if r["task"] == "chain_sum"]
    raised = Curriculum("basic_arithmetic", raise_at=0.0 + 1e-9, window=1,
                        config={"basic_arithmetic": {"operators": ["+"], "allow_parentheses": False}})  # fmt: skip
    pass_rate = []
    trainer = GRPOTrainer(
        make_cfg(tmp_path, "train.steps=2", "eval.enabled=false"), model=model, tokenizer=tok, train_rows=rows,
        reward_functions=[("reasoning_gym_score", reasoning_gym_score, 1.0), ("one", lambda prompts, completions, **k: [1.0] * len(completions), 0.0)],
        callbacks=[lambda step, m, t: pass_rate.append({k: v for k, v in m.items() if "/pass/" in k}), raised],
    )  # fmt: skip
    always = trainer.sampler.train_rows
    trainer.train()
    # the pass rates of the tasks each step's prompts drew
    assert all(
        set(p)
        <= {"reward/reasoning_gym_score/pass/basic_arithmetic", "reward/reasoning_gym_score/pass/chain_sum"}
        and p
        for p in pass_rate
    )
    # the tiny model scores 0: the pass rate 0 is below any positive bar, so nothing was raised...
    assert raised.levels == {"basic_arithmetic": 0} and raised.changes == []
    # ...and with the bar reached (the pass rate given as the metrics say it), the level goes up and only that
    # task's rows are redrawn, at the curriculum's next level (num_terms 2-3, num_digits 1-2)
    raised.raise_at = 0.5
    raised(2, {"reward/reasoning_gym_score/pass/basic_arithmetic": 1.0}, trainer)
    assert raised.levels == {"basic_arithmetic": 1} and raised.changes == [(2, "basic_arithmetic", 1)]
    assert trainer.sampler.train_rows is always and len(always) == 16
    new = [r for r in always if r["task"] == "basic_arithmetic"]
    assert len(new) == 16 - len(chain_before) and all(
        r["entry"]["metadata"]["difficulty"] == {"num_terms": [2, 3], "num_digits": [1, 2]} for r in new
    )
    assert [r for r in always if r["task"] == "chain_sum"] == chain_before
    assert [len(ids) for ids in trainer.sampler.encoded] == [len(tok(r["prompt"]).input_ids) for r in always]
