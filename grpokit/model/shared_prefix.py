"""Each group's prompt run through the decoder once, its completions scored on it (optim.shared_prefix).

A GRPO batch holds G completions of each prompt, and the padded forward (grpokit.model.logprobs) runs every prompt's
tokens through the decoder G times, in the update and in every log-prob pass. Here the decoder runs each distinct
prompt once with a KV cache, the cache's rows are indexed out to the completions (the gradient of each copy flows
back, summed, into its prompt's forward), and the completions run on that cache:

    hidden_p, K_p, V_p  = decoder(prompt_p)                             (P, Lp, H): the P distinct prompts
    hidden_i            = decoder(completion_i | K_p(i), V_p(i))        (N, Lc, H): positions go on from the prompt's
    state_i[t]          = hidden_p(i)[-1] at t = 0, hidden_i[t - 1] after    predicts completion token t

The same numbers as the padded forward up to float rounding (every completion token attends to the same keys at the
same positions), for P Lp + N Lc tokens through the decoder instead of N (Lp + Lc): with G = 8 and prompts as long as
completions, 56% of the work. It applies to a single-turn batch (no context mask), not packed, with some prompt
repeated, under a model whose transformers KV cache is the plain dynamic one (``usable``: checked once per model
against the padded forward). In a training forward under gradient checkpointing transformers drops the cache, so
there the layers run from the model's modules instead (``_layerwise``, the Llama family: grpokit.model.llama_layers),
each layer's prompt and completion parts in one checkpointed region, recomputed in the backward pass. Elsewhere
``prefix_states`` returns None and the caller runs the padded forward. Written here because transformers has no
training forward that shares a prefix (its prefix sharing is for generation).
"""

from __future__ import annotations

import functools
import inspect
import weakref

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from grpokit.model.llama_layers import head_shape, llama_family_support, project_qkv

_USABLE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # decoder -> {kind: bool}, ``usable``'s answers


def shared_prefix_on(setting: bool | str, device: torch.device) -> bool:
    """optim.shared_prefix for a model on ``device``: true, false, or auto: on where it measured faster, a CPU (not a
    GPU: on an H200 the padded forward's fewer, larger kernels were faster, docs/benchmarks.md)."""
    if setting == "auto":
        return torch.device(device).type != "cuda"
    return bool(setting)


def prefix_states(
    decoder, prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor, completion_mask: Tensor, *, padded
):
    """(N, Lc, H) the decoder's outputs at the positions predicting each completion token, as ``padded`` (the padded
    forward, grpokit.model.logprobs._padded_states, which ``usable`` compares with) gives them, each distinct prompt
    run once; None when this does not apply (module docstring). prompt_ids / prompt_mask (N, Lp) left-padded,
    completion_ids / completion_mask (N, Lc) right-padded."""
    args = (prompt_ids, prompt_mask, completion_ids, completion_mask)
    if _checkpointing(decoder):  # transformers' checkpointed layers drop a KV cache: the layers run here
        return _layerwise(decoder, *args, checkpointed=True) if usable(decoder, padded, "layerwise") else None
    return _states(decoder, *args) if usable(decoder, padded) else None


def _distinct_prompts(prompt_ids: Tensor, prompt_mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(ids (P, Lp), mask (P, Lp), row_of (N,)): the distinct prompts of the N rows and each row's."""
    Lp = prompt_ids.shape[1]
    rows = torch.cat([prompt_ids, prompt_mask.to(prompt_ids.dtype)], dim=1)  # (N, 2 Lp)
    distinct, row_of = torch.unique(rows, dim=0, return_inverse=True)  # (P, 2 Lp), (N,)
    return distinct[:, :Lp], distinct[:, Lp:], row_of


def _states(decoder, prompt_ids, prompt_mask, completion_ids, completion_mask, *, always: bool = False):
    """prefix_states' numbers through the model's forward and its KV cache (module docstring); None when no prompt
    repeats (unless ``always``: the check's own call)."""
    ids, mask, row_of = _distinct_prompts(prompt_ids, prompt_mask)  # (P, Lp) x 2, (N,)
    if ids.shape[0] == prompt_ids.shape[0] and not always:  # no prompt repeated: the padded forward costs no more
        return None
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # (P, Lp)
    out = decoder(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
    cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
    cache.batch_select_indices(row_of)  # each layer's K, V: (P, ...) -> (N, ...), indexed (gradient summed back)
    last = out.last_hidden_state[:, -1][row_of]  # (N, H): a left-padded prompt's last position is real
    attention = torch.cat([prompt_mask, completion_mask], dim=1)  # (N, Lp + Lc)
    Lc = completion_ids.shape[1]
    after = prompt_mask.sum(-1, keepdim=True) + torch.arange(Lc, device=prompt_ids.device)  # (N, Lc) positions
    rest = decoder(
        input_ids=completion_ids, attention_mask=attention, position_ids=after, use_cache=True,
        **{_cache_keyword(decoder): cache},
    ).last_hidden_state  # (N, Lc, H)  # fmt: skip
    return torch.cat([last[:, None], rest[:, :-1]], dim=1)  # (N, Lc, H): position t predicts token t


def _layerwise(decoder, prompt_ids, prompt_mask, completion_ids, completion_mask, *, checkpointed, always=False):
    """_states' numbers from the model's modules (grpokit.model.llama_layers), no KV cache: layer by layer the
    prompts (P, Lp, H) and the completions (N, Lc, H) go on together, the completions' attention reading their
    prompt's keys and values indexed out to the rows; ``checkpointed``: each layer in one checkpointed region."""
    ids, mask, row_of = _distinct_prompts(prompt_ids, prompt_mask)  # (P, Lp) x 2, (N,)
    if ids.shape[0] == prompt_ids.shape[0] and not always:
        return None
    Lp, (N, Lc) = ids.shape[1], completion_ids.shape
    device = ids.device
    h_p, h_c = decoder.embed_tokens(ids), decoder.embed_tokens(completion_ids)  # (P, Lp, H), (N, Lc, H)
    rope_p = decoder.rotary_emb(h_p, (mask.cumsum(-1) - 1).clamp(min=0))  # cos, sin (P, Lp, d)
    after = prompt_mask.sum(-1, keepdim=True) + torch.arange(Lc, device=device)  # (N, Lc) positions
    rope_c = decoder.rotary_emb(h_c, after)  # cos, sin (N, Lc, d)
    lower = lambda n: torch.ones((n, n), dtype=torch.bool, device=device).tril()  # noqa: E731
    eye = lambda n: torch.eye(n, dtype=torch.bool, device=device)  # noqa: E731
    # additive masks: a prompt query sees the real keys up to it (a padding query itself, so no row is empty); a
    # completion query its prompt's real keys and its own real keys up to it
    seen_p = (lower(Lp)[None] & mask.bool()[:, None, :]) | eye(Lp)[None]  # (P, Lp, Lp)
    own = (lower(Lc)[None] & completion_mask.bool()[:, None, :]) | eye(Lc)[None]  # (N, Lc, Lc)
    seen_c = torch.cat([prompt_mask.bool()[:, None, :].expand(N, Lc, Lp), own], dim=-1)  # (N, Lc, Lp + Lc)
    minimum = torch.finfo(h_p.dtype).min
    masks = tuple(
        torch.zeros(seen.shape, dtype=h_p.dtype, device=device).masked_fill(~seen, minimum)[:, None]
        for seen in (seen_p, seen_c)
    )  # (P, 1, Lp, Lp), (N, 1, Lc, Lp + Lc)
    shape = head_shape(decoder)
    for layer in decoder.layers:
        args = (layer, h_p, h_c, rope_p, rope_c, masks, row_of, shape)
        h_p, h_c = checkpoint(_layer, *args, use_reentrant=False) if checkpointed else _layer(*args)
    h_p, h_c = decoder.norm(h_p), decoder.norm(h_c)
    return torch.cat([h_p[:, -1][row_of][:, None], h_c[:, :-1]], dim=1)  # (N, Lc, H)


def _layer(layer, h_p, h_c, rope_p, rope_c, masks, row_of, shape):
    """One decoder layer on the prompts h_p (P, Lp, H) and the completions h_c (N, Lc, H) (_layerwise)."""
    attn, (h, kvh, d) = layer.self_attn, shape
    scale = getattr(attn, "scaling", d**-0.5)
    q, k, v = project_qkv(attn, layer.input_layernorm(h_p), *rope_p, shape)  # (P, h|kvh, Lp, d)
    qc, kc, vc = project_qkv(attn, layer.input_layernorm(h_c), *rope_c, shape)  # (N, h|kvh, Lc, d)
    keys, values = torch.cat([k[row_of], kc], dim=2), torch.cat([v[row_of], vc], dim=2)  # (N, kvh, Lp + Lc, d)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    wide = lambda x: x.repeat_interleave(h // kvh, dim=1)  # noqa: E731  (B, h, T, d): grouped-query heads
    out_p = sdpa(q, wide(k), wide(v), attn_mask=masks[0], scale=scale)  # (P, h, Lp, d)
    out_c = sdpa(qc, wide(keys), wide(values), attn_mask=masks[1], scale=scale)  # (N, h, Lc, d)
    h_p = h_p + attn.o_proj(out_p.transpose(1, 2).reshape(*h_p.shape[:2], h * d))
    h_c = h_c + attn.o_proj(out_c.transpose(1, 2).reshape(*h_c.shape[:2], h * d))
    h_p = h_p + layer.mlp(layer.post_attention_layernorm(h_p))
    return h_p, h_c + layer.mlp(layer.post_attention_layernorm(h_c))


def _cache_keyword(decoder) -> str:
    """The forward's name for a KV cache: ``cache`` (transformers >= 5.2x) or ``past_key_values`` (before)."""
    return _cache_keyword_of(type(decoder))


@functools.cache
def _cache_keyword_of(cls: type) -> str:
    """_cache_keyword per decoder class: the signature read once, not at every forward."""
    return "cache" if "cache" in inspect.signature(cls.forward).parameters else "past_key_values"


def _checkpointing(decoder) -> bool:
    """A training forward with gradients under gradient checkpointing: transformers' checkpointed layers drop the
    KV cache there."""
    if not (decoder.training and torch.is_grad_enabled()):
        return False
    return any(getattr(m, "gradient_checkpointing", False) for m in decoder.modules())


@torch.no_grad()
def usable(decoder, padded_states, kind: str = "cache") -> bool:
    """Whether ``decoder`` (a transformers base decoder) scores a shared prefix as its padded forward does, by
    ``kind`` of forward: "cache" (_states) or "layerwise" (_layerwise). Checked once per decoder and kind on a small
    batch (two prompts of 3 and 1 tokens, two completions each) in eval mode: for "cache" its cache must be
    transformers' plain dynamic one (every layer a DynamicLayer, with batch_select_indices: no sliding window, no
    other kind of layer); for "layerwise" a Llama-family layout (llama_layers.llama_family_support) without attention
    dropout; and the outputs those of ``padded_states`` (the padded forward) within a relative error (their
    difference's norm over theirs) of 1e-3 in float32, 5e-2 in a lower precision."""
    known = _USABLE.setdefault(decoder, {})
    if kind not in known:
        was = decoder.training
        decoder.eval()
        try:
            known[kind] = _agrees(decoder, padded_states, kind)
        finally:
            decoder.train(was)
    return known[kind]


def _agrees(decoder, padded_states, kind: str) -> bool:
    if kind == "layerwise":
        if llama_family_support(decoder) is not None or getattr(decoder.config, "attention_dropout", 0.0):
            return False
    elif not _plain_cache(decoder):
        return False
    device = next(decoder.parameters()).device
    vocab = decoder.get_input_embeddings().weight.shape[0]
    token = lambda *xs: [x % vocab for x in xs]  # noqa: E731
    a, b = [0] + token(3, 4, 5), [0, 0, 0] + token(6)  # two prompts, left-padded to 4
    prompt_ids = torch.tensor([a, a, b, b], device=device)  # (4, 4)
    prompt_mask = torch.tensor([[0, 1, 1, 1]] * 2 + [[0, 0, 0, 1]] * 2, device=device)
    completion_ids = torch.tensor([token(7, 8, 9), token(10, 0, 0), token(11, 12, 0), token(13, 14, 15)], device=device)
    completion_mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 1]], device=device)
    args = (prompt_ids, prompt_mask, completion_ids, completion_mask)
    if kind == "layerwise":
        shared = _layerwise(decoder, *args, checkpointed=False, always=True)  # (4, 3, H)
    else:
        shared = _states(decoder, *args, always=True)  # (4, 3, H)
    padded = padded_states(decoder, *args, None)  # (4, 3, H)
    real = completion_mask.bool()
    want = padded[real].float()  # (K, H)
    error = (shared[real].float() - want).norm() / want.norm().clamp(min=1e-12)
    # float32 agrees to rounding; bfloat16/float16 drift over the layers, so the whole tensor's relative error is
    # what is bounded (a forward that does not apply errs by tens of percent)
    return bool(error <= (1e-3 if want.dtype == padded.dtype else 5e-2))


def _plain_cache(decoder) -> bool:
    """Whether ``decoder``'s KV cache is transformers' plain dynamic one (every layer a DynamicLayer)."""
    try:
        from transformers.cache_utils import DynamicLayer
    except ImportError:  # a transformers without per-layer caches
        return False
    device = next(decoder.parameters()).device
    probe = decoder(input_ids=torch.ones((1, 2), dtype=torch.long, device=device), use_cache=True)
    cache = getattr(probe, "cache", None) or getattr(probe, "past_key_values", None)
    layers = getattr(cache, "layers", None)
    return bool(layers) and hasattr(cache, "batch_select_indices") and all(type(x) is DynamicLayer for x in layers)
