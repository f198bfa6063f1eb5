"""completion_logprobs against the plain full-logits computation."""

import pytest
import torch
from tiny_model import make_tiny_model

from grpokit.model.logprobs import completion_logprobs

PAD = 0


def _batch(seed=0, vocab=64):
    """3 rows: left-padded prompts of lengths 5, 2, 4 and right-padded completions of lengths 4, 6, 1."""
    g = torch.Generator().manual_seed(seed)
    p_len, c_len = [5, 2, 4], [4, 6, 1]
    Lp, Lc = max(p_len), max(c_len)
    p_ids = torch.full((3, Lp), PAD)
    p_mask = torch.zeros((3, Lp), dtype=torch.long)
    c_ids = torch.full((3, Lc), PAD)
    c_mask = torch.zeros((3, Lc), dtype=torch.long)
    for i in range(3):
        p_ids[i, Lp - p_len[i] :] = torch.randint(3, vocab, (p_len[i],), generator=g)
        p_mask[i, Lp - p_len[i] :] = 1
        c_ids[i, : c_len[i]] = torch.randint(3, vocab, (c_len[i],), generator=g)
        c_mask[i, : c_len[i]] = 1
    return p_ids, p_mask, c_ids, c_mask


def full_logprobs(model, p_ids, p_mask, c_ids, c_mask, temperature=1.0):
    """Oracle: the model's full logits, log_softmax(logits / T), gathered at the completion tokens."""
    ids = torch.cat([p_ids, c_ids], 1)  # (N, L)
    mask = torch.cat([p_mask, c_mask], 1)  # (N, L)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)  # (N, L)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits  # (N, L, V)
    Lp = p_ids.shape[1]
    logp = (logits[:, Lp - 1 : -1].float() / temperature).log_softmax(-1)  # (N, Lc, V)
    lp = logp.gather(-1, c_ids[..., None]).squeeze(-1)  # (N, Lc)
    entropy = -(logp.exp() * logp).sum(-1)  # (N, Lc)
    return lp * c_mask, entropy * c_mask


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("chunk_size", [1, 4, 1024])
def test_chunked_logprobs_and_entropy_match_full_logits(arch, chunk_size):
    model, _ = make_tiny_model(arch)
    batch = _batch()
    with torch.no_grad():
        want, want_ent = full_logprobs(model, *batch, temperature=0.7)
        got, ent = completion_logprobs(
            model, *batch, temperature=0.7, chunk_size=chunk_size, with_entropy=True
        )
    assert got.dtype == torch.float32 and got.shape == batch[2].shape
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    torch.testing.assert_close(ent, want_ent, rtol=0, atol=1e-5)
    assert (got[batch[3] == 0] == 0).all() and (ent[batch[3] == 0] == 0).all()
    assert not got.requires_grad


def _grads(model, fn):
    """Parameter gradients of a fixed weighted sum of the log-probs. Compared relative to each tensor's
    largest entry: embedding gradients reach ~106, and summing the rows in another order (chunked vs
    full) moves their small neighbours by ~4e-5 in fp32, i.e. 4e-7 of the tensor's scale."""
    model.zero_grad()
    lp = fn()
    w = torch.linspace(-1, 1, lp.numel()).view_as(lp)  # a generic per-token weighting
    (lp * w).sum().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("tied", [False, True])
def test_gradients_match_full_logits(tied):
    model, _ = make_tiny_model("qwen2", tie_word_embeddings=tied)
    batch = _batch(seed=1)
    want = _grads(model, lambda: full_logprobs(model, *batch, temperature=0.7)[0])
    got = _grads(model, lambda: completion_logprobs(model, *batch, temperature=0.7, chunk_size=3)[0])
    assert want.keys() == got.keys() and len(got) == len(list(model.parameters()))
    for name in want:
        scale = float(want[name].abs().max())
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-6 * scale + 1e-6, msg=name)


def _enable_checkpointing(model) -> list[int]:
    """Turn on HF activation checkpointing; return a list that counts checkpointed layer calls."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    calls = []
    for layer in model.model.layers:
        inner = layer._gradient_checkpointing_func
        layer._gradient_checkpointing_func = lambda *a, _f=inner, **k: calls.append(1) or _f(*a, **k)
    return calls


def test_gradient_checkpointing_gives_the_same_gradients():
    model, _ = make_tiny_model("llama")
    batch = _batch(seed=2)
    want = _grads(model, lambda: completion_logprobs(model, *batch, chunk_size=5)[0])
    calls = _enable_checkpointing(model)
    model.train()  # dropout is 0 in the tiny configs; checkpointing is only active in train mode
    got = _grads(model, lambda: completion_logprobs(model, *batch, chunk_size=5)[0])
    assert len(calls) == 2  # both layers went through the checkpoint
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-5, msg=name)


def test_lm_head_bias_is_applied():
    model, _ = make_tiny_model("qwen2")
    old = model.lm_head
    model.lm_head = torch.nn.Linear(old.in_features, old.out_features, bias=True)
    with torch.no_grad():
        model.lm_head.weight.copy_(old.weight)
        model.lm_head.bias.copy_(torch.linspace(-3, 3, old.out_features))
    batch = _batch(seed=3)
    with torch.no_grad():
        want, _ = full_logprobs(model, *batch)
        got, _ = completion_logprobs(model, *batch, chunk_size=2)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_final_logit_softcapping_is_applied():
    from transformers import Gemma2Config, Gemma2ForCausalLM

    torch.manual_seed(0)
    config = Gemma2Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        final_logit_softcapping=2.0,  # small, so capping changes the numbers a lot
        sliding_window=4,
        pad_token_id=PAD,
    )
    model = Gemma2ForCausalLM(config).eval()
    with torch.no_grad():
        model.model.embed_tokens.weight.normal_(0, 1.0)  # tied head: large logits, capping matters
    batch = _batch(seed=4)
    with torch.no_grad():
        want, _ = full_logprobs(model, *batch, temperature=0.7)
        got, _ = completion_logprobs(model, *batch, temperature=0.7, chunk_size=3)
        model.config.final_logit_softcapping = None
        uncapped, _ = completion_logprobs(model, *batch, temperature=0.7, chunk_size=3)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    assert (uncapped - want).abs().max() > 1e-2


def test_unknown_logit_scaling_is_refused():
    model, _ = make_tiny_model("qwen2")
    model.config.logit_scale = 0.5
    with pytest.raises(NotImplementedError, match="logit_scale"):
        completion_logprobs(model, *_batch())


def test_padding_side_invariance():
    """A sequence alone (no padding) scores the same as inside a left/right-padded batch."""
    model, _ = make_tiny_model("qwen2")
    p_ids, p_mask, c_ids, c_mask = _batch(seed=5)
    with torch.no_grad():
        batched, _ = completion_logprobs(model, p_ids, p_mask, c_ids, c_mask, chunk_size=3)
        for i in range(3):
            p = p_ids[i][p_mask[i] == 1][None]  # (1, len)
            c = c_ids[i][c_mask[i] == 1][None]  # (1, len)
            alone, _ = completion_logprobs(model, p, torch.ones_like(p), c, torch.ones_like(c))
            torch.testing.assert_close(batched[i, : c.shape[1]], alone[0], rtol=0, atol=1e-5)


def test_lora_reference_is_the_base_model():
    peft = pytest.importorskip("peft")
    base, _ = make_tiny_model("qwen2")
    batch = _batch(seed=6)
    with torch.no_grad():
        base_lp, _ = full_logprobs(base, *batch)
    model = peft.get_peft_model(
        base, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    )
    # LoRA B starts at zero: the adapted model is still the base model.
    with torch.no_grad():
        torch.testing.assert_close(completion_logprobs(model, *batch)[0], base_lp, rtol=0, atol=1e-5)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    with torch.no_grad(), model.disable_adapter():  # the trainer's reference under LoRA
        ref, _ = completion_logprobs(model, *batch)
    with torch.no_grad():
        adapted, _ = completion_logprobs(model, *batch, chunk_size=2)
    torch.testing.assert_close(ref, base_lp, rtol=0, atol=1e-5)
    assert (adapted - base_lp).abs().max() > 1e-3
    assert not ref.requires_grad

    # Gradients reach only the LoRA weights, and match the full-logits oracle through the PEFT forward.
    model.train()
    calls = _enable_checkpointing(model.base_model.model)
    got = _grads(model, lambda: completion_logprobs(model, *batch, chunk_size=4)[0])
    assert len(calls) == 2
    want = _grads(model, lambda: full_logprobs(model, *batch)[0])
    assert got.keys() == want.keys() and got and all("lora_" in n for n in got)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-5, msg=name)


def test_temperature_and_errors():
    model, _ = make_tiny_model("qwen2", seed=0)
    batch = _batch(seed=7)
    with torch.no_grad():
        want, _ = full_logprobs(model, *batch, temperature=0.5)
        got, _ = completion_logprobs(model, *batch, temperature=0.5)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="temperature"):
        completion_logprobs(model, *batch, temperature=-1.0)
    with torch.no_grad():  # greedy rollouts (T = 0) are scored at T = 1, like the generators report them
        torch.testing.assert_close(
            completion_logprobs(model, *batch, temperature=0.0)[0],
            full_logprobs(model, *batch)[0],
            rtol=0,
            atol=1e-5,
        )


def test_backward_keeps_no_full_vocabulary_tensor():
    """The autograd graph outside the checkpointed chunks saves no (., V) logits; the oracle saves several."""
    V = 96  # distinct from every other dimension of the tiny model
    model, _ = make_tiny_model("qwen2", vocab_size=V)
    batch = _batch(seed=8, vocab=V)
    assert _saved_vocab_shapes(lambda: full_logprobs(model, *batch)[0].sum(), V)
    assert _saved_vocab_shapes(lambda: completion_logprobs(model, *batch, chunk_size=4)[0].sum(), V) == []


def _saved_vocab_shapes(loss_fn, V):
    """The shapes of the (..., V) tensors autograd saves while ``loss_fn()`` builds its graph (which is then
    backpropagated): logits kept for the backward."""
    shapes = []

    def pack(t):
        if t.dim() and t.shape[-1] == V:
            shapes.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = loss_fn()
    loss.backward()
    return shapes


def _entropy_weighted(pair, mask):
    """A fixed weighted sum of log-probs and entropies, as a loss with an entropy bonus makes (no padding term)."""
    lp, ent = pair
    w = torch.linspace(-1, 1, lp.numel()).view_as(lp)
    return (lp * w - 0.3 * ent * w.flip(-1)) * mask


@pytest.mark.parametrize("packed", [False, True])
def test_entropy_gradient_matches_full_logits(packed):
    """entropy_grad=True: the entropy of each completion position with its gradient (the entropy bonus), chunked,
    padded or packed, gives the oracle's values and parameter gradients (the full logits' entropy under autograd)."""
    model, _ = make_tiny_model("qwen2")
    batch = _batch(seed=4)
    mask = batch[3].float()
    want = _grads(model, lambda: _entropy_weighted(full_logprobs(model, *batch, temperature=0.7), mask))
    got = _grads(
        model,
        lambda: _entropy_weighted(
            completion_logprobs(model, *batch, temperature=0.7, chunk_size=3, entropy_grad=True, packed=packed), mask
        ),
    )
    assert want.keys() == got.keys() and len(got) == len(list(model.parameters()))
    for name in want:
        scale = float(want[name].abs().max())
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-6 * scale + 1e-6, msg=name)
    lp, ent = completion_logprobs(model, *batch, temperature=0.7, chunk_size=3, entropy_grad=True, packed=packed)
    with torch.no_grad():
        lp0, ent0 = completion_logprobs(model, *batch, temperature=0.7, chunk_size=3, with_entropy=True, packed=packed)
    # the no-grad entropy of the metrics is lse - sum p x, this one -sum p log p: equal to float32 rounding
    assert ent.requires_grad and torch.allclose(ent.detach(), ent0, atol=1e-5) and torch.allclose(lp.detach(), lp0)
    assert float(ent[mask == 0].abs().sum()) == 0.0


def test_entropy_without_gradient_by_default_and_no_full_vocabulary_tensor_with_it():
    """Off (the default) the entropy carries no graph, as before; on, the backward still saves no (., V) logits
    outside the checkpointed chunks, so the bonus costs one chunk's recomputation, not a copy of the logits."""
    V = 96
    model, _ = make_tiny_model("qwen2", vocab_size=V)
    batch = _batch(seed=8, vocab=V)
    _, ent = completion_logprobs(model, *batch, chunk_size=4, with_entropy=True)
    assert ent.grad_fn is None and not ent.requires_grad

    def with_bonus():
        lp, ent = completion_logprobs(model, *batch, chunk_size=4, entropy_grad=True)
        return lp.sum() + ent.sum()

    assert _saved_vocab_shapes(with_bonus, V) == []


@pytest.mark.parametrize("chunk_size", [1, 4, 1024])
@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "checkpointed"])
def test_sft_token_stats_match_full_logits(chunk_size, grad):
    """token_logprobs(with_stats=True): the top-1 hits and entropies of the trained tokens equal the full logits'
    argmax and entropy (SFT's mean_token_accuracy and entropy). Half the trained tokens are made the model's own
    argmax, so both outcomes occur; the log-probs are the plain call's, with their gradient when it is on."""
    from grpokit.model.logprobs import token_logprobs

    model, _ = make_tiny_model("qwen2")
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 64, (2, 9), generator=g)  # (N, L)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0  # right padding
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits.float()  # (N, L, V)
    ids[:, 1::2] = logits[:, :-1].argmax(-1)[:, ::2]  # tokens 1, 3, ... are what the model's argmax predicts
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits.float()
    loss_mask = mask.clone()
    loss_mask[:, 0] = 0
    keep = loss_mask[:, 1:].bool()  # (N, L-1)
    logp = logits[:, :-1].log_softmax(-1)  # (N, L-1, V)
    want_top1 = (logp.argmax(-1) == ids[:, 1:])[keep]
    want_entropy = -(logp.exp() * logp).sum(-1)[keep]
    with torch.set_grad_enabled(grad):
        lp, top1, entropy = token_logprobs(model, ids, loss_mask, attention_mask=mask, chunk_size=chunk_size,
                                           with_stats=True)  # fmt: skip
        plain = token_logprobs(model, ids, loss_mask, attention_mask=mask, chunk_size=chunk_size)
    assert 0 < int(want_top1.sum()) < want_top1.numel()
    assert top1.dtype == torch.bool and torch.equal(top1, want_top1)
    torch.testing.assert_close(entropy, want_entropy, rtol=0, atol=1e-5)
    torch.testing.assert_close(lp, plain, rtol=0, atol=0)
    assert lp.requires_grad == grad and not entropy.requires_grad
