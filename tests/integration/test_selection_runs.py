"""Prompt selection (data.selection, grpokit.rollout.selection) in tiny GRPO runs: the per-prompt history
survives a checkpoint and a resume bit for bit, a run whose prompts are all solved stops with a named message,
the asynchronous sampler selects with the history of the batches it made, and the selection off leaves a run
as it was."""

import json

import grpo_runs
import pytest
import torch
from tiny_model import make_tiny_model

from grpokit.config.schema import load_config
from grpokit.core.errors import FlatRewardsError
from grpokit.model.checkpoint import load_trainer_state
from grpokit.run.log import read_metrics
from grpokit.trainers.grpo import GRPOTrainer
from grpokit.view.data import read_run
from grpokit.view.page import clean, render_page


def same(a: dict, b: dict) -> bool:
    """Equal to the last bit, NaN (a prompt never visited) equal to NaN: floats as their exact repr."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


SELECTION = [
    "data.selection.mode=greso",
    "data.selection.refill=true",  # refills visit more prompts in a few steps: more history to carry
    "train.samples_every=0",
    "eval.enabled=false",
    "train.tensorboard=false",
]


def test_the_history_survives_a_checkpoint_and_a_resume_bit_for_bit(tmp_path):
    """4 steps straight against 2 steps, a new trainer resumed from the checkpoint, 2 more: the same history
    (every row's visits, flat runs, spreads, pass rates, skips), exploration probabilities, stream position,
    metrics and weights. Prompts are skipped after the resume, so the resumed history decides something."""
    straight = grpo_runs.make_trainer(tmp_path / "a", "train.steps=4", *SELECTION)
    straight.train()
    first = grpo_runs.make_trainer(tmp_path / "b", "train.steps=2", "train.save_every=2", *SELECTION)
    first.train()
    saved = load_trainer_state(tmp_path / "b" / "run" / "checkpoints" / "step_000002")["stream"]
    assert sum(saved["selection"]["history"]["visits"]) > 0
    del first  # nothing of the first leg but its checkpoint reaches the second
    second = grpo_runs.make_trainer(tmp_path / "b", "train.steps=4", *SELECTION, resume=True)
    assert same(second.sampler.stream.state(), saved)
    second.train()
    assert same(second.sampler.stream.state(), straight.sampler.stream.state())
    a, b = (
        read_metrics(tmp_path / "a" / "run" / "metrics.jsonl"),
        read_metrics(tmp_path / "b" / "run" / "metrics.jsonl"),
    )
    keys = [k for k in a[-1] if k.startswith(("selection/", "history/", "reward/total", "loss"))]
    assert [[m[k] for k in keys] for m in a[2:]] == [[m[k] for k in keys] for m in b[2:]]
    assert max(m["selection/skipped_frac"] for m in b[2:]) > 0  # the resumed history skipped prompts
    for (name, p), q in zip(straight.model.named_parameters(), second.model.parameters()):
        assert torch.equal(p, q), name


def solved(prompts, completions, **kw):
    """Every completion earns 1: every prompt is solved from the start."""
    return [1.0] * len(completions)


def test_a_run_whose_prompts_are_all_solved_stops_with_a_named_message(tmp_path, capsys):
    """8 prompts that every completion solves: step 1 visits them all (refills find no spread), step 2 finds
    the pool dry, says so and trains on what comes; train.stop_after_flat_steps=2 stops the run there with its
    named message, instead of refilling for ever."""
    model, tok = make_tiny_model("qwen2", seed=0)
    cfg = grpo_runs.make_cfg(tmp_path, "train.steps=40", "train.stop_after_flat_steps=2", *SELECTION)
    trainer = GRPOTrainer(
        cfg,
        model=model,
        tokenizer=tok,
        train_rows=grpo_runs.ROWS[:8],
        reward_functions=[("solved", solved, 1.0)],
    )
    with pytest.raises(FlatRewardsError, match="no group had any reward spread for 2 steps"):
        trainer.train()
    said = capsys.readouterr()
    assert "prompt selection: the informative pool ran dry" in said.out + said.err
    assert "8 all solved" in said.out + said.err
    steps = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert len(steps) == 1  # step 2 raised before it was logged
    assert steps[0]["sampling_rounds"] <= 1 + cfg.data.selection.max_rounds
    assert steps[0]["selection/flat_trained"] == 4.0  # no informative group: the step said so


@pytest.mark.slow
def test_the_asynchronous_sampler_keeps_the_history_of_the_batches_it_made(tmp_path):
    """rollout.max_staleness=1: the sampler process selects and records; each batch carries its stream state, so
    the checkpoint's history counts every group its process generated for the batches taken (refills too)."""
    trainer = grpo_runs.make_trainer(tmp_path, "train.steps=3", "rollout.max_staleness=1", *SELECTION)
    trainer.train()
    metrics = read_metrics(tmp_path / "run" / "metrics.jsonl")
    history = load_trainer_state(tmp_path / "run" / "checkpoints" / "step_000003")["stream"]["selection"][
        "history"
    ]
    assert sum(history["visits"]) == sum(m["selection/generated_groups"] for m in metrics) >= 3 * 4
    assert all("selection/skipped_frac" in m and "history/seen_frac" in m for m in metrics)
    shown = read_run(tmp_path / "run")["history"]  # the explorer's Prompt history tab
    assert shown["step"] == 3 and shown["n"] == len(grpo_runs.ROWS)
    assert sum(r["visits"] for r in shown["rows"]) == sum(history["visits"])
    assert shown["counts"]["seen"] == sum(1 for v in history["visits"] if v)
    assert 'id="history-table"' in render_page([clean(read_run(tmp_path / "run"))])


def test_the_selection_off_adds_nothing_to_a_run(tmp_path):
    """data.selection.mode=off (the default): no selection/history metric and the checkpoint's stream the two keys
    it always had. (That such a run is the run before the selection existed, weights and metrics bit for bit, was
    checked against the commit before it: see the commit message.)"""
    assert load_config(None, []).data.selection.mode == "off"
    off = grpo_runs.make_trainer(tmp_path, "train.steps=2", "train.samples_every=0", "eval.enabled=false")
    off.train()
    metrics = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert not [k for m in metrics for k in m if k.startswith(("selection/", "history/"))]
    assert metrics[0]["sampling_rounds"] == 1.0
    stream = load_trainer_state(tmp_path / "run" / "checkpoints" / "step_000002")["stream"]
    assert set(stream) == {"epoch", "index"}
