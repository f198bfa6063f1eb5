"""optim.shared_prefix (grpokit.model.shared_prefix): each distinct prompt through the decoder once, its completions
scored on its KV cache, against the padded forward and the full-logits oracle: the same log-probs and gradients,
whatever the prompts' padding and the completions' lengths; the padded forward where it does not apply."""

import pytest
import torch
from test_logprobs import _enable_checkpointing, _grads, full_logprobs
from tiny_model import make_tiny_model
from transformers import MistralConfig, MistralForCausalLM

import grpokit.model.shared_prefix as shared
from grpokit.model.logprobs import _padded_states, completion_logprobs

PAD = 0


def grouped_batch(seed=0, vocab=64, group=3):
    """3 prompts of 5, 2 and 4 tokens (left-padded), each with ``group`` completions of 1 to 6 tokens (right-padded),
    the groups' rows interleaved (a micro-batch sorted by length mixes them)."""
    g = torch.Generator().manual_seed(seed)
    p_len = [5, 2, 4]
    prompts = [torch.randint(3, vocab, (n,), generator=g) for n in p_len]
    rows = [(i % 3, int(torch.randint(1, 7, (1,), generator=g))) for i in range(3 * group)]
    Lp, Lc = max(p_len), max(n for _, n in rows)
    N = len(rows)
    p_ids, p_mask = torch.full((N, Lp), PAD), torch.zeros((N, Lp), dtype=torch.long)
    c_ids, c_mask = torch.full((N, Lc), PAD), torch.zeros((N, Lc), dtype=torch.long)
    for r, (p, n) in enumerate(rows):
        p_ids[r, Lp - p_len[p] :], p_mask[r, Lp - p_len[p] :] = prompts[p], 1
        c_ids[r, :n], c_mask[r, :n] = torch.randint(3, vocab, (n,), generator=g), 1
    return p_ids, p_mask, c_ids, c_mask


def counting(monkeypatch) -> list[int]:
    """Rows of every shared-prefix forward that ran (its prompts' count), from here on."""
    seen, inner = [], shared._states

    def spy(decoder, prompt_ids, *a, always=False):
        out = inner(decoder, prompt_ids, *a, always=always)
        if not always:  # not usable()'s own check
            seen.append(None if out is None else torch.unique(prompt_ids, dim=0).shape[0])
        return out

    monkeypatch.setattr(shared, "_states", spy)
    return seen


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_log_probs_and_gradients_match_the_oracle(arch, monkeypatch):
    model, _ = make_tiny_model(arch)
    batch = grouped_batch(seed=1)
    seen = counting(monkeypatch)
    with torch.no_grad():
        want, _ = full_logprobs(model, *batch, temperature=0.7)
        got, _ = completion_logprobs(model, *batch, temperature=0.7, shared_prefix=True)
    assert seen == [3]  # the three prompts once each, for nine rows
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    model.train()
    g_shared = _grads(model, lambda: completion_logprobs(model, *batch, shared_prefix=True)[0])
    g_full = _grads(model, lambda: full_logprobs(model, *batch)[0])
    assert seen == [3, 3] and g_full.keys() == g_shared.keys()
    for name, g in g_full.items():
        scale = float(g.abs().max())
        assert scale > 0, name
        torch.testing.assert_close(g_shared[name], g, rtol=0, atol=1e-5 * scale, msg=name)


def test_lora_gradients_reach_the_adapters_through_the_shared_prompt():
    peft = pytest.importorskip("peft")
    base, _ = make_tiny_model("qwen2")
    model = peft.get_peft_model(
        base, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    )
    for name, p in model.named_parameters():
        if "lora_B" in name:
            p.data.normal_(0, 0.5, generator=torch.Generator().manual_seed(0))
    batch = grouped_batch(seed=2)
    model.train()
    got = _grads(model, lambda: completion_logprobs(model, *batch, shared_prefix=True)[0])
    want = _grads(model, lambda: full_logprobs(model, *batch)[0])
    assert got.keys() == want.keys() and all("lora_" in n for n in got)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-5, msg=name)


@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3"])
def test_under_gradient_checkpointing_the_layers_run_here_each_checkpointed(arch, monkeypatch):
    """transformers' checkpointed layers drop a KV cache, so a training forward under gradient checkpointing runs the
    layers from the model's modules (_layerwise), each layer one checkpointed region: the oracle's gradients."""
    model, _ = make_tiny_model(arch)
    model.train()
    hf_calls = _enable_checkpointing(model)
    regions, inner = [], shared.checkpoint
    monkeypatch.setattr(shared, "checkpoint", lambda *a, **k: regions.append(1) or inner(*a, **k))
    batch = grouped_batch(seed=4)
    got = _grads(model, lambda: completion_logprobs(model, *batch, temperature=0.8, shared_prefix=True)[0])
    assert len(regions) == 2 and hf_calls == []  # two layers, each checkpointed here; none through transformers
    want = _grads(model, lambda: full_logprobs(model, *batch, temperature=0.8)[0])
    assert got.keys() == want.keys()
    for name, g in want.items():
        torch.testing.assert_close(got[name], g, rtol=0, atol=1e-5 * float(g.abs().max()), msg=name)


def test_the_padded_forward_runs_where_it_does_not_apply(monkeypatch):
    """No prompt repeated; a sliding-window model (its cache layers are not the plain dynamic one, and the layers
    here have no sliding window); attention dropout under checkpointing: the padded forward's values."""
    model, _ = make_tiny_model("qwen2")
    seen = counting(monkeypatch)
    once = grouped_batch(seed=3, group=1)  # three rows, three prompts
    with torch.no_grad():
        torch.testing.assert_close(
            completion_logprobs(model, *once, shared_prefix=True)[0], full_logprobs(model, *once)[0], rtol=0, atol=1e-5
        )
    assert seen == [None]  # looked, found no prompt twice, ran padded

    batch = grouped_batch(seed=4)
    cfg = MistralConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, max_position_embeddings=64, sliding_window=3,
    )  # fmt: skip
    mistral = MistralForCausalLM(cfg).eval()
    assert not shared.usable(mistral.model, _padded_states)
    assert not shared.usable(mistral.model, _padded_states, "layerwise")
    with torch.no_grad():
        torch.testing.assert_close(
            completion_logprobs(mistral, *batch, shared_prefix=True)[0],
            completion_logprobs(mistral, *batch)[0], rtol=0, atol=0,
        )  # fmt: skip

    dropout, _ = make_tiny_model("qwen2", seed=1)
    dropout.config.attention_dropout = 0.1  # the layers here would not drop what transformers' do
    assert shared.usable(dropout.model, _padded_states)  # (in eval mode transformers drops nothing)
    assert not shared.usable(dropout.model, _padded_states, "layerwise")


@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3"])
def test_the_check_passes_in_low_precision_and_refuses_a_forward_that_disagrees(arch, monkeypatch):
    for dtype in (torch.bfloat16, torch.float16):
        model, _ = make_tiny_model(arch, seed=2)
        model = model.to(dtype)
        assert shared.usable(model.model, _padded_states) and shared.usable(model.model, _padded_states, "layerwise")
    inner = shared._states
    # a forward one position off (the state of token t taken for token t + 1): what the check is there to catch
    monkeypatch.setattr(shared, "_states", lambda *a, **k: inner(*a, **k).roll(1, dims=1))
    model, _ = make_tiny_model(arch, seed=3)
    assert not shared.usable(model.model, _padded_states)


def test_auto_shares_the_prompt_on_a_cpu_not_on_a_gpu():
    from grpokit.model.shared_prefix import shared_prefix_on

    assert shared_prefix_on("auto", torch.device("cpu")) and not shared_prefix_on("auto", torch.device("cuda", 0))
    assert shared_prefix_on(True, torch.device("cuda")) and not shared_prefix_on(False, torch.device("cpu"))
