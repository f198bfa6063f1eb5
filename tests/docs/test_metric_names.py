"""The metric registry (grpokit.run.metrics) against real runs, both ways, so the metrics reference cannot drift:
every key a tiny run writes to metrics.jsonl / eval.jsonl is in the registry, and every registry entry is
written by one of these runs (GRPO with every optional metric switched on, PPO with its critic, a multi-turn
run with a tool, SFT with a reward). About 15 s on a 2-core CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny_model import (
    ADDITION_ROWS,
    SMALL_RUN,
    has_seven,
    make_tiny_model,
    save_tiny_model,
    small_trainer,
    write_sft_run,
)
from tool_model import tool_model

from grpokit.config.schema import load_config
from grpokit.config.sft import load_sft_config
from grpokit.run.metrics import SFT, SFT_EVAL, TRAIN, TRAIN_EVAL, entry_for
from grpokit.trainers.grpo import GRPOTrainer
from grpokit.trainers.sft import SFTTrainer


def sevens_logged(prompts, completions, log_metric, **kw):
    """A second reward that logs a metric of its own (reward/sevens_logged/sevens) and scores parity."""
    log_metric("sevens", float(sum("7" in c for c in completions)))
    return [float(len(c) % 2) for c in completions]


def keys(path: Path) -> set[str]:
    return {key for line in path.read_text().splitlines() for key in json.loads(line)}


def grpo_run(out: Path) -> Path:
    """GRPO (beta 0.04: kl) with eval, float16 loss scaling, the dual clip, dynamic sampling, the sampler
    mismatch correction and a reward that logs a metric of its own: every optional metric of a single-turn run."""
    model, tok = make_tiny_model("qwen2", seed=0)
    cfg = load_config(
        None,
        [
            f"train.output_dir={out}",
            "train.steps=2",
            *SMALL_RUN,
            "eval.enabled=true",
            "eval.num_samples=2",
            # two rewards, neither named as the verifier: named here, or no accuracy (and no eval metric) is read
            "train.accuracy_reward=has_seven",
            "optim.precision=fp16_mixed",
            "algo.dual_clip=3",
            "algo.off_policy_mask=0.0",  # masked_frac/off_policy (issue 35)
            "algo.top_entropy_quantile=0.5",  # masked_frac/entropy
            "algo.cov_penalty=kl_cov",  # cov_penalised_frac
            "algo.entropy_coef=0.001",  # entropy_coef, entropy/bonus
            "algo.dynamic_sampling=true",
            "algo.max_sampling_rounds=20",
            "rollout.mismatch_correction=token_truncate",  # mismatch/* (any engine; vllm's default)
            "train.ema_decay=0.5",  # ema/* in eval.jsonl
            "train.adopt_average=true",  # average/*: the policy compares itself with its average after every step
            "train.adopt_every=1",
        ],
    )
    rewards = [("has_seven", has_seven, 1.0), ("sevens_logged", sevens_logged, 0.5)]
    trainer = GRPOTrainer(
        cfg,
        model=model,
        tokenizer=tok,
        train_rows=ADDITION_ROWS,
        eval_rows=ADDITION_ROWS[:4],
        reward_functions=rewards,
    )
    trainer.train()
    return out


def multiturn_run(out: Path) -> Path:
    """One step of episodes with a tool, evaluated greedily as episodes too."""
    model, tok = tool_model()  # turns end after a few tokens; the template renders the tool
    cfg = load_config(
        None,
        [
            f"train.output_dir={out}",
            "train.steps=1",
            *SMALL_RUN,
            "data.template=chat",
            "rollout.max_new_tokens=8",
            "rollout.max_turns=2",
            "rollout.tools=[episode_parts:count_digits]",
            "rollout.tool_parser=episode_parts:digit_parser",
            "eval.enabled=true",
            "algo.beta=0",  # no KL term: the update leaves the flat groups out (update/skipped_rows)
        ],
    )
    GRPOTrainer(
        cfg,
        model=model,
        tokenizer=tok,
        train_rows=ADDITION_ROWS,
        eval_rows=ADDITION_ROWS[:2],
        reward_functions=[("has_seven", has_seven, 1.0)],
    ).train()
    return out


def sft_run(folder: Path) -> Path:
    """SFT with float16 loss scaling, held-out loss and, through a reward, held-out accuracy."""
    rows = [{"prompt": r["prompt"], "completion": r["answer"], "answer": r["answer"]} for r in ADDITION_ROWS]
    cfg = write_sft_run(folder / "config", rows, batch_size=4, lr=1e-3, steps=2)
    overrides = [
        f"train.output_dir={folder / 'run'}",
        "optim.precision=fp16_mixed",
        "rewards=[{name: math_accuracy}]",
        "eval.num_samples=2",
        "eval.max_new_tokens=4",
    ]
    SFTTrainer(load_sft_config(cfg, overrides), eval_rows=rows[:4]).train()
    return folder / "run"


def check(registry: dict, runs: list[set[str]], what: str) -> None:
    unknown = sorted({key for run in runs for key in run if entry_for(key, registry) is None})
    assert not unknown, f"{what}: written but not in grpokit/run/metrics.py: {unknown}"
    seen = {entry_for(key, registry) for run in runs for key in run}
    never = [name for name in registry if name not in seen]
    assert not never, f"{what}: in grpokit/run/metrics.py but written by none of the runs: {never}"


@pytest.mark.slow
def test_every_metric_written_is_registered_and_every_registered_metric_is_written(tmp_path):
    grpo = grpo_run(tmp_path / "grpo")
    ppo = tmp_path / "ppo"
    small_trainer(ppo, 1, "algo.preset=ppo").train()
    overlapped = tmp_path / "async"  # async/*: a sampler process beside the trainer (rollout.max_staleness)
    # selection/*, history/*: prompt selection in the sampler process (data.selection, grpokit.rollout.selection)
    # teacher/kl: on-policy distillation's teacher beside the rewards (algo.teacher_kl_coef, grpokit.train.teacher)
    teacher = f"teacher.name_or_path={save_tiny_model(tmp_path / 'teacher', seed=1)}"
    small_trainer(
        overlapped,
        2,
        "rollout.max_staleness=1",
        "data.selection.mode=greso",
        "algo.teacher_kl_coef=0.5",
        teacher,
    ).train()
    multiturn = multiturn_run(tmp_path / "multiturn")
    sft = sft_run(tmp_path / "sft")

    check(
        TRAIN,
        [keys(run / "metrics.jsonl") for run in (grpo, ppo, multiturn, overlapped)],
        "grpokit train metrics.jsonl",
    )
    check(TRAIN_EVAL, [keys(run / "eval.jsonl") for run in (grpo, multiturn)], "grpokit train eval.jsonl")
    check(SFT, [keys(sft / "metrics.jsonl")], "grpokit sft metrics.jsonl")
    check(SFT_EVAL, [keys(sft / "eval.jsonl")], "grpokit sft eval.jsonl")


def test_placeholders_match_one_part_and_prefer_the_specific_entry():
    assert entry_for("reward/math_accuracy/mean", TRAIN) == "reward/{reward}/mean"
    assert entry_for("reward/math_accuracy/sevens", TRAIN) == "reward/{reward}/{metric}"
    assert entry_for("reward/total/mean", TRAIN) == "reward/total/mean"
    assert entry_for("maj_at_16/no_answer", TRAIN_EVAL) == "maj_at_{k}/no_answer"
    assert entry_for("reward/a/b/mean", TRAIN) is None  # a placeholder is one path part
    assert entry_for("no_such_metric", TRAIN) is None
