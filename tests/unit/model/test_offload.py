"""Offload (grpokit.model.offload) changes no number: the offloaded optimizer against the plain one over
several scheduled steps (fp32 AdamW, bf16_kahan), checkpoints that load either way, and a whole GRPO update
with the optimizer, the reference and the saved activations offloaded against the plain update. On the CPU
the copies are CPU to CPU, so the numbers must be equal bit for bit; the GPU tests check where things live."""

import copy

import pytest
import torch
from tiny_model import make_tiny_model

from grpokit.config.schema import load_config, resolve_algo
from grpokit.core.errors import ConfigError
from grpokit.model.offload import OffloadedOptimizer, activations_on_cpu, on_device
from grpokit.model.precision import PRECISIONS, make_optimizer, master_weights
from grpokit.rollout.generation import Rollout
from grpokit.train.learner import Learner, load_model
from grpokit.train.update import PolicyUpdate


def _optim(*overrides: str):
    return load_config(
        None, ["model.device=cpu", "optim.lr=1e-2", "optim.weight_decay=0.1", *overrides]
    ).optim


def _steps(params, optimizer, n: int = 3) -> None:
    """n optimizer steps under a halving schedule, each on the gradient of a fixed quadratic."""
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 0.5**s)
    for k in range(n):
        optimizer.zero_grad(set_to_none=True)
        loss = sum(
            ((p.float() - 0.1 * (k + 1)) ** 2 * torch.linspace(0.5, 2, p.numel(), device=p.device).view_as(p)).sum()
            for p in params
        )
        loss.backward()
        optimizer.step()
        scheduler.step()


@pytest.mark.parametrize("mode", ["fp32", "bf16_kahan"])
def test_offloaded_optimizer_steps_exactly_as_the_plain_one(mode):
    precision = PRECISIONS[mode]
    torch.manual_seed(0)
    start = [torch.randn(5, 3), torch.randn(7)]
    results = {}
    for offload in (False, True):
        params = [torch.nn.Parameter(t.clone().to(precision.weight_dtype)) for t in start]
        opt = make_optimizer(
            params, precision, _optim(f"optim.offload_optimizer={str(offload).lower()}"), torch.device("cpu")
        )
        assert isinstance(opt, OffloadedOptimizer) == offload
        _steps(params, opt)
        results[offload] = (params, opt)
    (plain, plain_opt), (off, off_opt) = results[False], results[True]
    for a, b in zip(plain, off):
        assert not torch.equal(a, start[0] if a.shape == start[0].shape else start[1])  # it moved
        assert torch.equal(a, b)
        assert torch.equal(master_weights(a, plain_opt), master_weights(b, off_opt))  # Kahan buffer too
    assert off_opt.param_groups[0]["lr"] == plain_opt.param_groups[0]["lr"] == pytest.approx(1e-2 * 0.5**3)
    # the checkpoint is the plain optimizer's: it loads into a plain one and steps on identically
    saved = copy.deepcopy(off_opt.state_dict())  # as from a file: not the live state tensors
    assert saved["state"].keys() == plain_opt.state_dict()["state"].keys() == {0, 1}
    again = [torch.nn.Parameter(p.detach().clone()) for p in off]
    fresh = make_optimizer(again, precision, _optim(), torch.device("cpu"))
    fresh.load_state_dict(saved)
    _steps(again, fresh, 1)
    _steps(off, off_opt, 1)
    for a, b in zip(again, off):
        assert torch.equal(a, b)


def test_offloading_the_optimizer_is_refused_with_float16_loss_scaling():
    params = [torch.nn.Parameter(torch.zeros(3))]
    with pytest.raises(ConfigError, match="offload_optimizer.*fp16_mixed"):
        make_optimizer(
            params, PRECISIONS["fp16_mixed"], _optim("optim.offload_optimizer=true"), torch.device("cpu")
        )


def _rollout() -> Rollout:
    """4 rows: prompts of 3, 2, 3, 1 tokens (left-padded), completions of 4, 2, 3, 1 tokens (right-padded)."""
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12], [13]]
    completions = [[20, 21, 22, 1], [23, 1], [24, 25, 26], [27]]
    pm = torch.tensor([[0] * (3 - len(p)) + [1] * len(p) for p in prompts])
    cm = torch.tensor([[1] * len(c) + [0] * (4 - len(c)) for c in completions])
    return Rollout(
        prompt_ids=torch.tensor([[0] * (3 - len(p)) + p for p in prompts]),
        prompt_mask=pm,
        completion_ids=torch.tensor([c + [0] * (4 - len(c)) for c in completions]),
        completion_mask=cm,
        logprobs=torch.zeros(4, 4),
        truncated=torch.zeros(4, dtype=torch.bool),
    )


def _two_updates(*overrides: str):
    """The policy's parameters and metrics after two GRPO updates (a KL to a reference that differs)."""
    cfg = load_config(
        None,
        [
            "model.device=cpu",
            "algo.preset=grpo",
            "algo.beta=0.04",
            "optim.lr=1e-3",
            "model.gradient_checkpointing=true",
            *overrides,
        ],
    )
    model, _, precision, device = load_model(cfg, *make_tiny_model("qwen2", seed=0))
    learner = Learner(model, precision, device, cfg.optim, total_steps=10)
    ref, _ = make_tiny_model("qwen2", seed=1)
    updater = PolicyUpdate(learner, resolve_algo(cfg), cfg.optim, temperature=1.0, seed=0, ref_model=ref)
    metrics = [updater.update(_rollout(), torch.tensor([1.0, -0.5, 0.25, 2.0]), step=s)[0] for s in range(2)]
    return [p.detach().clone() for p in model.parameters()], metrics


def test_a_grpo_update_with_everything_offloaded_changes_no_number():
    plain, m_plain = _two_updates()
    off, m_off = _two_updates(
        "optim.offload_optimizer=true", "optim.offload_reference=true", "optim.offload_activations=true"
    )
    assert m_plain[1]["kl_mean"] > 0  # the reference pass ran
    for a, b in zip(plain, off):
        assert torch.equal(a, b)
    for a, b in zip(m_plain, m_off):
        assert a == b


@pytest.mark.parametrize("offload", [False, True])
def test_activations_on_cpu_takes_the_saved_tensors_and_keeps_the_gradient(offload):
    lin = torch.nn.Linear(4, 3)
    x = torch.randn(2, 4)
    outer = []  # what reaches an outer pair of hooks: nothing once save_on_cpu's (inner) hooks take it
    with torch.autograd.graph.saved_tensors_hooks(lambda t: outer.append(t.shape) or t, lambda t: t):
        with activations_on_cpu(offload, torch.device("cpu")):
            y = torch.tanh(lin(x)).sum()
    assert (outer == []) == offload
    y.backward()
    grad = lin.weight.grad.clone()
    lin.zero_grad()
    torch.tanh(lin(x)).sum().backward()
    assert torch.equal(grad, lin.weight.grad)


def test_on_device_is_a_no_op_without_offload_and_returns_the_model_to_the_cpu():
    model = torch.nn.Linear(2, 2)
    with on_device(model, torch.device("cpu"), offload=True):
        assert model.weight.device.type == "cpu"
    with on_device(None, torch.device("cpu"), offload=True):
        pass


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@CUDA
def test_on_a_gpu_the_offloaded_states_and_the_reference_live_on_the_cpu():
    cuda = torch.device("cuda")
    params = [torch.nn.Parameter(torch.randn(64, 64, device=cuda, dtype=torch.bfloat16))]
    opt = make_optimizer(params, PRECISIONS["bf16_kahan"], _optim("optim.offload_optimizer=true"), cuda)
    _steps(params, opt, 2)
    states = [
        v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor) and v.numel() > 1
    ]
    assert states and all(v.device.type == "cpu" for v in states) and params[0].device.type == "cuda"
    ref = torch.nn.Linear(8, 8)
    with on_device(ref, cuda, offload=True):
        assert ref.weight.device.type == "cuda"
    assert ref.weight.device.type == "cpu"
