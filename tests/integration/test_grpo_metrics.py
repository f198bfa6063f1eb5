"""Step metrics that describe what is trained on: under DAPO's dynamic sampling the reward metrics come
from the kept groups (not the last sampling round), the discarded groups are reported on their own,
and reward/total/std is one population std (ddof 0)."""

import pytest
import torch
from tiny_model import make_tiny_model

from grpokit.config.schema import load_config
from grpokit.rollout.batch import step_metrics
from grpokit.trainers.grpo import GRPOTrainer

ROWS = [{"prompt": f"{a}+{b}=", "a": a} for a in range(6) for b in range(6)]
G = 4


def half_flat(prompts, completions, a, **kw):
    """Prompts with a < 3 score 0 on every completion (a flat group); the others alternate 1, 0, 1, 0
    within their group (rows are group-major), so their groups always have a spread."""
    return [0.0 if a_i < 3 else float(i % 2 == 0) for i, a_i in enumerate(a)]


def test_dynamic_sampling_metrics_come_from_the_kept_groups(tmp_path):
    model, tok = make_tiny_model("qwen2", seed=0)
    cfg = load_config(
        None,
        [
            f"train.output_dir={tmp_path / 'run'}",
            "algo.preset=dapo",
            "algo.overlong_shaping=false",  # total = half_flat alone
            f"rollout.group_size={G}",
            "rollout.prompts_per_step=4",
            "rollout.max_new_tokens=4",
            "data.template=plain",
            "model.device=cpu",
            "eval.enabled=false",
            "train.tensorboard=false",
        ],
    )
    trainer = GRPOTrainer(
        cfg, model=model, tokenizer=tok, train_rows=ROWS, reward_functions=[("half_flat", half_flat, 1.0)]
    )
    batch, _, sampling = trainer.sampler.sample_batch(trainer.step)
    assert sampling["sampling_rounds"] >= 2  # seed 0 draws flat groups in the first round
    kept = batch.rewards.view(-1, G)
    assert bool(((kept.max(1).values - kept.min(1).values) > 0).all())  # only groups with a spread kept
    # every kept group is 1, 0, 1, 0: mean 0.5, population std 0.5 (ddof 1 would give 0.516 for 16 rows)
    m = batch.reward_metrics
    assert m["reward/total/mean"] == 0.5
    assert m["reward/total/std"] == 0.5
    assert m["reward/half_flat/mean"] == 0.5
    assert m["reward/half_flat/applicable"] == 1.0
    # every discarded group was flat at 0 (or a surplus group with a spread beyond the P needed)
    n_rounds, P = int(sampling["sampling_rounds"]), 4
    assert sampling["dynamic_sampling/discarded_groups"] == n_rounds * P - P
    assert 0.0 <= sampling["dynamic_sampling/discarded_reward_mean"] < 0.5
    # the cost counters add up over every round (each round scored P * G completions)
    assert m["reward/half_flat/seconds"] > 0
    metrics = step_metrics(batch, 0.0, {}, sampling, trainer.accuracy_name)
    assert metrics["reward/total/std"] == 0.5  # not recomputed with another ddof


def test_round_metrics_counters_add_up_and_logged_values_average():
    from types import SimpleNamespace

    from grpokit.rollout.batch import batch_reward_metrics

    kept = SimpleNamespace(per_function={"f": [1.0, None, 0.0, 1.0]}, rewards=torch.tensor([1.0, 0.0, 0.0, 1.0]))
    rounds = [
        {"reward/f/mean": 0.0, "reward/f/seconds": 0.5, "reward/f/failed_rows": 1.0, "reward/f/my_metric": 2.0},
        {"reward/f/mean": 0.9, "reward/f/seconds": 0.25, "reward/f/failed_rows": 0.0, "reward/f/my_metric": 4.0},
    ]
    m = batch_reward_metrics(kept, rounds)
    assert m["reward/f/seconds"] == 0.75 and m["reward/f/failed_rows"] == 1.0  # summed over rounds
    assert m["reward/f/my_metric"] == 3.0  # a log_metric value: the mean over rounds
    assert m["reward/f/mean"] == 2 / 3 and m["reward/f/applicable"] == 0.75  # from the kept rows only
    # the row no function scored (None) is left out of the total, as TRL's logged reward: [1, 0, 1]
    assert m["reward/total/mean"] == pytest.approx(2 / 3) and m["reward/total/std"] == pytest.approx(2**0.5 / 3)


def test_log_extra_columns_reach_the_saved_samples(tmp_path):
    def noted(prompts, completions, log_extra=None, **kw):
        log_extra("length_note", [f"len={len(c)}" for c in completions])
        return [float(i % 2) for i in range(len(completions))]

    model, tok = make_tiny_model("qwen2", seed=0)
    cfg = load_config(
        None,
        [
            f"train.output_dir={tmp_path / 'run'}",
            "train.steps=1",
            "train.samples_every=1",
            "train.tensorboard=false",
            f"rollout.group_size={G}",
            "rollout.prompts_per_step=2",
            "rollout.max_new_tokens=3",
            "data.template=plain",
            "model.device=cpu",
            "eval.enabled=false",
        ],
    )
    trainer = GRPOTrainer(cfg, model=model, tokenizer=tok, train_rows=ROWS, reward_functions=[("noted", noted, 1.0)])
    trainer.train()
    import json

    rows = [json.loads(line) for line in (tmp_path / "run" / "samples" / "step_000001.jsonl").open()]
    assert rows and all(r["length_note"] == f"len={len(r['completion'])}" for r in rows)
