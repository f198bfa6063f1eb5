"""A resumed run is the uninterrupted run bit for bit, whatever keeps state of its own: the memory settings
(optimizer states and weight copies on the CPU, the reference on the CPU, activations on the CPU, gradient
checkpointing), the precision that keeps state of its own (bfloat16 with Kahan-compensated AdamW), LoRA, a
reference that moves toward the policy (algo.ref_sync_every; its checkpoint folder reference/), asynchronous rollouts with K = 1 and K = 2 (the batches in flight and the sampler's last push are in the
checkpoint), and SFT. Each case trains 3 steps with a checkpoint after every one, once (module-scoped); a copy
of its folder resumes from step 2's checkpoint, as a run killed after step 2 would (the later checkpoint and log
lines are its own, past the kill), and its weights are compared with torch.equal.

On 37165e5 the offload cases lost every update before the checkpoint and the asynchronous ones never matched
(the resumed sampler made the first batch from the restored step's weights instead of the older ones the
uninterrupted run's had, and restarted the versions there); the spread check's memory, the mismatch watch and
the log_history reward functions read were dropped. Tiny real models, fork-started sampler processes."""

from __future__ import annotations

import shutil

import pytest
import torch
from grpo_runs import ROWS, has_seven
from tiny_model import make_tiny_model

from grpokit.config.schema import load_config
from grpokit.config.sft import load_sft_config
from grpokit.model.checkpoint import load_trainer_state
from grpokit.run.log import read_metrics
from grpokit.train import weight_average
from grpokit.trainers.grpo import GRPOTrainer
from grpokit.trainers.sft import SFTTrainer

GRPO = [
    "train.steps=3", "train.save_every=1", "train.keep_checkpoints=3", "train.samples_every=0",
    "train.tensorboard=false", "rollout.group_size=4", "rollout.prompts_per_step=2", "rollout.max_new_tokens=5",
    "optim.lr=3e-2", "data.template=plain", "model.device=cpu", "eval.enabled=false",
]  # fmt: skip
CASES = {
    "memory": [
        "optim.offload_optimizer=true", "optim.offload_reference=true", "optim.offload_activations=true",
        "model.gradient_checkpointing=true",
    ],
    "bf16_kahan": ["optim.precision=bf16_kahan"],  # its optimizer's Kahan buffers (bf16_mixed keeps no more state)
    "lora": ["lora.enabled=true", "lora.r=4", "optim.offload_optimizer=true"],
    "async_k1": ["rollout.max_staleness=1"],
    # a push every 3 steps: step 2's checkpoint keeps the weights of the last push (version 0), older than its own
    "async_k2_sync3": ["rollout.max_staleness=2", "rollout.sync_every=3"],
    # the reference moved after every step (algo.ref_sync_every): step 3's KL is to step 2's mix, kept in reference/
    "ref_sync": ["algo.ref_sync_every=1", "algo.ref_sync_alpha=0.5", "optim.offload_reference=true"],
    "ref_sync_async": ["algo.ref_sync_every=1", "rollout.max_staleness=1"],
    # the average of the weights (train.ema_decay): its ema/ folder, compared below (it changes no update)
    "ema": ["train.ema_decay=0.5"],
    # the policy taking its average after every step (train.adopt_average): the average and the comparison's rows
    "adopt": ["train.adopt_average=true", "train.adopt_every=1", "train.adopt_prompts=12", "train.ema_decay=0.5"],
}  # fmt: skip
SFT = [
    "train.steps=3", "train.save_every=1", "train.keep_checkpoints=3", "train.tensorboard=false",
    "sft.batch_size=3", "optim.lr=1e-2", "data.template=plain", "optim.offload_optimizer=true",
    "optim.offload_activations=true", "model.gradient_checkpointing=true",
]  # fmt: skip
SFT_ROWS = [{"prompt": f"{a}+{b}=", "completion": str(a + b)} for a in range(3) for b in range(3)]


@pytest.fixture(scope="module", autouse=True)
def any_gain_adopts():
    """Case adopt: any gain of the average takes it (train.adopt_average's test of the gain would rarely pass on 12
    prompts in 3 steps, and the case must move the policy to test the resume; the test itself is tested by hand in
    tests/integration/test_weight_average.py)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(weight_average, "significant", lambda gains: sum(gains) > 0)
        yield


def grpo_trainer(out, *extra, resume=False):
    model, tok = make_tiny_model("qwen2", seed=0)
    cfg = load_config(None, [*GRPO, f"train.output_dir={out}", *extra])
    return GRPOTrainer(
        cfg, model=model, tokenizer=tok, train_rows=ROWS, reward_functions=[("has_seven", has_seven, 1.0)],
        resume=resume,
    )  # fmt: skip


def sft_trainer(out, resume=False):
    model, tok = make_tiny_model("qwen2", seed=0)
    cfg = load_sft_config(None, [*SFT, f"train.output_dir={out}"])
    return SFTTrainer(cfg, model=model, tokenizer=tok, train_rows=SFT_ROWS, resume=resume)


@pytest.fixture(scope="module", autouse=True)
def forked_sampler():
    """The asynchronous cases' sampler process forked (a CPU run's default; the suite's spawn costs seconds a start)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GRPOKIT_SAMPLER_START", "fork")
        yield


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """Each case's uninterrupted 3-step run, trained once: (its folder, its final weights)."""
    done = {}

    def run(case):
        if case not in done:
            out = tmp_path_factory.mktemp(case) / "run"
            trainer = sft_trainer(out) if case == "sft" else grpo_trainer(out, *CASES[case])
            trainer.train()
            done[case] = out, {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
            average = getattr(trainer, "parts", None) and trainer.parts.policy.average
            if average:  # train.ema_decay: the straight run's average, by case
                run.averages[case] = {n: p.detach().clone() for n, p in average.model.named_parameters()}
        return done[case]

    run.averages = {}

    return run


def resumed_after_step_2(straight, case, tmp_path):
    """A copy of the case's run resumed from its step 2 checkpoint to step 3, as a run killed after step 2."""
    out, weights = straight(case)
    copy = shutil.copytree(out, tmp_path / "run")
    if case == "sft":
        trainer = sft_trainer(copy, resume="step_000002")
    else:
        trainer = grpo_trainer(copy, *CASES[case], resume="step_000002")
    assert trainer.step == 2
    trainer.train()
    return trainer, weights


@pytest.mark.parametrize("case", [*CASES, "sft"])
def test_a_run_resumed_after_step_2_has_the_uninterrupted_runs_weights(straight, case, tmp_path):
    trainer, weights = resumed_after_step_2(straight, case, tmp_path)
    got = dict(trainer.model.named_parameters())
    assert got.keys() == weights.keys()
    for name, p in got.items():
        assert torch.equal(p, weights[name]), (case, name)
    if case in ("ema", "adopt"):  # the average is taken back from step 2's ema/ and takes step 3 as the straight run's
        for name, p in trainer.parts.policy.average.model.named_parameters():
            assert torch.equal(p, straight.averages[case][name]), name
    if case == "adopt":  # step 3's comparison as the straight run's; a comparison moved the policy (so the case tests it)
        line = {m["step"]: m for m in read_metrics(tmp_path / "run" / "metrics.jsonl")}[3]
        straight_lines = {m["step"]: m for m in read_metrics(straight(case)[0] / "metrics.jsonl")}
        keys = ("average/adopted", "average/score", "average/policy_score")
        assert [line[k] for k in keys] == [straight_lines[3][k] for k in keys]
        assert any(straight_lines[s]["average/adopted"] == 1.0 for s in (1, 2, 3))
    if case.startswith("async"):  # the same batches from the same weights: the straight run's versions
        lines = {m["step"]: m for m in read_metrics(tmp_path / "run" / "metrics.jsonl")}
        straight_lines = {m["step"]: m for m in read_metrics(straight(case)[0] / "metrics.jsonl")}
        assert lines[3]["async/version"] == straight_lines[3]["async/version"]
        assert lines[3]["loss"] == straight_lines[3]["loss"]


def test_every_part_takes_back_what_it_saved_and_reward_functions_see_every_leg(tmp_path):
    """The state of every part goes through one path (GRPOTrainer.checkpoint_state, restore): what a resumed
    trainer would save again is what the checkpoint held; the spread check's memory and the mismatch watch
    are among it, and log_history (what reward functions read in trainer_state) holds the steps before the
    resume."""
    first = grpo_trainer(tmp_path / "run", "train.steps=2")
    first.train()
    first.sampler.flat_steps, first.sampler.best_reward = 2, 0.75  # as after two flat steps
    first.mismatch.above, first.mismatch.warned = [0.02, 0.03], True  # as after two steps above its limit
    saved_state = first.checkpoint_state()
    shutil.rmtree(tmp_path / "run" / "checkpoints" / "step_000002")
    first.run.saved = None
    first.save()
    second = grpo_trainer(tmp_path / "run", "train.steps=3", resume=True)
    assert second.checkpoint_state() == saved_state
    assert [m["step"] for m in second.log_history] == [1, 2]
    assert second.log_history[1]["loss"] == first.log_history[1]["loss"]


def test_an_asynchronous_checkpoint_keeps_its_batches_in_flight_and_the_last_push(straight):
    """K = 2 with a push every 3 steps: step 2's checkpoint holds batches 2 and 3 (both credited before any push:
    made from the first weights) and the pushed weights, version 0, older than the trainer's; step 3's, after
    the push of step 3, holds batches 3 and 4 and no weights (the last push is its own)."""
    out, _ = straight("async_k2_sync3")
    two = load_trainer_state(out / "checkpoints" / "step_000002")["async"]
    assert two["next_batch"] == 2 and two["in_flight"] == 0 and two["version"] == 0
    assert [(b["index"], b["version"]) for b in two["batches"]] == [(2, 0), (3, 0)]
    model, _ = make_tiny_model("qwen2", seed=0)
    assert set(two["weights"]) == {name for name, _ in model.named_parameters()}
    three = load_trainer_state(out / "checkpoints" / "step_000003")["async"]
    assert three["version"] == 3 and [b["index"] for b in three["batches"]] == [3, 4]
    assert "weights" not in three
