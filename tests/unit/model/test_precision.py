"""Precision modes (grpokit.model.precision): bf16 runs keep every small update, float16 trains with loss
scaling, and the modes are chosen and refused as documented.

The update tests train each mode on one fixed rollout batch (sampled once by the float32 model, with
fixed random advantages), so the only difference between runs is the precision, not the samples."""


import pytest
import torch
from tiny_model import make_tiny_model

from grpokit.config.schema import ConfigError, load_config
from grpokit.model.precision import PRECISIONS, master_weights, resolve_precision
from grpokit.trainers.grpo import GRPOTrainer

ROWS = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(6) for b in range(6)]
UPDATES = 5


def has_seven(prompts, completions, **kw):
    return [float("7" in c) for c in completions]


def make_trainer(tmp_path, precision, *extra, dtype=torch.float32, lr=1e-6):
    model, tok = make_tiny_model("qwen2", seed=0)
    model.to(dtype)
    cfg = load_config(
        None,
        [
            f"train.output_dir={tmp_path / precision}",
            "train.steps=5",
            "train.samples_every=0",
            "train.tensorboard=false",
            "rollout.group_size=4",
            "rollout.prompts_per_step=4",
            "rollout.max_new_tokens=8",
            f"optim.lr={lr}",
            f"optim.precision={precision}",
            "data.template=plain",
            "model.device=cpu",
            "eval.enabled=false",
            *extra,
        ],
    )
    return GRPOTrainer(
        cfg, model=model, tokenizer=tok, train_rows=ROWS, reward_functions=[("has_seven", has_seven, 1.0)]
    )


@pytest.fixture(scope="module")
def fixed_batch(tmp_path_factory):
    """One rollout batch from the float32 model and fixed random advantages (N,)."""
    trainer = make_trainer(tmp_path_factory.mktemp("batch"), "fp32")
    batch, _, _ = trainer.sampler.sample_batch(trainer.step)
    advantages = torch.randn(len(batch.texts), generator=torch.Generator().manual_seed(0))
    return batch, advantages


def master_update(trainer, batch, advantages, updates=UPDATES):
    """(flat change of the optimizer's master weights over ``updates`` updates, skipped updates)."""
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    before = [master_weights(p, trainer.learner.optimizer).clone() for p in params]
    skipped = 0
    for _ in range(updates):
        metrics, _ = trainer.updater.update(batch.rollout, advantages)
        skipped += int(metrics["skipped_updates"])
    after = [master_weights(p, trainer.learner.optimizer) for p in params]
    return torch.cat([(a - b).flatten() for a, b in zip(after, before)]), skipped


def relative_error(delta, reference):
    return float((delta - reference).norm() / reference.norm())


@pytest.fixture(scope="module")
def fp32_update(tmp_path_factory, fixed_batch):
    trainer = make_trainer(tmp_path_factory.mktemp("fp32"), "fp32")
    delta, skipped = master_update(trainer, *fixed_batch)
    assert skipped == 0
    assert float((delta != 0).float().mean()) > 0.9  # the reference run itself moves nearly every weight
    return delta


@pytest.mark.parametrize("precision", ["bf16_kahan", "bf16_mixed"])
def test_bf16_modes_keep_small_updates_and_track_float32(tmp_path, fixed_batch, fp32_update, precision):
    # lr 1e-6 moves a weight of size ~0.02 by far less than bf16's half-ulp (~4e-5): in place, it rounds away
    trainer = make_trainer(tmp_path, precision, dtype=torch.bfloat16)
    delta, skipped = master_update(trainer, *fixed_batch)
    assert skipped == 0
    assert float((delta != 0).float().mean()) >= 0.9
    # The gradients differ from float32's by bf16 compute only; measured 0.08-0.10 on this model
    # (AdamW's first steps amplify noise in tiny gradient entries); bf16_pure is at 0.99.
    assert relative_error(delta, fp32_update) < 0.15


def test_bf16_pure_loses_most_updates(tmp_path, fixed_batch, fp32_update):
    """The failure the default avoids: bf16 weights updated in place keep ~2% of the updates."""
    trainer = make_trainer(tmp_path, "bf16_pure", dtype=torch.bfloat16)
    delta, _ = master_update(trainer, *fixed_batch)
    assert float((delta != 0).float().mean()) < 0.1
    assert relative_error(delta, fp32_update) > 0.9


def test_bf16_model_defaults_to_kahan_with_bf16_optimizer_state(tmp_path):
    trainer = make_trainer(tmp_path, "auto", dtype=torch.bfloat16)
    assert trainer.learner.precision.name == "bf16_kahan"
    assert all(p.dtype == torch.bfloat16 for p in trainer.model.parameters())
    trainer.train_step()
    state = trainer.learner.optimizer.state[next(trainer.model.parameters())]
    assert {k: v.dtype for k, v in state.items() if torch.is_tensor(v) and v.dim()} == {
        "exp_avg": torch.bfloat16,
        "exp_avg_sq": torch.bfloat16,
        "kahan_comp": torch.bfloat16,
    }


@pytest.mark.slow
def test_fp16_trains_with_loss_scaling(tmp_path, fixed_batch, tmp_path_factory):
    """float16 compute over float32 master weights: overflowing updates are skipped and counted (the
    scale halves), the others equal a float32 run of as many updates; weights never go NaN; saving works."""
    trainer = make_trainer(tmp_path, "fp16_mixed")
    assert trainer.learner.precision.loss_scaling and trainer.learner.scaler is not None
    scale_before = trainer.learner.scaler.get_scale()
    delta, skipped = master_update(trainer, *fixed_batch)
    assert skipped < UPDATES
    assert trainer.learner.scaler.get_scale() == scale_before / 2**skipped  # halved once per overflow, no growth yet
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    reference = make_trainer(tmp_path_factory.mktemp("fp32_short"), "fp32")
    ref_delta, _ = master_update(reference, *fixed_batch, updates=UPDATES - skipped)
    assert relative_error(delta, ref_delta) < 0.15
    metrics = trainer.train_step()
    assert metrics["loss_scale"] == trainer.learner.scaler.get_scale()
    path = trainer.save()
    from safetensors.torch import load_file

    weights = load_file(str(path / "model.safetensors"))
    assert weights and all(torch.isfinite(w).all() for w in weights.values())


def test_resolve_precision_auto_and_conflicts():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolve_precision("auto", "auto", cpu).name == "fp32"
    assert resolve_precision("auto", "auto", cuda).name == "bf16_kahan"
    assert resolve_precision("auto", "bfloat16", cpu).name == "bf16_kahan"
    assert resolve_precision("auto", "float16", cpu).name == "fp16_mixed"
    assert resolve_precision("bf16_mixed", "auto", cpu).weight_dtype == torch.float32
    assert resolve_precision("bf16_mixed", "bfloat16", cpu).compute_dtype == torch.bfloat16
    with pytest.raises(ConfigError, match=r"optim.precision=bf16_kahan .* model.dtype=float32"):
        resolve_precision("bf16_kahan", "float32", cpu)
    with pytest.raises(ConfigError, match="optim.precision"):
        load_config(None, ["optim.precision=bf16"])


def test_bytes_per_param_match_the_optimizer_state(tmp_path):
    """The documented bytes/param (weights + gradients + optimizer state) are what a step allocates."""
    for name in ["fp32", "bf16_mixed", "bf16_kahan", "bf16_pure"]:
        trainer = make_trainer(tmp_path, name, dtype=PRECISIONS[name].weight_dtype)
        params = [p for p in trainer.model.parameters() if p.requires_grad]
        for p in params:
            p.grad = torch.zeros_like(p)
        trainer.learner.optimizer.step()
        n = sum(p.numel() for p in params)
        state_bytes = sum(
            t.numel() * t.element_size()
            for p in params
            for t in trainer.learner.optimizer.state[p].values()
            if torch.is_tensor(t) and t.dim()  # skip the scalar step counters
        )
        weight_grad = sum(2 * p.numel() * p.element_size() for p in params)
        assert (weight_grad + state_bytes) / n == PRECISIONS[name].bytes_per_param, name
