"""The plan's CPU optimizer step (grpokit.bench.plan): torch's AdamW off CUDA runs its for-loop form, whose
sqrt(v) and division by the bias correction are two out-of-place copies of a parameter, made while the
gradients are alive. On the bench's model that is the 151,936 x 896 embedding: 1.01 GiB, the largest
share of what short-8's peaks hold beyond the roles. Measured here on one real parameter, then by hand."""

import torch

from grpokit.bench.memory import PeakMeter
from grpokit.bench.plan import ModelDims, Settings, predict


def _step_peak(fused: bool, rows: int = 2048, cols: int = 2048) -> tuple[int, int]:
    """(the peak resident set's increase over one AdamW step, the parameter's bytes): the step's temporaries."""
    p = torch.nn.Parameter(torch.randn(rows, cols))
    opt = torch.optim.AdamW([p], lr=1e-3, betas=(0.9, 0.99), fused=fused)
    p.grad = torch.randn_like(p)
    opt.step()  # the states exist from here on
    p.grad = torch.randn_like(p)
    meter = PeakMeter(torch.device("cpu"))
    meter.baseline()
    meter.start()
    opt.step()
    return meter.peak_bytes(), p.numel() * p.element_size()


def test_a_for_loop_adamw_step_on_the_cpu_holds_two_copies_of_the_parameter():
    peak, size = _step_peak(fused=False)  # a 16 MiB parameter
    assert 1.9 * size <= peak <= 2.1 * size, (peak, size)
    peak, size = _step_peak(fused=True)
    assert peak <= 0.1 * size, (peak, size)  # fused (grpokit's choice on CUDA): in place


def test_the_cpu_plan_adds_the_step_of_the_largest_parameter_and_takes_the_larger_phase():
    """A 1,000 x 4 embedding (4,000 floats) beside 4 x 8 MLP matrices (32): the step copies 2 x 4,000 x 4 =
    32,000 bytes. With one token of activations (12,656 bytes, the logits' 12,000 of them) the step is the
    peak; with 10,000 tokens the backward is; on CUDA (fused) there are no copies."""
    dims = ModelDims(
        vocab=1000, hidden=4, intermediate=8, layers=1, heads=2, kv_heads=1, head_dim=2, tied=True
    )
    s = Settings(precision="fp32")
    small = predict(dims, s, [1], device="cpu", scored=1)
    fixed = sum(v for k, v in small["roles"].items() if k != "activations")
    assert small["optimizer_step_peak_bytes"] == fixed + 32_000
    assert small["roles"]["activations"] == 12_656 and small["peak_bytes"] == fixed + 32_000
    large = predict(dims, s, [10_000], device="cpu", scored=1)
    assert (
        large["roles"]["activations"] > 32_000
        and large["peak_bytes"] == fixed + large["roles"]["activations"]
    )
    assert predict(dims, s, [1], device="cuda", scored=1)["optimizer_step_peak_bytes"] == fixed
    lora = Settings(precision="fp32", lora=True, lora_params=16)
    assert predict(dims, lora, [1], device="cpu", scored=1)["optimizer_step_peak_bytes"] == sum(
        v for k, v in predict(dims, lora, [1], device="cpu", scored=1)["roles"].items() if k != "activations"
    )
