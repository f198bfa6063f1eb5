"""Packing on a GPU: the CPU tests (tests/unit/train/test_packing.py) prove packed == padded on the CPU's
attention kernels; on CUDA, transformers' sdpa path builds its own kernels and masks from the packed
position_ids, so the same equality is checked there (skipped without CUDA)."""

import pytest
import torch
from ragged_batch import ragged_batch
from tiny_model import make_tiny_model

from grpokit.model.logprobs import check_packed_attention, completion_logprobs

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_packed_equals_padded_on_cuda_float32_and_bfloat16(arch):
    cuda = torch.device("cuda")
    model, _ = make_tiny_model(arch, seed=0)
    model = model.to(cuda)
    batch = list(ragged_batch(cuda)[:4])
    assert check_packed_attention(model, cuda)
    lp = {
        packed: completion_logprobs(model, *batch, temperature=0.7, packed=packed)[0]
        for packed in (False, True)
    }
    torch.testing.assert_close(lp[True], lp[False], rtol=0, atol=1e-4)  # float32: the same maths, other order
    exact = lp[False]
    model = model.to(torch.bfloat16)
    half = {
        packed: completion_logprobs(model, *batch, temperature=0.7, packed=packed)[0]
        for packed in (False, True)
    }
    err_padded = float((half[False] - exact).abs().max())
    err_packed = float((half[True] - exact).abs().max())
    assert err_packed <= 2 * err_padded + 1e-3, (
        err_packed,
        err_padded,
    )  # bf16: no worse than padded's own error
