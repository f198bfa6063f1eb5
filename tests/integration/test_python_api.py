"""The Python API: `from grpokit import ...`, a cheap `import grpokit`, and step callbacks."""

import json
import subprocess
import sys

import pytest
from tiny_model import make_tiny_model

import grpokit
from grpokit import Config, GRPOTrainer, TrainingError, load_config

ROWS = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(4) for b in range(4)]


def has_seven(prompts, completions, **kw):
    return [float("7" in c) for c in completions]


def make_trainer(tmp_path, callbacks):
    model, tok = make_tiny_model("qwen2", seed=0)
    cfg = load_config(
        None,
        [
            f"train.output_dir={tmp_path / 'run'}",
            "train.steps=2",
            "train.report_to=none",
            "rollout.group_size=2",
            "rollout.prompts_per_step=2",
            "rollout.max_new_tokens=4",
            "data.template=plain",
            "model.device=cpu",
            "eval.enabled=false",
            "train.stop_after_flat_steps=0",
        ],
    )
    return GRPOTrainer(
        cfg,
        model=model,
        tokenizer=tok,
        train_rows=ROWS,
        reward_functions=[("has_seven", has_seven, 1.0)],
        callbacks=callbacks,
    )


def test_import_grpokit_is_cheap_and_exports_the_api():
    code = (
        "import sys, grpokit; print(sorted(m for m in ('torch', 'transformers', 'yaml') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    for name in grpokit.__all__:
        assert getattr(grpokit, name) is not None
    assert isinstance(Config(), Config)
    with pytest.raises(AttributeError, match="no attribute 'Trainer'"):
        grpokit.Trainer  # noqa: B018


def test_callbacks_see_every_logged_step(tmp_path):
    seen = []

    def record(step, metrics, trainer):
        seen.append((step, metrics["reward/total/mean"], trainer.step))

    trainer = make_trainer(tmp_path, callbacks=[record])
    trainer.train()
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert seen == [(r["step"], r["reward/total/mean"], r["step"]) for r in logged]
    assert [s for s, _, _ in seen] == [1, 2]


def test_a_callback_that_raises_stops_the_run_with_its_message(tmp_path):
    def stop_at_first_step(step, metrics, trainer):
        raise ValueError(f"enough at step {step}")

    after = []
    trainer = make_trainer(tmp_path, callbacks=[stop_at_first_step, lambda *a: after.append(a)])
    with pytest.raises(TrainingError) as e:
        trainer.train()
    assert str(e.value).startswith(
        "callback test_a_callback_that_raises_stops_the_run_with_its_message.<locals>.stop_at_first_step "
        "stopped the run at step 1: ValueError: enough at step 1 (checkpoint of step 1: "
    )
    assert (tmp_path / "run" / "checkpoints" / "step_000001").is_dir()
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 1
    assert after == []  # later callbacks do not run once one has stopped the run
