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
against the padded forward), and not in a training forward under gradient checkpointing (transformers drops the
cache there). Elsewhere ``prefix_states`` returns None and the caller runs the padded forward. Written here because
transformers has no training forward that shares a prefix (its prefix sharing is for generation).
"""

from __future__ import annotations

import inspect
import weakref

import torch
from torch import Tensor

_USABLE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # decoder -> bool, ``usable``'s answer


def prefix_states(
    decoder, prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor, completion_mask: Tensor, *, padded
):
    """(N, Lc, H) the decoder's outputs at the positions predicting each completion token, as ``padded`` (the padded
    forward, grpokit.model.logprobs._padded_states, which ``usable`` compares with) gives them, each distinct prompt
    run once; None when this does not apply (module docstring). prompt_ids / prompt_mask (N, Lp) left-padded,
    completion_ids / completion_mask (N, Lc) right-padded."""
    if _checkpointing(decoder) or not usable(decoder, padded):
        return None
    return _states(decoder, prompt_ids, prompt_mask, completion_ids, completion_mask)


def _states(decoder, prompt_ids, prompt_mask, completion_ids, completion_mask, *, always: bool = False):
    N, Lp = prompt_ids.shape
    rows = torch.cat([prompt_ids, prompt_mask.to(prompt_ids.dtype)], dim=1)  # (N, 2 Lp)
    distinct, row_of = torch.unique(rows, dim=0, return_inverse=True)  # (P, 2 Lp), (N,) each row's prompt
    if distinct.shape[0] == N and not always:  # no prompt repeated: the padded forward costs no more
        return None
    ids, mask = distinct[:, :Lp], distinct[:, Lp:]  # (P, Lp) each
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


def _cache_keyword(decoder) -> str:
    """The forward's name for a KV cache: ``cache`` (transformers >= 5.2x) or ``past_key_values`` (before)."""
    return "cache" if "cache" in inspect.signature(type(decoder).forward).parameters else "past_key_values"


def _checkpointing(decoder) -> bool:
    """A training forward with gradients under gradient checkpointing: transformers' checkpointed layers drop the
    KV cache there."""
    if not (decoder.training and torch.is_grad_enabled()):
        return False
    return any(getattr(m, "gradient_checkpointing", False) for m in decoder.modules())


@torch.no_grad()
def usable(decoder, padded_states) -> bool:
    """Whether ``decoder`` (a transformers base decoder) scores a shared prefix as its padded forward does, checked
    once per decoder on a small batch (two prompts of 3 and 1 tokens, two completions each) in eval mode: its cache
    must be transformers' plain dynamic one (every layer a DynamicLayer, with batch_select_indices: no sliding
    window, no other kind of layer) and the outputs within 1e-2 of ``padded_states``' (the padded forward; 1e-2: low
    precision)."""
    known = _USABLE.get(decoder)
    if known is not None:
        return known
    was = decoder.training
    decoder.eval()
    try:
        ok = _agrees(decoder, padded_states)
    finally:
        decoder.train(was)
    _USABLE[decoder] = ok
    return ok


def _agrees(decoder, padded_states) -> bool:
    try:
        from transformers.cache_utils import DynamicLayer
    except ImportError:  # a transformers without per-layer caches
        return False
    device = next(decoder.parameters()).device
    vocab = decoder.get_input_embeddings().weight.shape[0]
    token = lambda *xs: [x % vocab for x in xs]  # noqa: E731
    a, b = [0] + token(3, 4, 5), [0, 0, 0] + token(6)  # two prompts, left-padded to 4
    prompt_ids = torch.tensor([a, a, b, b], device=device)  # (4, 4)
    prompt_mask = torch.tensor([[0, 1, 1, 1]] * 2 + [[0, 0, 0, 1]] * 2, device=device)
    completion_ids = torch.tensor([token(7, 8, 9), token(10, 0, 0), token(11, 12, 0), token(13, 14, 15)], device=device)
    completion_mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 1]], device=device)
    probe = decoder(input_ids=prompt_ids[:1], attention_mask=prompt_mask[:1], use_cache=True)
    cache = getattr(probe, "cache", None) or getattr(probe, "past_key_values", None)
    layers = getattr(cache, "layers", None)
    if not layers or not hasattr(cache, "batch_select_indices") or any(type(x) is not DynamicLayer for x in layers):
        return False
    args = (prompt_ids, prompt_mask, completion_ids, completion_mask)
    shared = _states(decoder, *args, always=True)  # (4, 3, H)
    padded = padded_states(decoder, *args, None)  # (4, 3, H)
    real = completion_mask.bool()
    return bool(torch.allclose(shared[real].float(), padded[real].float(), atol=1e-2, rtol=1e-2))
