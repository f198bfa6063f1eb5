"""rollout.compile: the static engine's fused elementwise layers (grpokit.model.fused_layers) against the modules
they stand in for, eagerly (bit for bit) and through torch.compile (the same greedy tokens, log-probs to rounding)."""

import pytest
import torch
from tiny_model import PAD_ID, SAMPLE_PROMPTS, make_tiny_model

from grpokit.model.fused_layers import LayerOps, add_rms_norm, rms_norm, rope_qk, swiglu
from grpokit.model.llama_layers import rotate
from grpokit.rollout.engines.fast import FastGenerator
from grpokit.rollout.engines.fast.decode import StaticCacheEngine
from grpokit.rollout.engines.hf import HFGenerator

KW = dict(group_size=3, max_new_tokens=12, eos_token_ids=[1, *range(30, 40)], pad_token_id=PAD_ID)


@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_functions_equal_the_modules_bit_for_bit(arch, dtype):
    model, _ = make_tiny_model(arch, seed=1)
    model = model.to(dtype)
    layer = model.model.layers[0]
    with torch.no_grad():
        layer.input_layernorm.weight.normal_(1.0, 0.3)  # a weight that is not all ones, so it is applied
        h = torch.randn(3, 5, 32, dtype=dtype)
        delta = torch.randn(3, 5, 32, dtype=dtype)
        norm = layer.input_layernorm
        assert torch.equal(rms_norm(h, norm.weight, norm.variance_epsilon), norm(h))
        summed, normed = add_rms_norm(h, delta, norm.weight, norm.variance_epsilon)
        assert torch.equal(summed, h + delta) and torch.equal(normed, norm(h + delta))
        mlp = layer.mlp
        assert torch.equal(mlp.down_proj(swiglu(mlp.gate_proj(h), mlp.up_proj(h))), mlp(h))
        q, k = torch.randn(3, 4, 5, 8, dtype=dtype), torch.randn(3, 2, 5, 8, dtype=dtype)
        cos, sin = torch.randn(3, 5, 8, dtype=dtype), torch.randn(3, 5, 8, dtype=dtype)
        rq, rk = rope_qk(q, k, cos, sin)
        assert torch.equal(rq, rotate(q, cos, sin)) and torch.equal(rk, rotate(k, cos, sin))
        ops = LayerOps(compiled=False, hidden_act=model.config.hidden_act)
        assert torch.equal(ops.mlp(mlp, h), mlp(h)) and torch.equal(ops.norm(norm, h), norm(h))


def test_unknown_modules_are_called_as_they_are():
    """A norm or MLP of a class the fused formulas are not known to match runs its own forward."""

    class ScaledNorm(torch.nn.Module):
        weight = torch.nn.Parameter(torch.ones(4))
        variance_epsilon = 1e-6

        def forward(self, x):
            return 2 * x

    class GeluMLP(torch.nn.Module):
        def forward(self, x):
            return x + 1

    ops = LayerOps(compiled=False, hidden_act="silu")
    x = torch.randn(2, 4)
    assert torch.equal(ops.norm(ScaledNorm(), x), 2 * x)
    h, normed = ops.add_norm(ScaledNorm(), x, x)
    assert torch.equal(h, 2 * x) and torch.equal(normed, 4 * x)
    assert torch.equal(ops.mlp(GeluMLP(), x), x + 1)
    model, _ = make_tiny_model("qwen2")
    gelu = LayerOps(compiled=False, hidden_act="gelu")  # a Qwen2MLP under another activation: its own forward
    called = []
    mlp = model.model.layers[0].mlp
    mlp.register_forward_hook(lambda *a: called.append(1))
    gelu.mlp(mlp, torch.randn(1, 2, 32))
    assert called == [1]


@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3"])
def test_fused_engine_equals_the_modules_engine_bit_for_bit(arch):
    """Eagerly the fused layers are the same operations in the same order: the same logits, greedy and sampled."""
    model, _ = make_tiny_model(arch, seed=2)
    plain, fused = FastGenerator(kv_cache="static"), FastGenerator(kv_cache="static")
    plain.engine = StaticCacheEngine(model, bucketed=True)
    fused.engine = StaticCacheEngine(model, bucketed=True, fused=True)
    for temperature in (0.0, 1.0):
        a = plain.generate(model, SAMPLE_PROMPTS, temperature=temperature, seed=5, **KW)
        b = fused.generate(model, SAMPLE_PROMPTS, temperature=temperature, seed=5, **KW)
        assert torch.equal(a.completion_ids, b.completion_ids)
        assert torch.equal(a.logprobs, b.logprobs)
    assert fused.engine.ops is not None and plain.engine.ops is None


@pytest.mark.slow
def test_compiled_engine_decodes_as_transformers_generate():
    """rollout.compile on the CPU (Inductor's C++ kernels): greedy tokens equal transformers' generate, log-probs to
    float32 rounding; and the setting reaches the engine."""
    from types import SimpleNamespace

    model, _ = make_tiny_model("qwen2", seed=3)
    settings = SimpleNamespace(kv_cache="static", cuda_graphs=True, compile=True)
    compiled = FastGenerator.from_settings(settings)
    greedy = compiled.generate(model, SAMPLE_PROMPTS, temperature=0.0, **KW)
    assert compiled.engine.ops is not None and compiled.engine.ops.compiled
    hf = HFGenerator().generate(model, SAMPLE_PROMPTS, temperature=0.0, **KW)
    assert torch.equal(greedy.completion_ids, hf.completion_ids)
    torch.testing.assert_close(greedy.logprobs, hf.logprobs, rtol=0, atol=1e-5)
    sampled = compiled.generate(model, SAMPLE_PROMPTS, temperature=1.0, seed=9, **KW)
    ref = FastGenerator(kv_cache="static").generate(model, SAMPLE_PROMPTS, temperature=1.0, seed=9, **KW)
    assert torch.equal(sampled.completion_ids, ref.completion_ids)
    torch.testing.assert_close(sampled.logprobs, ref.logprobs, rtol=0, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_layers_inside_cuda_graphs_decode_as_the_modules(dtype):
    """Inductor's kernels recorded in the decode graphs: the rollout of the modules' graphs (float32: the same tokens;
    bfloat16: fused roundings may flip a near-tie, rarely)."""
    model, _ = make_tiny_model("qwen2", seed=7)
    model = model.to("cuda", dtype)
    prompts = SAMPLE_PROMPTS * 4
    kw = dict(KW, group_size=4, max_new_tokens=40)
    plain = FastGenerator(kv_cache="static", cuda_graphs=True)
    compiled = FastGenerator(kv_cache="static", cuda_graphs=True, compile=True)
    a = plain.generate(model, prompts, temperature=1.0, seed=3, **kw)
    b = compiled.generate(model, prompts, temperature=1.0, seed=3, **kw)
    assert compiled.engine.use_graphs and compiled.engine.ops.compiled
    if dtype == torch.float32:
        assert torch.equal(a.completion_ids, b.completion_ids)
        torch.testing.assert_close(a.logprobs, b.logprobs, rtol=0, atol=1e-4)
    else:
        same = (a.completion_ids == b.completion_ids).float().mean()
        assert same >= 0.9, f"only {same:.0%} of tokens agree with the modules' graphs"


def test_auto_compiles_on_a_gpu_only():
    """rollout.compile=auto (the default): the CPU engine runs the modules as they are; a bad value is refused."""
    model, _ = make_tiny_model("qwen2", seed=1)
    auto = FastGenerator(kv_cache="static", compile="auto")
    auto.generate(model, SAMPLE_PROMPTS, temperature=0.0, **KW)
    assert auto.engine.ops is None  # a CPU model
    with pytest.raises(ValueError, match="compile must be true, false or auto"):
        FastGenerator(compile="yes")


def test_a_compile_that_fails_names_the_settings_that_turn_it_off(monkeypatch):
    """torch.compile unable to build a fused function (no compiler, an unsupported torch): a clear error."""
    import torch._dynamo.exc as dynamo_exc

    import grpokit.model.fused_layers as fused

    def broken(fn, **kwargs):
        def call(*args):
            raise dynamo_exc.TorchDynamoException("no working C compiler found\nmore lines")

        return call

    monkeypatch.setattr(fused.torch, "compile", broken)
    ops = LayerOps(compiled=True)
    with pytest.raises(RuntimeError, match=r"fused rms_norm \(TorchDynamoException: no working C compiler found\); "
                       r"set rollout.compile=false, model.compile=false and optim.fused_logprobs=false"):  # fmt: skip
        ops._norm(torch.ones(2, 4), torch.ones(4), 1e-6)
    monkeypatch.setattr(fused.torch, "compile", lambda fn, **kwargs: fn)  # a compile that builds: errors of the
    with pytest.raises(RuntimeError, match="size of tensor"):  # function itself pass through as they are
        LayerOps(compiled=True)._norm(torch.ones(2, 4), torch.ones(3), 1e-6)


@pytest.mark.parametrize(("compile", "graphs", "device", "want"), [
    ("auto", True, "cuda", True), ("auto", False, "cuda", False), ("auto", True, "cpu", False),
    (True, False, "cpu", True), (False, True, "cuda", False),
])  # fmt: skip
def test_auto_compiles_where_the_decode_replays_cuda_graphs(monkeypatch, compile, graphs, device, want):
    import grpokit.rollout.engines.fast.generator as generator

    asked = {}
    monkeypatch.setattr(generator, "model_device", lambda model: torch.device(device))
    monkeypatch.setattr(generator, "make_engine", lambda model, kv, **kw: asked.update(kw) or "engine")
    FastGenerator(compile=compile, cuda_graphs=graphs).engine_for(torch.nn.Linear(1, 1))
    assert asked["compiled"] is want
