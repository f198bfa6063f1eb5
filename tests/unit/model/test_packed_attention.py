"""Packed rows keep attention to themselves under each attention implementation grpokit may be given.

transformers 5 (masking_utils): with no attention mask, no cache and position_ids that restart, sdpa, eager
and flex_attention get a block-causal mask from the restarts (find_packed_sequence_indices); the
flash_attention_2/3/4 kernels turn the restarts into cu_seqlens and run varlen
(modeling_flash_attention_utils._is_packed_sequence). An implementation outside its mask table (the paged
ones, custom registered kernels) gets no mask at all, so its packed rows would see each other and the
future: grpokit refuses packing for it, naming it. On the CPU: sdpa and eager, packed == padded log-probs
and gradients; the paged refusal. On a GPU (skipped without CUDA): eager, flex_attention and, where the
flash-attn package is installed, flash_attention_2."""

import pytest
import torch
from ragged_batch import ragged_batch
from tiny_model import make_tiny_model

from grpokit.config.schema import load_config
from grpokit.core.errors import ConfigError
from grpokit.model.logprobs import attention_implementation, check_packed_attention, completion_logprobs
from grpokit.train.learner import Learner, load_model

CPU = torch.device("cpu")


def _padded_and_packed(model, batch: list[torch.Tensor]) -> dict[bool, tuple[torch.Tensor, dict]]:
    """{packed: (log-probs (4, 9), the gradient of a weighted sum of them)}."""
    out = {}
    for packed in (False, True):
        model.zero_grad()
        lp, _ = completion_logprobs(model, *batch, temperature=0.7, chunk_size=5, packed=packed)  # (4, 9)
        (lp * torch.linspace(-1, 1, lp.numel(), device=lp.device).view_as(lp)).sum().backward()
        out[packed] = (lp.detach(), {n: p.grad.clone() for n, p in model.named_parameters()})
    return out


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_packed_log_probs_and_gradients_equal_padded_under(impl):
    model, _ = make_tiny_model("qwen2", seed=0)
    model.set_attn_implementation(impl)
    assert attention_implementation(model) == impl
    batch = list(ragged_batch(CPU)[:4])
    out = _padded_and_packed(model, batch)
    (lp0, g0), (lp1, g1) = out[False], out[True]
    assert int((lp0 != 0).sum()) == int(batch[3].sum()) == 20  # every completion token scored
    torch.testing.assert_close(lp1, lp0, rtol=0, atol=2e-5)  # float32 sums in another order
    for name, grad in g0.items():
        assert float((g1[name] - grad).abs().max()) <= 1e-5 * float(grad.abs().max()) + 1e-8, name
    assert check_packed_attention(model, CPU)


def test_a_paged_attention_implementation_is_refused_by_name_when_packing():
    """paged|eager builds no mask without its paged cache: packed rows would attend to each other (and to
    the future), so packing is refused and the message names the implementation and what to use."""
    model, _ = make_tiny_model("qwen2", seed=0)
    model.set_attn_implementation("paged|eager")
    assert not check_packed_attention(model, CPU)
    cfg = load_config(None, ["model.device=cpu", "optim.packing=true"])
    model, _, precision, device = load_model(cfg, model, None)
    with pytest.raises(ConfigError, match=r"attn_implementation 'paged\|eager'.*set optim.packing=false"):
        Learner(model, precision, device, cfg.optim, total_steps=1)
    padded = load_config(None, ["model.device=cpu"])
    Learner(model, precision, device, padded.optim, total_steps=1)  # not packing: nothing to refuse


GPU_IMPLS = ["eager", "flex_attention", "flash_attention_2"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("impl", GPU_IMPLS)
def test_packed_equals_padded_on_cuda_under(impl):
    """float32 (flash_attention_2: bfloat16, its only dtypes, against float32 sdpa's values: no worse
    than padded's own error)."""
    if impl == "flash_attention_2":
        from transformers.utils import is_flash_attn_2_available

        if not is_flash_attn_2_available():
            pytest.skip("the flash-attn package is not installed")
    cuda = torch.device("cuda")
    # head dim 16: flex_attention's kernels need at least 16
    model, _ = make_tiny_model("qwen2", seed=0, hidden_size=64)
    model = model.to(cuda)
    batch = list(ragged_batch(cuda)[:4])
    exact = completion_logprobs(model, *batch, temperature=0.7, packed=False)[0]  # sdpa, float32
    if impl == "flash_attention_2":
        model = model.to(torch.bfloat16)
    model.set_attn_implementation(impl)
    assert check_packed_attention(model, cuda)
    lp = {p: completion_logprobs(model, *batch, temperature=0.7, packed=p)[0] for p in (False, True)}
    if impl == "flash_attention_2":
        err_padded = float((lp[False] - exact).abs().max())
        assert float((lp[True] - exact).abs().max()) <= 2 * err_padded + 1e-3
    else:
        torch.testing.assert_close(lp[True], lp[False], rtol=0, atol=1e-4)
        torch.testing.assert_close(lp[False], exact, rtol=0, atol=1e-4)
