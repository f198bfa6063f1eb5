"""Each phase's bound (grpokit.bench.roofline): the FLOP and bytes by hand on a 204-parameter model, the attention
term against a naive loop, the datasheet cards by name, and the rates measured on this device."""

import math

import pytest
import torch

from grpokit.bench.plan import ModelDims
from grpokit.bench.roofline import (
    DeviceRates,
    datasheet_card,
    device_rates,
    forward_flops,
    linear_params_per_layer,
    measured_rates,
    phase_bounds,
)

# hidden 4, intermediate 8, 1 layer, 2 heads of dim 2, 1 kv head, vocabulary 10, tied embeddings
DIMS = ModelDims(vocab=10, hidden=4, intermediate=8, layers=1, heads=2, kv_heads=1, head_dim=2, tied=True)
RATES = DeviceRates("a made-up device", "float32", mem_bw_bytes_s=1e3, peak_flops=1e6, source="test")


def test_the_flop_of_a_forward_pass_by_hand():
    # matmul weights of the layer: q, o 4 x 4 = 16 each; k, v 4 x 2 = 8 each; MLP 3 x 4 x 8 = 96: 144
    assert linear_params_per_layer(DIMS) == 144
    # 2 rows of 3 tokens, the last 2 scored: per row the matmuls 2 x 144 x 3 = 864, causal attention
    # 2 x 4 x 3 x 4 = 96 (QK^T and AV, 2 FLOP a multiply-add, over 1 + 2 + 3 = 6 query-key pairs of width 4: 4 x 6 x 4),
    # the head 2 x 10 x 4 x 2 = 160: 1,120 a row, 2,240 in all
    assert forward_flops(DIMS, rows=2, row_len=3, scored=2) == 2240


def test_the_attention_term_is_the_naive_loops():
    d = DIMS.heads * DIMS.head_dim
    for length in (1, 2, 7, 64):
        naive = sum(2 * 2 * d * (i + 1) for i in range(length))  # query i meets keys 0..i: QK^T and AV
        linear = 2 * linear_params_per_layer(DIMS) * length + 2 * DIMS.vocab * DIMS.hidden * 0
        assert forward_flops(DIMS, rows=1, row_len=length, scored=0) == DIMS.layers * (linear + naive)


def test_each_phase_bound_and_ratio_by_hand():
    # decode: 204 parameters x 4 bytes = 816 B a step; KV 1 layer x (K, V) x 1 head x dim 2 x 4 B = 16 B a position;
    # step 0 reads 2 rows x 1 position (the prompt) = 32 B, step 1 2 x 2 = 64 B: (816 + 32 + 816 + 64) / 1e3 B/s
    # = 1.728 s, memory bound (a step's 2 x 204 x 2 = 816 FLOP take 8.16e-4 s at 1e6 FLOP/s)
    assert DIMS.params == 204
    measured = {"generation_s": 3.456, "reference_s": 4.48e-3, "update_s": 6.72e-3}
    out = phase_bounds(measured, DIMS, RATES, rows=2, prompt_len=1, completion_len=2, weight_bytes=4, kv_bytes=4,
                       reference=True)  # fmt: skip
    gen, ref, upd = (out["phases"][k] for k in ("generation", "reference", "update"))
    assert gen["bound_s"] == pytest.approx(1.728) and gen["bytes"] == 1728 and gen["ratio"] == pytest.approx(2.0)
    # reference: a forward over the 2 rows of 1 + 2 tokens, 2 scored: 2,240 FLOP (above) / 1e6 = 2.24e-3 s
    assert ref["flops"] == 2240 and ref["bound_s"] == pytest.approx(2.24e-3) and ref["ratio"] == pytest.approx(2.0)
    # update: forward + backward = 3 x 2,240 = 6,720 FLOP: 6.72e-3 s, the measurement's 1x
    assert upd["flops"] == 6720 and upd["bound_s"] == pytest.approx(6.72e-3) and upd["ratio"] == pytest.approx(1.0)
    assert out["device"]["peak_flops"] == 1e6
    # LoRA: no weight gradient of the frozen matmuls, 2 x 2,240; two epochs twice that; no reference: no bound
    lora = phase_bounds(measured, DIMS, RATES, rows=2, prompt_len=1, completion_len=2, weight_bytes=4, kv_bytes=4,
                        reference=False, lora=True, epochs=2)["phases"]  # fmt: skip
    assert lora["update"]["flops"] == 2 * 2 * 2240
    assert lora["reference"]["bound_s"] is None and lora["reference"]["ratio"] is None


@pytest.mark.parametrize(
    "name, card",
    [
        ("NVIDIA H200", "NVIDIA H200 SXM"),
        ("NVIDIA H200 NVL", "NVIDIA H200 NVL"),
        ("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM"),
        ("NVIDIA H100 PCIe", "NVIDIA H100 PCIe"),
        ("NVIDIA H100 NVL", "NVIDIA H100 NVL"),
        ("NVIDIA A100-SXM4-80GB", None),
        ("NVIDIA GeForce RTX 4090", None),
    ],
)
def test_the_datasheet_card_of_a_device_name(name, card):
    assert datasheet_card(name) == card


def test_rates_off_a_known_card_are_measured_on_the_device():
    r = measured_rates(torch.device("cpu"), torch.float32, matmul_n=64, copy_bytes=2**20, reps=2)
    assert r.source.startswith("measured: best of 2 64x64 matmuls")
    assert math.isfinite(r.peak_flops) and r.peak_flops > 0 and math.isfinite(r.mem_bw_bytes_s) and r.mem_bw_bytes_s > 0
    assert device_rates(torch.device("cpu"), torch.float32).source.startswith("measured")
