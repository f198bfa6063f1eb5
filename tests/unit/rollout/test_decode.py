"""Decode engines: the static KV cache (own buffers, buckets, CUDA graphs) against the model's dynamic cache."""

import pytest
import torch
from tiny_model import PAD_ID, SAMPLE_PROMPTS, make_tiny_model

from grpokit.rollout.engines.base import left_pad
from grpokit.rollout.engines.fast import FastGenerator
from grpokit.rollout.engines.fast.decode import (
    DynamicCacheEngine,
    StaticCacheEngine,
    make_engine,
    static_cache_support,
)
from grpokit.rollout.engines.hf import HFGenerator

PAD = PAD_ID
PROMPTS = SAMPLE_PROMPTS


def _drive(engine, model, prompts, G, steps, keep_at=()):
    """Feed the same token stream to ``engine``; return the logits of every call, of the surviving rows.

    At each step in ``keep_at`` every other live row is dropped (engine.keep), like compaction does.
    """
    ids, mask = left_pad(prompts, PAD)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        logits = engine.prefill(ids, mask, G, steps + 1)  # (N, V)
        out = [logits]
        rows = torch.arange(logits.shape[0])
        for t in range(steps):
            tokens = torch.randint(3, model.config.vocab_size, (len(rows),), generator=gen)  # (B,)
            if t in keep_at:
                keep = torch.arange(0, len(rows), 2)
                engine.keep(keep)
                rows, tokens = rows[keep], tokens[keep]
            out.append(engine.step(tokens))
    return out


@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3"])
@pytest.mark.parametrize("bucketed", [False, True], ids=["exact", "bucketed"])
def test_static_engine_logits_equal_dynamic_cache(arch, bucketed):
    model, _ = make_tiny_model(arch, seed=3)
    assert static_cache_support(model) is None
    G, steps, keep_at = 4, 9, (3, 6)  # 16 rows -> 8 -> 4 (buckets 16 -> 8 -> 8)
    want = _drive(DynamicCacheEngine(model), model, PROMPTS, G, steps, keep_at)
    got = _drive(StaticCacheEngine(model, bucketed=bucketed), model, PROMPTS, G, steps, keep_at)
    assert [g.shape for g in got] == [w.shape for w in want]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=2e-5)


def test_static_engine_reuses_buffers_without_leaking_old_slots():
    """A second call reuses the buffers (shorter prompts, stale slots behind the mask): same logits as fresh."""
    model, _ = make_tiny_model("qwen2", seed=4)
    engine = StaticCacheEngine(model)
    long_prompts = [p + [9, 9, 9, 9, 9] for p in PROMPTS]
    _drive(engine, model, long_prompts, 2, 6)
    buffers = [k.data_ptr() for k in engine.keys]
    short = [[2, 7], [3], [2, 9, 9], [4, 4]]
    got = _drive(engine, model, short, 2, 6)
    assert [k.data_ptr() for k in engine.keys] == buffers  # reused, not reallocated
    want = _drive(StaticCacheEngine(model), model, short, 2, 6)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-6)
    # More rows than allocated: new buffers.
    _drive(engine, model, short, 3, 2)
    assert engine.keys[0].shape[0] == 12


def test_static_engine_reuses_larger_buffers_for_a_smaller_batch():
    """After 32 rows, a 6-row call reuses the buffers in the bucket layout (rows 6..7 are scratch)."""
    model, _ = make_tiny_model("llama", seed=9)
    engine = StaticCacheEngine(model, bucketed=True)
    _drive(engine, model, PROMPTS * 2, 4, 8)  # 32 rows
    buffers = [k.data_ptr() for k in engine.keys]
    small = [[2, 5, 6], [9]]
    got = _drive(engine, model, small, 3, 8, keep_at=(4,))  # 6 rows (bucket 8), then 3
    assert [k.data_ptr() for k in engine.keys] == buffers and engine.keys[0].shape[0] == 32
    want = _drive(DynamicCacheEngine(model), model, small, 3, 8, keep_at=(4,))
    for g, w in zip(got, want):
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g, w, rtol=0, atol=2e-5)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_static_generator_equals_hf_generate_greedy_and_dynamic_sampling(attn):
    model, _ = make_tiny_model("llama", seed=5)
    model.config._attn_implementation = attn
    kw = dict(group_size=3, max_new_tokens=14, eos_token_ids=[1, *range(30, 42)], pad_token_id=PAD)
    static = FastGenerator(kv_cache="static")
    static.engine = StaticCacheEngine(model, bucketed=True)  # the CUDA-graph row layout, on CPU
    dynamic = FastGenerator(kv_cache="dynamic")

    greedy = static.generate(model, PROMPTS, temperature=0.0, **kw)
    assert static.stats["engine"] == "static"
    hf = HFGenerator().generate(model, PROMPTS, temperature=0.0, **kw)
    assert torch.equal(greedy.completion_ids, hf.completion_ids)
    torch.testing.assert_close(greedy.logprobs, hf.logprobs, rtol=0, atol=1e-5)

    sampled = static.generate(model, PROMPTS, temperature=1.0, top_p=0.95, seed=11, **kw)
    ref = dynamic.generate(model, PROMPTS, temperature=1.0, top_p=0.95, seed=11, **kw)
    assert dynamic.stats["engine"] == "dynamic" and static.stats["compactions"] >= 1
    assert torch.equal(sampled.completion_ids, ref.completion_ids)
    assert torch.equal(sampled.completion_mask, ref.completion_mask)
    torch.testing.assert_close(sampled.logprobs, ref.logprobs, rtol=0, atol=1e-5)


@pytest.mark.slow
def test_static_engine_runs_peft_lora_and_follows_weight_updates():
    from peft import LoraConfig, get_peft_model

    base, _ = make_tiny_model("qwen2", seed=6)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():  # non-zero adapters, so LoRA changes the outputs
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    kw = dict(group_size=2, max_new_tokens=10, temperature=0.0, eos_token_ids=[1], pad_token_id=PAD)
    static = FastGenerator(kv_cache="static")
    hf = HFGenerator()
    first = static.generate(model, PROMPTS, **kw)
    assert torch.equal(first.completion_ids, hf.generate(model, PROMPTS, **kw).completion_ids)
    with torch.no_grad():  # an in-place update, as the optimizer does: the kept engine must see it
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.mul_(-1.0)
    second = static.generate(model, PROMPTS, **kw)
    assert torch.equal(second.completion_ids, hf.generate(model, PROMPTS, **kw).completion_ids)
    assert not torch.equal(first.completion_ids, second.completion_ids)
    with model.disable_adapter():  # the switch is part of the engine's state: the base model decodes
        off = static.generate(model, PROMPTS, **kw)
        assert torch.equal(off.completion_ids, hf.generate(base, PROMPTS, **kw).completion_ids)
    assert not torch.equal(off.completion_ids, second.completion_ids)
    assert torch.equal(static.generate(model, PROMPTS, **kw).completion_ids, second.completion_ids)


def test_unsupported_models_fall_back_or_fail_clearly():
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=64)).eval()
    assert "model_type 'gpt2' is not one of" in static_cache_support(gpt2)  # said by its type, not a missing part
    assert isinstance(make_engine(gpt2, "auto"), DynamicCacheEngine)
    with pytest.raises(ValueError, match="static KV cache cannot run this model.*gpt2.*kv_cache='dynamic'"):
        make_engine(gpt2, "static")
    kw = dict(group_size=2, max_new_tokens=6, temperature=0.0, eos_token_ids=[1], pad_token_id=PAD)
    gen = FastGenerator()  # auto
    r = gen.generate(gpt2, PROMPTS, **kw)
    assert gen.stats["engine"] == "dynamic"
    assert torch.equal(r.completion_ids, HFGenerator().generate(gpt2, PROMPTS, **kw).completion_ids)

    sliding, _ = make_tiny_model("qwen2")
    sliding.config.layer_types = ["sliding_attention", "full_attention"]
    assert "sliding" in static_cache_support(sliding)
    dynamic_rope, _ = make_tiny_model("llama")
    dynamic_rope.config.rope_parameters = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}
    assert "dynamic RoPE" in static_cache_support(dynamic_rope)
    with pytest.raises(ValueError, match="unknown kv_cache"):
        FastGenerator(kv_cache="paged")


def test_static_engine_refuses_to_write_past_its_capacity():
    model, _ = make_tiny_model("qwen2")
    engine = StaticCacheEngine(model)
    ids, mask = left_pad([[2, 3]], PAD)
    with torch.no_grad():
        engine.prefill(ids, mask, 1, 62)  # capacity rounds up to 64 slots: 2 prompt + 62 decode
        for _ in range(62):
            engine.step(torch.tensor([5]))
        with pytest.raises(RuntimeError, match="static KV cache is full"):
            engine.step(torch.tensor([5]))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_graph_replay_equals_eager_static_and_dynamic(dtype):
    model, _ = make_tiny_model("qwen2", seed=7)
    model = model.to("cuda", dtype)
    prompts = PROMPTS * 4  # 16 prompts x G=4 = 64 rows: buckets 64, 32, 16, 8
    # 15 EOS ids of 64 and a check of the finished rows after every step (CUDA's default is every 8th):
    # rows finish early enough that the batch compacts into smaller buckets, each recorded as its own graph.
    eos = [1, *range(30, 44)]
    kw = dict(group_size=4, max_new_tokens=40, temperature=1.0, eos_token_ids=eos, pad_token_id=PAD)
    graphs = FastGenerator(kv_cache="static", cuda_graphs=True, check_every=1)
    eager = FastGenerator(kv_cache="static", cuda_graphs=False, check_every=1)
    eager.engine = StaticCacheEngine(model, cuda_graphs=False, bucketed=True)
    dynamic = FastGenerator(kv_cache="dynamic", check_every=1)
    a = graphs.generate(model, prompts, seed=3, **kw)
    assert graphs.engine.use_graphs and graphs.engine.graphs_recorded >= 2
    assert graphs.stats["compactions"] >= 1
    # The same kernels on the same row layout, recorded or launched one by one.
    b = eager.generate(model, prompts, seed=3, **kw)
    assert torch.equal(a.completion_ids, b.completion_ids)
    torch.testing.assert_close(a.logprobs, b.logprobs, rtol=0, atol=1e-5 if dtype == torch.float32 else 1e-3)
    again = graphs.generate(model, prompts, seed=3, **kw)  # replays the kept graphs
    assert torch.equal(a.completion_ids, again.completion_ids)
    small = graphs.generate(model, prompts[:3], seed=4, **kw)  # a smaller batch: kept buffers, bucket 16
    assert torch.equal(small.completion_ids, eager.generate(model, prompts[:3], seed=4, **kw).completion_ids)
    c = dynamic.generate(model, prompts, seed=3, **kw)
    if dtype == torch.float32:
        assert torch.equal(a.completion_ids, c.completion_ids)
    else:  # other kernels round bf16 differently; a near-tie may flip a draw, rarely
        same = (a.completion_ids == c.completion_ids).float().mean()
        assert same >= 0.9, f"only {same:.0%} of tokens agree with the dynamic cache"


@pytest.mark.slow
@pytest.mark.parametrize("kv_cache", ["static", "dynamic"])
def test_checking_finished_rows_less_often_changes_nothing(kv_cache):
    """check_every=5 (fewer device syncs) gives the rollout of check_every=1, early EOS and compaction included."""
    model, _ = make_tiny_model("qwen2", seed=8)
    kw = dict(group_size=4, max_new_tokens=17, eos_token_ids=[1, *range(30, 44)], pad_token_id=PAD)
    every_step = FastGenerator(kv_cache=kv_cache, check_every=1)
    sparse = FastGenerator(kv_cache=kv_cache, check_every=5)
    for temperature, seed in ((1.0, 21), (0.0, None)):
        a = every_step.generate(model, PROMPTS, temperature=temperature, seed=seed, **kw)
        b = sparse.generate(model, PROMPTS, temperature=temperature, seed=seed, **kw)
        for name in ("completion_ids", "completion_mask", "truncated"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name
        # batch sizes differ between the two runs after compaction: matmul rounding, nothing more
        torch.testing.assert_close(a.logprobs, b.logprobs, rtol=0, atol=1e-5)
    assert every_step.stats["compactions"] >= 1
    assert a.completion_mask.sum(-1).max() == a.completion_ids.shape[1]  # trimmed to the longest row
    with pytest.raises(ValueError, match="check_every"):
        FastGenerator(check_every=-1)
