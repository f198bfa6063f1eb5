"""optim.fused_logprobs: grpokit.model.fused_logprobs against the full logits (the oracle) and the plain chunked
path: log-probs, entropies and gradients, eager (its formulas) and compiled (Inductor on the CPU)."""

import pytest
import torch
from test_logprobs import _batch, _enable_checkpointing, _grads, full_logprobs
from tiny_model import make_tiny_model

from grpokit.model.fused_logprobs import chunk_backward, chunk_forward, fused_chunk_logprobs
from grpokit.model.logprobs import completion_logprobs


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunk_formulas_equal_autograd_over_the_full_log_softmax(temperature, dtype):
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(6, 50, generator=g) * 3).to(dtype).requires_grad_()
    targets = torch.randint(0, 50, (6,), generator=g)
    weights = torch.randn(6, generator=g)
    logp_all = (logits.float() / temperature).log_softmax(-1)  # (6, 50)
    want_lp = logp_all.gather(-1, targets[:, None]).squeeze(-1)
    want_entropy = -(logp_all.exp() * logp_all).sum(-1)
    (want_lp * weights).sum().backward()
    want_grad, logits.grad = logits.grad.clone(), None

    lp, lse, entropy = chunk_forward(logits.detach(), targets, temperature)
    tol = dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lp, want_lp.detach(), **tol)
    torch.testing.assert_close(entropy, want_entropy.detach(), **tol)
    grad = chunk_backward(logits.detach(), targets, lse, weights, temperature)
    assert grad.dtype == dtype
    torch.testing.assert_close(grad, want_grad, **({} if dtype == torch.bfloat16 else tol))

    lp2, entropy2 = fused_chunk_logprobs(logits, targets, temperature, compiled=False)  # the autograd Function
    (lp2 * weights).sum().backward()
    assert torch.equal(lp2, lp) and torch.equal(entropy2, entropy) and not entropy2.requires_grad
    assert torch.equal(logits.grad, grad)


@pytest.mark.parametrize("fused", ["eager", True], ids=["eager", "compiled"])
def test_completion_logprobs_fused_equal_the_full_logits_and_their_gradients(fused):
    """Through the model, under gradient checkpointing (each LM-head chunk recomputed in the backward pass)."""
    model, _ = make_tiny_model("qwen2", seed=2)
    _enable_checkpointing(model)
    model.train()
    batch = _batch(seed=3)
    want_lp, want_entropy = full_logprobs(model, *batch, temperature=0.7)
    lp, entropy = completion_logprobs(model, *batch, temperature=0.7, chunk_size=3, with_entropy=True, fused=fused)
    torch.testing.assert_close(lp, want_lp.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(entropy, want_entropy.detach(), rtol=1e-5, atol=1e-5)
    want = _grads(model, lambda: full_logprobs(model, *batch, temperature=0.7)[0])
    got = _grads(model, lambda: completion_logprobs(model, *batch, temperature=0.7, chunk_size=3, fused=fused)[0])
    assert want.keys() == got.keys()
    for name in want:
        scale = float(want[name].abs().max())
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-6 * scale + 1e-6, msg=name)


def test_the_entropy_bonus_and_a_softcap_keep_the_plain_path():
    """Chunks whose entropy needs a gradient run the plain helpers: with fused set the numbers are bit for bit."""
    model, _ = make_tiny_model("llama", seed=4)
    batch = _batch(seed=5)
    plain = completion_logprobs(model, *batch, chunk_size=4, entropy_grad=True)
    fused = completion_logprobs(model, *batch, chunk_size=4, entropy_grad=True, fused="eager")
    assert torch.equal(plain[0], fused[0]) and torch.equal(plain[1], fused[1]) and fused[1].requires_grad


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_compiled_fused_logprobs_on_cuda_equal_the_plain_path():
    """Inductor's CUDA kernels, bfloat16 model, a 32k vocabulary: log-probs and entropies to float32 rounding of the
    same bf16 logits, every gradient within 1% of its largest entry."""
    model, _ = make_tiny_model("qwen2", seed=6, vocab_size=32768)
    model = model.to("cuda", torch.bfloat16)
    batch = [t.cuda() for t in _batch(seed=7)]
    plain = completion_logprobs(model, *batch, temperature=0.7, chunk_size=4, with_entropy=True)
    fused = completion_logprobs(model, *batch, temperature=0.7, chunk_size=4, with_entropy=True, fused=True)
    torch.testing.assert_close(fused[0], plain[0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(fused[1], plain[1], rtol=1e-4, atol=1e-4)
    want = _grads(model, lambda: completion_logprobs(model, *batch, temperature=0.7, chunk_size=4)[0])
    got = _grads(model, lambda: completion_logprobs(model, *batch, temperature=0.7, chunk_size=4, fused=True)[0])
    for name in want:
        scale = float(want[name].float().abs().max()) or 1.0
        assert float((got[name].float() - want[name].float()).abs().max()) <= 0.01 * scale, name


def test_the_chunk_bench_script_times_both_paths():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "scripts" / "bench_logprob_chunk.py"
    spec = importlib.util.spec_from_file_location("bench_logprob_chunk", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out = script.main(["--rows", "4", "--hidden", "8", "--vocab", "32", "--dtype", "float32", "--device", "cpu"])
    assert set(out) == {"plain", "fused"} and all(v["min_s"] > 0 for v in out.values())
