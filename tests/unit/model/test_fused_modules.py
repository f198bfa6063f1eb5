"""model.compile: grpokit.model.fused_layers.fuse_modules, every forward's RMSNorms and SwiGLU MLPs fused, against the
modules as transformers runs them: forward and gradients, eager (bit for bit) and compiled (to rounding)."""

import copy

import pytest
import torch
from tiny_model import make_tiny_model

from grpokit.model.fused_layers import fuse_modules
from grpokit.model.loading import frozen_reference


def _loss_and_grads(model, ids, checkpointing=False):
    model.zero_grad(set_to_none=True)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    logits = model(input_ids=ids).logits  # (B, T, V)
    loss = torch.log_softmax(logits.float(), -1)[..., 5].mean()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3"])
def test_eager_fused_modules_equal_transformers_bit_for_bit(arch):
    plain, _ = make_tiny_model(arch, seed=4)
    fused = copy.deepcopy(plain)
    n = fuse_modules(fused, compiled=False)
    assert n == 2 * 2 + 1 + 2 + (4 if arch == "qwen3" else 0)  # 2 layers x 2 norms, final norm, 2 MLPs, q/k norms
    ids = torch.randint(3, 64, (3, 9), generator=torch.Generator().manual_seed(0))
    want_loss, want = _loss_and_grads(plain, ids)
    got_loss, got = _loss_and_grads(fused, ids, checkpointing=False)
    assert torch.equal(got_loss, want_loss)
    assert want.keys() == got.keys() and all(torch.equal(got[k], want[k]) for k in want)


def test_a_copy_keeps_the_fused_forward_bound_to_itself():
    """The frozen reference is a deep copy of the fused policy: its norms read its own weights, not the policy's."""
    model, _ = make_tiny_model("qwen2", seed=5)
    fuse_modules(model, compiled=False)
    ref = frozen_reference(model, lora_enabled=False)
    ids = torch.randint(3, 64, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        before = ref(input_ids=ids).logits
        for name, p in model.named_parameters():
            if "norm" in name:
                p.mul_(3.0)  # the policy's norms move; the reference's must not
        assert torch.equal(ref(input_ids=ids).logits, before)
        assert not torch.equal(model(input_ids=ids).logits, before)
    norm = ref.model.layers[0].input_layernorm
    assert norm.forward.module is norm


def test_a_pickled_fused_model_loads_and_computes_as_before():
    """The asynchronous sampler receives the policy pickled (grpokit.collect.transport): a fused model loads whole,
    its modules' forwards bound to the loaded modules."""
    import pickle

    model, _ = make_tiny_model("qwen2", seed=7)
    fuse_modules(model, compiled=False)
    loaded = pickle.loads(pickle.dumps(model))
    norm = loaded.model.layers[0].input_layernorm
    assert norm.forward.module is norm and loaded.model.layers[0].mlp.forward.module is loaded.model.layers[0].mlp
    ids = torch.randint(3, 64, (2, 7), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids).logits, model(input_ids=ids).logits)


@pytest.mark.slow
def test_compiled_fused_modules_equal_transformers_to_rounding_under_checkpointing():
    """torch.compile on the CPU, in the update's setting (gradient checkpointing, the recompute in the backward)."""
    plain, _ = make_tiny_model("qwen2", seed=6)
    fused = copy.deepcopy(plain)
    fuse_modules(fused, compiled=True)
    ids = torch.randint(3, 64, (4, 11), generator=torch.Generator().manual_seed(2))
    want_loss, want = _loss_and_grads(plain, ids, checkpointing=True)
    got_loss, got = _loss_and_grads(fused, ids, checkpointing=True)
    torch.testing.assert_close(got_loss, want_loss, rtol=0, atol=1e-6)
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-5, atol=1e-6, msg=k)
    assert any(g.abs().max() > 1e-4 for k, g in got.items() if "norm" in k)  # the norms' weights are trained


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_compiled_fused_modules_on_cuda_bfloat16():
    """Inductor's CUDA kernels in bfloat16 under checkpointing: the loss to bf16 rounding, every gradient within 2%
    of its largest entry."""
    plain, _ = make_tiny_model("qwen2", seed=6)
    plain = plain.to("cuda", torch.bfloat16)
    fused = copy.deepcopy(plain)
    fuse_modules(fused, compiled=True)
    ids = torch.randint(3, 64, (8, 33), generator=torch.Generator().manual_seed(2)).cuda()
    want_loss, want = _loss_and_grads(plain, ids, checkpointing=True)
    got_loss, got = _loss_and_grads(fused, ids, checkpointing=True)
    torch.testing.assert_close(got_loss, want_loss, rtol=0, atol=2e-2)
    for k in want:
        scale = float(want[k].float().abs().max()) or 1.0
        assert float((got[k].float() - want[k].float()).abs().max()) <= 0.02 * scale, k


@pytest.mark.slow
def test_a_run_under_model_and_rollout_compile_trains_as_one_without(tmp_path):
    """model.compile, rollout.compile and optim.fused_logprobs through the trainer (a given model goes through prepare_policy too): the
    same completions and rewards, losses and KL to float32 rounding, over 2 steps of the small run."""
    import json

    from grpo_runs import make_trainer

    runs = {}
    compiled = ["model.compile=true", "rollout.compile=true", "optim.fused_logprobs=true"]
    for name, extra in {"plain": [], "compiled": compiled}.items():
        trainer = make_trainer(tmp_path / name, "train.steps=2", "eval.enabled=false", *extra)
        trainer.train()
        norm = trainer.model.model.layers[0].input_layernorm
        assert getattr(norm.forward, "compiled", False) == (name == "compiled")
        lines = (tmp_path / name / "run" / "metrics.jsonl").read_text().splitlines()
        runs[name] = [json.loads(line) for line in lines if line.strip()]
        assert {m["rollout/compiled"] for m in runs[name]} == {1.0 if name == "compiled" else 0.0}
    for a, b in zip(runs["plain"], runs["compiled"]):
        assert a["reward/total/mean"] == b["reward/total/mean"] and a["completion_len/mean"] == b["completion_len/mean"]
        for key in ("loss", "kl", "grad_norm", "entropy"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), key
