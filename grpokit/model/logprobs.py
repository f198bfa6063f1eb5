"""Memory-lean per-token log-probs of completions under a causal LM (policy, old policy, reference).

The full-vocabulary logits are the largest activation of a GRPO step (N * L * V values; see
ALGORITHMS.md sec. 9). :func:`completion_logprobs` never builds them: it runs the base decoder to get
hidden states, keeps only the completion positions whose mask is 1, and projects them through the LM
head a chunk of ``chunk_size`` tokens at a time. Each chunk's fp32 logits live only inside a
``torch.utils.checkpoint`` region, so the backward pass recomputes one chunk at a time instead of
holding every chunk's logits. The log-softmax and entropy of a chunk are grpokit.algos.entropy's (the
one implementation of both). With ``packed=True`` the decoder runs padding-free: the rows' real tokens in
one row, positions restarting at each (grpokit.data.packing), so a micro-batch costs its real tokens
rather than rows x its longest row; ``scoring_states`` is that forward for the critic's values too.

Shapes: N rows, Lp prompt positions (left-padded), Lc completion positions (right-padded), H hidden
size, V vocabulary, T the sampling temperature.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from grpokit.algos.entropy import entropy_from_logits, entropy_with_grad, selective_log_softmax
from grpokit.data.packing import pack_masked, pack_sequences
from grpokit.model.fused_logprobs import fused_chunk_logprobs
from grpokit.model.shared_prefix import prefix_states


def base_model(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers ``*ForCausalLM`` inside a PEFT wrapper (LoRA layers are injected in place, so
    calling its submodules still runs, or under ``disable_adapter()`` skips, the adapters)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _final_logit_softcap(config) -> float | None:
    """Gemma-2 style ``cap * tanh(logits / cap)`` applied by the model after the LM head, if any."""
    cap = getattr(config, "final_logit_softcapping", None)
    for name in ("logit_scale", "logits_scaling"):  # Cohere multiplies, Granite divides: not handled
        value = getattr(config, name, None)
        if value is not None and value != 1:
            raise NotImplementedError(
                f"{type(config).__name__}.{name}={value} rescales the logits after the LM head; "
                "completion_logprobs does not apply that yet"
            )
    return float(cap) if cap else None


HELPER_ROWS = 128
"""Rows of an LM-head chunk's logits the log-softmax and entropy helpers take at a time: their temporaries are
(HELPER_ROWS, V) blocks, small beside the chunk's own (logprob_chunk_size, V) logits."""


def _chunk_logprobs(
    lm_head: torch.nn.Module,
    hidden: Tensor,
    targets: Tensor,
    temperature: float,
    softcap: float | None,
    with_entropy: bool,
    entropy_grad: bool = False,
    with_top1: bool = False,
    fused: bool | str = False,
) -> tuple[Tensor, ...]:
    """log_softmax(head(hidden) / T) at ``targets``, and entropy: without gradient, or with ``entropy_grad`` with it
    (grpokit.algos.entropy.entropy_with_grad). hidden: (C, H); targets: (C,). ``with_top1`` adds a third output,
    (C,) bool: the target is the argmax of the logits (SFT's token accuracy). ``fused`` (optim.fused_logprobs):
    the log-probs and the entropy from grpokit.model.fused_logprobs (True: compiled; "eager": its formulas run
    eagerly, for tests), where no softcap, entropy gradient or top-1 is asked for.

    Memory: the chunk's (C, V) float32 logits, and in the backward their gradient beside them; the helpers'
    temporaries are HELPER_ROWS rows of V at a time (at T = 1 the logits are not divided, which would be a
    second (C, V) block)."""
    if fused and softcap is None and not entropy_grad and not with_top1:
        logprobs, entropy = fused_chunk_logprobs(lm_head(hidden), targets, temperature, compiled=fused != "eager")
        return logprobs, (entropy if with_entropy else logprobs.new_zeros(()))  # (C,) each
    logits = lm_head(hidden).float()  # (C, V), upcast per chunk only
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    if temperature != 1.0:
        logits = logits / temperature  # (C, V)
    rows = min(max(1, logits.shape[0]), HELPER_ROWS)
    logprobs = selective_log_softmax(logits, targets, chunk_size=rows)  # (C,)
    top1 = (logits.detach().argmax(-1) == targets,) if with_top1 else ()  # (C,) bool
    if entropy_grad:  # the entropy bonus: its gradient flows back through this chunk's logits (recomputed)
        return logprobs, entropy_with_grad(logits), *top1  # (C,)
    if not with_entropy:
        return logprobs, logprobs.new_zeros(()), *top1
    return logprobs, entropy_from_logits(logits.detach(), chunk_size=rows), *top1  # (C,) no gradient


def completion_logprobs(
    model: torch.nn.Module,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    completion_ids: Tensor,
    completion_mask: Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    with_entropy: bool = False,
    context_mask: Tensor | None = None,
    packed: bool = False,
    entropy_grad: bool = False,
    shared_prefix: bool = False,
    fused: bool | str = False,
) -> tuple[Tensor, Tensor | None]:
    """Per-token log-probs ``log softmax(logits / T)[o_t]`` of the completion tokens, and optionally entropy.

    logprobs[i, t] = log pi(o_{i,t} | q_i, o_{i,<t}) with pi = softmax(z / T), z the model's logits
    (after its final logit softcapping, if any). Divide by the sampling temperature, or the PPO ratio
    is biased (ALGORITHMS.md sec. 6).

    Args:
        prompt_ids, prompt_mask: (N, Lp), left-padded; mask 1 = real token.
        completion_ids, completion_mask: (N, Lc), right-padded; mask 1 up to and including the EOS.
        temperature: the sampling temperature T; 0 (greedy rollouts) means T = 1, as in grpokit.rollout.generation.
        chunk_size: completion tokens per LM-head chunk; peak logits memory is chunk_size * V fp32.
        with_entropy: also return the entropy of softmax(z / T) per token, computed without gradient.
        entropy_grad: return that entropy with its gradient instead (the entropy bonus, algo.entropy_coef); it is
            formed in the same checkpointed LM-head chunk as the log-probs, so its backward recomputes one chunk's
            logits at a time too. False (the default) runs exactly the code and memory of before.
        context_mask: (N, Lc) multi-turn rollouts: 1 for every real completion-side token (the model's and
            the tools'), all attended to; completion_mask then picks the model's tokens that are scored.
            None: completion_mask is both (grpokit.rollout.generation.Rollout.context_mask).
        packed: run the decoder padding-free: the rows' real tokens in one row, positions restarting at
            each (grpokit.data.packing.pack_masked), so the micro-batch costs its real tokens, not rows x
            the longest. The same values as padded up to float rounding; needs a model whose attention
            reads packed position_ids (check_packed_attention).
        shared_prefix: run each distinct prompt through the decoder once and its completions on its KV cache
            (grpokit.model.shared_prefix; optim.shared_prefix): the same values up to float rounding, for fewer
            tokens; where it does not apply (multi-turn, packed, no prompt repeated, a model it does not suit,
            gradient checkpointing in a training forward) the padded forward runs.
        fused: each LM-head chunk's log-softmax and entropy in fused kernels (grpokit.model.fused_logprobs;
            optim.fused_logprobs): the same values up to float rounding; True compiles, "eager" runs its formulas.

    Returns:
        logprobs: (N, Lc) float32, 0 where completion_mask is 0; differentiable w.r.t. the model.
        entropy: (N, Lc) float32 (0 at padding) or None; differentiable with entropy_grad.

    Positions come from the cumulative attention mask, so left padding does not shift them; completion
    padding is masked out of attention (it lies after every real token, so this changes nothing real).
    The hidden state at position p predicts token p + 1: completion token t is scored from position
    Lp - 1 + t. Works under ``torch.no_grad()`` (old / reference log-probs), with gradient checkpointing
    on the model, and with PEFT-wrapped models (the decoder and LM head are called directly; under DDP,
    unwrap first and mind that the DDP forward hooks are bypassed).
    """
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy, scored at T = 1), got {temperature}")
    temperature = temperature if temperature > 0 else 1.0
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    base = base_model(model)
    decoder = base.get_decoder()
    lm_head = base.get_output_embeddings()
    softcap = _final_logit_softcap(base.config)

    keep = completion_mask.reshape(-1).bool()  # (N*Lc,)
    hidden = scoring_states(
        decoder, prompt_ids, prompt_mask, completion_ids, completion_mask, context_mask, packed=packed,
        shared_prefix=shared_prefix,
    )  # (K, H) only real completion tokens  # fmt: skip
    targets = completion_ids.reshape(-1)[keep]  # (K,)
    lp_chunks, ent_chunks = _chunked(
        lm_head, hidden, targets, temperature, softcap, with_entropy, chunk_size, entropy_grad, fused=fused
    )

    N, Lc = completion_ids.shape
    flat = hidden.new_zeros(N * Lc, dtype=torch.float32)  # (N*Lc,)
    if lp_chunks:
        flat = flat.masked_scatter(keep, torch.cat(lp_chunks))
    logprobs = flat.view(N, Lc)  # (N, Lc)
    entropy = None
    if entropy_grad:
        entropy = flat.new_zeros(N * Lc)  # (N*Lc,)
        if ent_chunks:
            entropy = entropy.masked_scatter(keep, torch.cat(ent_chunks))
        entropy = entropy.view(N, Lc)  # (N, Lc) with gradient
    elif with_entropy:
        entropy = torch.zeros(N * Lc, dtype=torch.float32, device=flat.device)
        if ent_chunks:
            entropy[keep] = torch.cat(ent_chunks).detach()
        entropy = entropy.view(N, Lc)  # (N, Lc)
    return logprobs, entropy


def scoring_states(
    decoder,
    prompt_ids,
    prompt_mask,
    completion_ids,
    completion_mask,
    context_mask=None,
    *,
    packed: bool = False,
    shared_prefix: bool = False,
) -> Tensor:
    """(K, out) the outputs of ``decoder`` (a base decoder: hidden states; or a token classifier: its
    logits, the critic's values) at the positions predicting the K completion tokens where
    ``completion_mask`` is 1, in row-major order. Inputs as completion_logprobs'; ``packed``: one
    padding-free forward instead of the padded (N, Lp + Lc) batch; ``shared_prefix``: each distinct prompt once
    (grpokit.model.shared_prefix) where that applies."""
    if packed:
        return _packed_states(decoder, prompt_ids, prompt_mask, completion_ids, completion_mask, context_mask)
    states = None
    if shared_prefix and context_mask is None:
        states = prefix_states(
            decoder, prompt_ids, prompt_mask, completion_ids, completion_mask, padded=_padded_states
        )  # or None
    if states is None:
        states = _padded_states(decoder, prompt_ids, prompt_mask, completion_ids, completion_mask, context_mask)
    return states.reshape(-1, states.shape[-1])[completion_mask.reshape(-1).bool()]  # (K, out)


def _padded_states(decoder, prompt_ids, prompt_mask, completion_ids, completion_mask, context_mask) -> Tensor:
    """(N, Lc, out) the outputs of ``decoder`` at the positions that predict each completion token, on the
    padded (N, Lp + Lc) batch."""
    Lp = prompt_ids.shape[1]
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)  # (N, Lp + Lc)
    attended = completion_mask if context_mask is None else context_mask  # (N, Lc)
    attention_mask = torch.cat([prompt_mask, attended], dim=1).long()  # (N, Lp + Lc)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # (N, Lp + Lc)
    out = decoder(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
    states = out.last_hidden_state if hasattr(out, "last_hidden_state") else out.logits  # (N, Lp + Lc, out)
    return states[:, Lp - 1 : -1]  # (N, Lc, out): position Lp-1+t predicts completion token t


def _packed_states(
    decoder, prompt_ids, prompt_mask, completion_ids, completion_mask, context_mask
) -> Tensor:
    """(K, out) the outputs of ``decoder`` at the positions predicting the K completion tokens where
    ``completion_mask`` is 1 (row-major order), from one padding-free forward of the rows' real tokens
    (grpokit.data.packing.pack_masked). Token t is predicted by the token just before it in its row, which
    must itself be real (a prompt is left-padded, an attended completion a prefix): checked."""
    N, Lp = prompt_ids.shape
    ids = torch.cat([prompt_ids, completion_ids], dim=1)  # (N, Lp + Lc)
    attended = completion_mask if context_mask is None else context_mask  # (N, Lc)
    real = torch.cat([prompt_mask, attended], dim=1)  # (N, Lp + Lc)
    input_ids, position_ids, where = pack_masked(ids, real)  # (1, T), (1, T), (N, Lp + Lc)
    before = where[:, Lp - 1 : -1][completion_mask.bool()]  # (K,) packed index of each predicting token
    if bool((before < 0).any()):
        raise ValueError(
            "a scored completion token follows a masked-out one (a gap inside a row): packing needs each row's "
            "real tokens contiguous; score such rows padded (optim.packing=false)"
        )
    out = decoder(input_ids=input_ids, position_ids=position_ids, use_cache=False)
    states = out.last_hidden_state if hasattr(out, "last_hidden_state") else out.logits  # (1, T, out)
    return states[0, before]  # (K, out)


def attention_implementation(model: torch.nn.Module) -> str:
    """The attention implementation transformers runs ``model`` with (its config's, e.g. "sdpa", "eager",
    "flash_attention_2"; model.attn_implementation sets it)."""
    return getattr(base_model(model).config, "_attn_implementation", None) or "eager"


@torch.no_grad()
def check_packed_attention(model: torch.nn.Module, device: torch.device) -> bool:
    """Whether ``model``'s attention keeps packed rows apart: two short rows scored packed (no attention
    mask, position_ids restarting) give the log-probs they give one by one (SFT's and the RL passes'
    packing rely on it; a model that ignores packed position_ids would let rows attend to each other).

    In transformers 5, with no mask, no cache and position_ids that restart, sdpa, eager and flex_attention
    get a block-causal mask from the restarts (masking_utils.find_packed_sequence_indices) and the
    flash_attention_2/3/4 kernels run varlen on cu_seqlens made from them; an implementation outside
    transformers' mask table gets no mask at all. A paged one (``paged|eager``...) is False without a
    forward: it masks only through its paged generation cache."""
    if "paged" in attention_implementation(model):
        return False
    vocab = model.get_input_embeddings().weight.shape[0]
    a = (torch.arange(3, 9, device=device) % vocab)[None]  # (1, 6)
    b = (torch.arange(9, 13, device=device) % vocab)[None]  # (1, 4)
    ma, mb = torch.ones_like(a), torch.ones_like(b)
    ma[:, 0] = mb[:, 0] = 0
    was = model.training
    model.eval()
    apart = torch.cat([token_logprobs(model, a, ma), token_logprobs(model, b, mb)])
    input_ids, positions = pack_sequences([a[0], b[0]])
    packed = token_logprobs(model, input_ids.to(device), torch.cat([ma, mb], 1), position_ids=positions.to(device))
    model.train(was)
    return bool(torch.allclose(packed.float(), apart.float(), atol=1e-2, rtol=1e-2))


def _chunked(
    lm_head,
    hidden: Tensor,
    targets: Tensor,
    temperature: float,
    softcap,
    with_entropy: bool,
    chunk_size: int,
    entropy_grad: bool = False,
    with_top1: bool = False,
    fused: bool | str = False,
) -> tuple[list[Tensor], ...]:
    """_chunk_logprobs over ``chunk_size`` rows of hidden (K, H) / targets (K,) at a time, each chunk's
    logits recomputed in the backward pass (checkpointed) when gradients are on. Returns the chunks' log-probs and
    entropies, and with ``with_top1`` a third list, their top-1 hits."""
    use_checkpoint = torch.is_grad_enabled()
    chunks: tuple[list[Tensor], ...] = ([], [], []) if with_top1 else ([], [])
    for start in range(0, hidden.shape[0], chunk_size):
        args = (
            lm_head,
            hidden[start : start + chunk_size],
            targets[start : start + chunk_size],
            temperature,
            softcap,
            with_entropy,
            entropy_grad,
            with_top1,
            fused,
        )
        if use_checkpoint:
            outputs = checkpoint(_chunk_logprobs, *args, use_reentrant=False)
        else:
            outputs = _chunk_logprobs(*args)
        for into, value in zip(chunks, outputs, strict=True):
            into.append(value)
    return chunks


def token_logprobs(
    model: torch.nn.Module,
    input_ids: Tensor,
    loss_mask: Tensor,
    *,
    attention_mask: Tensor | None = None,
    position_ids: Tensor | None = None,
    chunk_size: int = 1024,
    with_stats: bool = False,
) -> Tensor | tuple[Tensor, Tensor, Tensor]:
    """(K,) log p(x_t | x_<t) of the K tokens where ``loss_mask`` is 1, in row-major order (SFT).

    ``with_stats``: also (K,) bool, x_t is the argmax of the logits (top-1), and (K,) the entropy of
    softmax(logits) there, both without gradient (TRL SFTTrainer's mean_token_accuracy and entropy).

    input_ids, loss_mask: (N, L); loss_mask[:, 0] must be 0 (nothing predicts a row's first token).
    Padded rows: attention_mask (N, L), right padding, positions from its cumulative sum. Packed rows
    (padding-free): attention_mask None and position_ids (N, L) restarting at 0 at each example, from
    which transformers' attention keeps every token inside its own example; the mask must then be 0 at
    each example's first token, whose hidden state comes from the previous example. Only the K trained
    positions reach the LM head, ``chunk_size`` at a time (no full-vocabulary logits), as in
    completion_logprobs."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if bool(loss_mask[:, :1].any()):
        raise ValueError("loss_mask[:, 0] must be 0: a row's first token has nothing to be predicted from")
    base = base_model(model)
    if position_ids is None:
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # (N, L)
    hidden = base.get_decoder()(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
    ).last_hidden_state  # (N, L, H)
    keep = loss_mask[:, 1:].bool()  # (N, L-1): token t+1 is predicted from position t
    selected = hidden[:, :-1][keep]  # (K, H)
    targets = input_ids[:, 1:][keep]  # (K,)
    softcap = _final_logit_softcap(base.config)
    chunks = _chunked(
        base.get_output_embeddings(), selected, targets, 1.0, softcap, with_stats, chunk_size, with_top1=with_stats
    )
    empty = hidden.new_zeros(0, dtype=torch.float32)
    logprobs = torch.cat(chunks[0]) if chunks[0] else empty  # (K,)
    if not with_stats:
        return logprobs
    top1 = torch.cat(chunks[2]) if chunks[2] else empty.bool()  # (K,)
    entropy = torch.cat(chunks[1]).detach() if chunks[1] else empty  # (K,)
    return logprobs, top1, entropy
