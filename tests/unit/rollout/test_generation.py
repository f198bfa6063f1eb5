"""Rollout engines: FastGenerator against plain HF generate, log-probs against a full forward pass."""

import math

import pytest
import torch
from sampling_oracle import processed_logprobs
from tiny_model import PAD_ID, SAMPLE_PROMPTS, make_tiny_model

from grpokit.rollout.engines.base import completion_mask_from_ids, left_pad
from grpokit.rollout.engines.fast import FastGenerator
from grpokit.rollout.engines.fast.generator import filter_logits, sample_tokens
from grpokit.rollout.engines.hf import HFGenerator

PAD = PAD_ID
PROMPTS = SAMPLE_PROMPTS


def _hf_greedy(model, prompts, max_new_tokens, eos):
    ids, mask = left_pad(prompts, PAD)
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        do_sample=False,
        max_new_tokens=max_new_tokens,
        eos_token_id=eos,
        pad_token_id=PAD,
    )
    return out[:, ids.shape[1] :]  # (P, Lc)


def _full_logprobs(model, rollout, temperature):
    """Oracle: one forward pass over prompt + completion, log_softmax(logits / T) at the sampled tokens."""
    ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], 1)  # (N, L)
    mask = torch.cat([rollout.prompt_mask, rollout.completion_mask], 1)  # (N, L)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits.float()  # (N, L, V)
    Lp = rollout.prompt_ids.shape[1]
    logp = (logits[:, Lp - 1 : -1] / temperature).log_softmax(-1)  # (N, Lc, V)
    return logp.gather(-1, rollout.completion_ids[..., None]).squeeze(-1) * rollout.completion_mask


def _check_layout(r, prompts, G, eos):
    N = len(prompts) * G
    assert r.prompt_ids.shape[0] == r.completion_ids.shape[0] == N
    for i, p in enumerate(prompts):  # prompt-major, groups contiguous, left-padded
        for j in range(G):
            row = i * G + j
            assert r.prompt_ids[row][r.prompt_mask[row] == 1].tolist() == p
            assert (r.prompt_ids[row][r.prompt_mask[row] == 0] == PAD).all()
    mask, truncated = completion_mask_from_ids(r.completion_ids, eos)
    assert torch.equal(r.completion_mask, mask)  # up to and including the first EOS
    assert torch.equal(r.truncated, truncated)
    assert (r.completion_ids[r.completion_mask == 0] == PAD).all()
    assert (r.logprobs[r.completion_mask == 0] == 0).all()
    assert r.completion_mask[:, 0].all() and r.completion_mask.sum(-1).max() == r.completion_ids.shape[1]


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_greedy_equals_hf_generate_with_early_eos(arch):
    model, _ = make_tiny_model(arch)
    free = _hf_greedy(model, PROMPTS, 12, eos=[1])  # (P, 12)
    # Make EOS a token the model emits greedily in some rows (early on) but never in others, so some
    # rows stop early and others are truncated; <eos> (id 1) stays a second, unused, EOS id.
    token = next(t for t in free[:, 1:8].flatten().tolist() if 0 < (free == t).any(-1).sum() < len(PROMPTS))
    eos = [token, 1]
    want = _hf_greedy(model, PROMPTS, 12, eos=eos)  # (P, Lc)
    want_mask, want_trunc = completion_mask_from_ids(want, eos)
    assert want_trunc.any() and not want_trunc.all()
    assert want_mask.sum(-1).min() < want.shape[1]

    G = 2
    kw = dict(group_size=G, max_new_tokens=12, temperature=0.0, eos_token_ids=eos, pad_token_id=PAD)
    for gen in (FastGenerator(), FastGenerator(compact=False), HFGenerator()):
        r = gen.generate(model, PROMPTS, **kw)
        _check_layout(r, PROMPTS, G, eos)
        torch.testing.assert_close(r.completion_ids, want.repeat_interleave(G, 0), rtol=0, atol=0)
        torch.testing.assert_close(r.completion_mask, want_mask.repeat_interleave(G, 0), rtol=0, atol=0)
        torch.testing.assert_close(r.truncated, want_trunc.repeat_interleave(G, 0))
        # greedy log-probs are those of softmax(logits) at T = 1
        torch.testing.assert_close(r.logprobs, _full_logprobs(model, r, 1.0), rtol=0, atol=1e-5)


@pytest.mark.parametrize("gen", [FastGenerator(), HFGenerator()], ids=["fast", "hf"])
def test_sampled_logprobs_match_full_forward(gen):
    model, _ = make_tiny_model("qwen2", seed=1)
    kw = dict(group_size=3, max_new_tokens=10, top_k=20, top_p=0.9, eos_token_ids=[1, 36], pad_token_id=PAD)
    r = gen.generate(model, PROMPTS, temperature=0.7, seed=0, **kw)
    _check_layout(r, PROMPTS, 3, [1, 36])
    assert r.logprobs.dtype == torch.float32
    # the log-probs of the filtered distribution each token was drawn from (tests/sampling_oracle.py)
    want = processed_logprobs(model, r, temperature=0.7, top_k=20, top_p=0.9).float()
    torch.testing.assert_close(r.logprobs, want, rtol=0, atol=1e-5)
    unfiltered = _full_logprobs(model, r, 0.7)  # what the trainer recomputes: higher than the filtered mass
    assert float((r.logprobs - unfiltered)[r.completion_mask.bool()].min()) > 1e-3
    plain = gen.generate(model, PROMPTS, temperature=0.7, seed=0, **{**kw, "top_k": 0, "top_p": 1.0})
    torch.testing.assert_close(plain.logprobs, _full_logprobs(model, plain, 0.7), rtol=0, atol=1e-5)  # none on


@pytest.mark.slow
def test_sampling_is_reproducible_and_compaction_does_not_change_it():
    model, _ = make_tiny_model("llama", seed=2)
    kw = dict(group_size=4, max_new_tokens=10, temperature=1.0, eos_token_ids=[1, 49, 13], pad_token_id=PAD)
    fast = FastGenerator()
    a = fast.generate(model, PROMPTS, seed=123, **kw)
    assert fast.stats["compactions"] >= 1
    b = FastGenerator().generate(model, PROMPTS, seed=123, **kw)
    c = FastGenerator(compact=False).generate(model, PROMPTS, seed=123, **kw)
    d = FastGenerator().generate(model, PROMPTS, seed=124, **kw)
    assert torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.logprobs, b.logprobs)
    assert torch.equal(a.completion_ids, c.completion_ids)
    torch.testing.assert_close(a.logprobs, c.logprobs, rtol=0, atol=1e-5)
    assert not torch.equal(a.completion_ids, d.completion_ids)
    assert a.truncated.any() and not a.truncated.all()  # the batch did shrink along the way
    # At T = 1 the G samples of a prompt are not copies of each other.
    for i in range(len(PROMPTS)):
        group = a.completion_ids[i * 4 : (i + 1) * 4]
        assert len({tuple(row.tolist()) for row in group}) > 1


def test_top_k_1_equals_greedy():
    model, _ = make_tiny_model("qwen2", seed=3)
    kw = dict(group_size=2, max_new_tokens=8, eos_token_ids=[1], pad_token_id=PAD)
    greedy = FastGenerator().generate(model, PROMPTS, temperature=0.0, **kw)
    top1 = FastGenerator().generate(model, PROMPTS, temperature=1.0, top_k=1, seed=5, **kw)
    assert torch.equal(greedy.completion_ids, top1.completion_ids)
    # drawn from one kept token: probability 1 (greedy's log-probs are of softmax(logits), at T = 1)
    assert (top1.logprobs == 0).all() and (greedy.logprobs[greedy.completion_mask.bool()] < 0).all()


def test_generation_restores_train_mode_and_works_with_checkpointing():
    model, _ = make_tiny_model("qwen2")
    model.activation_checkpointing_enable() if hasattr(model, "activation_checkpointing_enable") else (
        model.gradient_checkpointing_enable()
    )
    model.train()
    kw = dict(group_size=2, max_new_tokens=6, temperature=0.0, eos_token_ids=[1], pad_token_id=PAD)
    r = FastGenerator().generate(model, PROMPTS, **kw)
    assert model.training
    model.eval()
    want = _hf_greedy(model, PROMPTS, 6, eos=[1]).repeat_interleave(2, 0)
    assert torch.equal(r.completion_ids, want)


def test_peft_model_generates_like_hf():
    peft = pytest.importorskip("peft")
    base, _ = make_tiny_model("qwen2")
    model = peft.get_peft_model(
        base, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    )
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    kw = dict(group_size=2, max_new_tokens=8, temperature=0.0, eos_token_ids=[1], pad_token_id=PAD)
    fast = FastGenerator().generate(model, PROMPTS, **kw)
    hf = HFGenerator().generate(model, PROMPTS, **kw)
    assert torch.equal(fast.completion_ids, hf.completion_ids)
    torch.testing.assert_close(fast.logprobs, hf.logprobs, rtol=0, atol=1e-5)
    with model.disable_adapter():
        plain = FastGenerator().generate(model, PROMPTS, **kw)
    assert not torch.equal(fast.completion_ids, plain.completion_ids)


def test_filter_logits_matches_hf_warpers():
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

    # hand example: probs 0.5, 0.3, 0.15, 0.05; the nucleus for p = 0.75 is {0.5, 0.3}, for p = 0.85 adds 0.15
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    assert torch.isinf(filter_logits(logits, top_p=0.75)).tolist() == [[False, False, True, True]]
    assert torch.isinf(filter_logits(logits, top_p=0.85)).tolist() == [[False, False, False, True]]
    assert torch.isinf(filter_logits(logits, top_k=1)).tolist() == [[False, True, True, True]]

    scores = torch.randn(16, 64, generator=torch.Generator().manual_seed(0)) * 3
    for k, p in [(0, 0.9), (5, 1.0), (10, 0.5), (0, 0.3)]:
        want = scores.clone()
        if k:
            want = TopKLogitsWarper(k)(None, want)
        if p < 1:
            want = TopPLogitsWarper(p)(None, want)
        assert torch.equal(torch.isinf(filter_logits(scores, k, p)), torch.isinf(want)), (k, p)


@pytest.mark.parametrize("gen", [FastGenerator(), HFGenerator()], ids=["fast", "hf"])
def test_whole_completions_follow_the_policys_sequence_probabilities(gen):
    """Not only the first token: each two-token completion is drawn as often as the model gives it
    (p(a) * p(b | prompt, a), the second token from the group's shared prompt cache), within 4 sigma."""
    model, _ = make_tiny_model()
    G, T = 4000, 0.5
    r = gen.generate(model, PROMPTS[:2], group_size=G, max_new_tokens=2, eos_token_ids=[1], pad_token_id=PAD,
                     seed=0, temperature=T)  # fmt: skip
    sequence_logp = (processed_logprobs(model, r, temperature=T) * r.completion_mask.double()).sum(-1)  # (N,)
    checked = 0
    for i in range(2):
        rows = range(i * G, (i + 1) * G)
        drawn = [tuple(r.completion_ids[k].tolist()) for k in rows]
        exact = {drawn[k - i * G]: float(sequence_logp[k].exp()) for k in rows}
        for seq, p in sorted(exact.items(), key=lambda kv: -kv[1])[:4]:
            freq = drawn.count(seq) / G
            assert abs(freq - p) < 4 * math.sqrt(p * (1 - p) / G) + 1e-3, (i, seq, freq, p)
            checked += seq[1] != PAD  # a second token that was drawn, not padding after an EOS
    assert checked >= 6


def test_gumbel_sampling_follows_the_distribution():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    n = 20000
    logits = probs.log().expand(n, 4)
    noise = torch.empty(n, 4).exponential_(generator=torch.Generator().manual_seed(0))
    tokens, logprobs = sample_tokens(logits, temperature=1.0, top_k=0, top_p=1.0, noise=noise)
    freq = torch.bincount(tokens, minlength=4) / n
    torch.testing.assert_close(freq, probs, rtol=0, atol=0.015)  # 3 sigma of 0.5 is 0.011
    torch.testing.assert_close(logprobs, probs.log()[tokens])
    # with top_p = 0.75 only the first two are drawn, in ratio 5:3; logprobs are of that distribution
    tokens, logprobs = sample_tokens(logits, temperature=1.0, top_k=0, top_p=0.75, noise=noise)
    freq = torch.bincount(tokens, minlength=4) / n
    kept = torch.tensor([0.625, 0.375, 0, 0])
    torch.testing.assert_close(freq, kept, rtol=0, atol=0.015)
    torch.testing.assert_close(logprobs, kept.log()[tokens])


def test_helpers_and_validation():
    ids, mask = left_pad([[5, 6, 7], [8]], PAD)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    mask, trunc = completion_mask_from_ids(torch.tensor([[5, 1, 0, 0], [5, 6, 7, 8], [1, 0, 0, 0]]), [1])
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]] and trunc.tolist() == [
        False,
        True,
        False,
    ]
    model, _ = make_tiny_model("qwen2")
    kw = dict(group_size=2, max_new_tokens=4, temperature=1.0, eos_token_ids=[1], pad_token_id=PAD)
    for bad, match in [
        ({"group_size": 0}, "group_size"),
        ({"top_p": 0.0}, "top_p"),
        ({"eos_token_ids": []}, "eos"),
    ]:
        with pytest.raises(ValueError, match=match):
            FastGenerator().generate(model, PROMPTS, **{**kw, **bad})
    with pytest.raises(ValueError, match="at least one token"):
        FastGenerator().generate(model, [[]], **kw)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_fast_generator_matches_hf_and_scoring(dtype):
    from grpokit.model.logprobs import completion_logprobs

    model, _ = make_tiny_model("qwen2")
    model = model.to("cuda", dtype)
    kw = dict(group_size=2, max_new_tokens=12, temperature=0.0, eos_token_ids=[1], pad_token_id=PAD)
    fast = FastGenerator().generate(model, PROMPTS, **kw)
    hf = HFGenerator().generate(model, PROMPTS, **kw)
    assert fast.completion_ids.device.type == "cpu" and fast.logprobs.dtype == torch.float32  # Rollout.to_host
    if dtype == torch.float32:
        assert torch.equal(fast.completion_ids, hf.completion_ids)
    r = FastGenerator().generate(model, PROMPTS, **{**kw, "temperature": 0.7}, seed=0)
    again = FastGenerator().generate(model, PROMPTS, **{**kw, "temperature": 0.7}, seed=0)
    assert torch.equal(r.completion_ids, again.completion_ids)
    with torch.no_grad():
        t = [x.cuda() for x in (r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask)]
        lp, _ = completion_logprobs(model, *t, temperature=0.7)
        lp = lp.cpu()
    atol = 1e-4 if dtype == torch.float32 else 0.1  # bf16: cached decode and full forward round differently
    torch.testing.assert_close(lp, r.logprobs, rtol=0, atol=atol)
