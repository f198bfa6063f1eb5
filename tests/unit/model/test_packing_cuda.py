"""Packing on a GPU: the CPU tests (tests/unit/train/test_packing.py) prove packed == padded on the CPU's
attention kernels; on CUDA, transformers' sdpa path builds its own kernels and masks from the packed
position_ids, so the same equality is checked there (skipped without CUDA)."""

import pytest
import torch
from tiny_model import make_tiny_model

from grpokit.model.logprobs import check_packed_attention, completion_logprobs

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def _ragged(device, vocab=64, seed=0):
    """4 rows: left-padded prompts of 5, 2, 4, 1 tokens; right-padded completions of 4, 9, 1, 6 tokens."""
    g = torch.Generator().manual_seed(seed)
    p_len, c_len = [5, 2, 4, 1], [4, 9, 1, 6]
    Lp, Lc = max(p_len), max(c_len)
    p_ids, p_mask = torch.zeros((4, Lp), dtype=torch.long), torch.zeros((4, Lp), dtype=torch.long)
    c_ids, c_mask = torch.zeros((4, Lc), dtype=torch.long), torch.zeros((4, Lc), dtype=torch.long)
    for i in range(4):
        p_ids[i, Lp - p_len[i] :] = torch.randint(3, vocab, (p_len[i],), generator=g)
        p_mask[i, Lp - p_len[i] :] = 1
        c_ids[i, : c_len[i]] = torch.randint(3, vocab, (c_len[i],), generator=g)
        c_mask[i, : c_len[i]] = 1
    return [t.to(device) for t in (p_ids, p_mask, c_ids, c_mask)]


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_packed_equals_padded_on_cuda_float32_and_bfloat16(arch):
    cuda = torch.device("cuda")
    model, _ = make_tiny_model(arch, seed=0)
    model = model.to(cuda)
    batch = _ragged(cuda)
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
