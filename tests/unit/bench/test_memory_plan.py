"""The plan's CPU optimizer step (grpokit.bench.plan): torch's AdamW off CUDA runs its for-loop form, whose
sqrt(v) and division by the bias correction are two out-of-place copies of a parameter, made while the
gradients are alive. On the bench's model that is the 151,936 x 896 embedding: 1.01 GiB, the largest
share of what short-8's peaks hold beyond the roles. Measured here on one real parameter, then by hand."""

import torch

from grpokit.bench.memory import PeakMeter
from grpokit.bench.plan import CPU_LAYER_SCALE, CPU_REST_BYTES, ModelDims, Settings, predict


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


def test_the_cpu_plan_takes_the_larger_of_the_backward_and_the_optimizer_step():
    """A 1,000 x 4 embedding (4,000 floats) beside 4 x 8 MLP matrices (32): the step copies 2 x 4,000 x 4 =
    32,000 bytes. The backward's activations: the saved layer input (4 x 4 = 16 bytes a position) plus the
    larger of the recomputed layer (CPU_LAYER_SCALE x 4 x (26 x 4 + 7 x 8) = 396 bytes a position) and the
    logits' two blocks (one token: 2 x 1,000 x 4 = 8,000), plus the rest. One token: the step is the peak;
    10,000 tokens: the backward. On CUDA (fused) the step makes no copies."""
    dims = ModelDims(
        vocab=1000, hidden=4, intermediate=8, layers=1, heads=2, kv_heads=1, head_dim=2, tied=True
    )
    s = Settings(precision="fp32")
    small = predict(dims, s, [1], device="cpu", scored=1)
    fixed = sum(v for k, v in small["roles"].items() if k != "activations")
    assert small["roles"]["activations"] == 16 + 8_000 + CPU_REST_BYTES
    assert small["optimizer_step_peak_bytes"] == small["peak_bytes"] == fixed + 32_000 + CPU_REST_BYTES
    large = predict(dims, s, [10_000], device="cpu", scored=1)
    assert large["roles"]["activations"] == int(10_000 * 16 + 10_000 * 640 * CPU_LAYER_SCALE + CPU_REST_BYTES)
    assert large["peak_bytes"] == fixed + large["roles"]["activations"]
    assert predict(dims, s, [1], device="cuda", scored=1)["optimizer_step_peak_bytes"] == fixed
    lora = Settings(precision="fp32", lora=True, lora_params=16)
    got = predict(dims, lora, [1], device="cpu", scored=1)
    assert (
        got["optimizer_step_peak_bytes"]
        == sum(v for k, v in got["roles"].items() if k != "activations") + CPU_REST_BYTES
    )


def test_the_cpu_plan_is_within_5_percent_of_the_measured_peaks():
    """The fit's two runs (long-tail-16) and two it was not fitted on (short-8: 4.37 GiB padded, 4.27 packed,
    docs/benchmarks.md, 2026-11-27/28)."""
    import json
    from pathlib import Path

    from grpokit.bench.update_memory import BATCHES, QWEN_FEW_LAYERS

    dims = ModelDims.from_dict(QWEN_FEW_LAYERS)
    runs = json.loads(
        (Path(__file__).parents[3] / "docs/bench-results/memory-long-tail-cpu-2026-11-28.json").read_text()
    )
    measured = {("long-tail-16", v): runs["variants"][v]["peak_bytes"] for v in ("padded", "packed")}
    measured |= {("short-8", "padded"): 4.37 * 2**30, ("short-8", "packed"): 4.27 * 2**30}
    for (batch, variant), peak in measured.items():
        tail = BATCHES[batch]
        completions, prompts = tail.lengths(), tail.prompt_lengths()
        s = (
            Settings(precision="fp32", beta=0.04, packing=True, micro_batch_tokens=4096)
            if variant == "packed"
            else Settings(precision="fp32", beta=0.04, micro_batch_rows=tail.rows)
        )
        lengths = [p + c for p, c in zip(prompts, completions)]
        got = predict(dims, s, lengths, device="cpu", scored=sum(completions), prompt_lengths=prompts)
        assert abs(got["peak_bytes"] - peak) <= 0.05 * peak, (
            batch,
            variant,
            got["peak_bytes"] / 2**30,
            peak / 2**30,
        )
