"""Memory-lean per-token log-probs of completions under a causal LM (policy, old policy, reference).

The full-vocabulary logits are the largest activation of a GRPO step (N * L * V values; see
ALGORITHMS.md sec. 9). :func:`completion_logprobs` never builds them: it runs the base decoder to get
hidden states, keeps only the completion positions whose mask is 1, and projects them through the LM
head a chunk of ``chunk_size`` tokens at a time. Each chunk's fp32 logits live only inside a
``torch.utils.checkpoint`` region, so the backward pass recomputes one chunk at a time instead of
holding every chunk's logits.

Shapes: N rows, Lp prompt positions (left-padded), Lc completion positions (right-padded), H hidden
size, V vocabulary, T the sampling temperature.
"""

from __future__ import annotations

import contextlib

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint


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


def _chunk_logprobs(
    lm_head: torch.nn.Module,
    hidden: Tensor,
    targets: Tensor,
    temperature: float,
    softcap: float | None,
    with_entropy: bool,
) -> tuple[Tensor, Tensor]:
    """log_softmax(head(hidden) / T) at ``targets``, and (no-grad) entropy. hidden: (C, H); targets: (C,)."""
    logits = lm_head(hidden).float()  # (C, V), upcast per chunk only
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    logits = logits / temperature  # (C, V)
    lse = logits.logsumexp(-1)  # (C,)
    logprobs = logits.gather(-1, targets[:, None]).squeeze(-1) - lse  # (C,)
    if not with_entropy:
        return logprobs, logprobs.new_zeros(())
    with torch.no_grad():
        probs = (logits - lse[:, None]).exp()  # (C, V)
        entropy = lse - (probs * logits).sum(-1)  # (C,) H = lse - E_p[z]
    return logprobs, entropy


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
) -> tuple[Tensor, Tensor | None]:
    """Per-token log-probs ``log softmax(logits / T)[o_t]`` of the completion tokens, and optionally entropy.

    logprobs[i, t] = log pi(o_{i,t} | q_i, o_{i,<t}) with pi = softmax(z / T), z the model's logits
    (after its final logit softcapping, if any). Divide by the sampling temperature, or the PPO ratio
    is biased (ALGORITHMS.md sec. 6).

    Args:
        prompt_ids, prompt_mask: (N, Lp), left-padded; mask 1 = real token.
        completion_ids, completion_mask: (N, Lc), right-padded; mask 1 up to and including the EOS.
        temperature: the sampling temperature T; 0 (greedy rollouts) means T = 1, as in grpokit.generation.
        chunk_size: completion tokens per LM-head chunk; peak logits memory is chunk_size * V fp32.
        with_entropy: also return the entropy of softmax(z / T) per token, computed without gradient.

    Returns:
        logprobs: (N, Lc) float32, 0 where completion_mask is 0; differentiable w.r.t. the model.
        entropy: (N, Lc) float32 (0 at padding) or None.

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

    Lp = prompt_ids.shape[1]
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)  # (N, Lp + Lc)
    attention_mask = torch.cat([prompt_mask, completion_mask], dim=1).long()  # (N, Lp + Lc)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # (N, Lp + Lc)
    hidden = decoder(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=False,
    ).last_hidden_state  # (N, Lp + Lc, H)
    hidden = hidden[:, Lp - 1 : -1]  # (N, Lc, H): position Lp-1+t predicts completion token t

    keep = completion_mask.reshape(-1).bool()  # (N*Lc,)
    hidden = hidden.reshape(-1, hidden.shape[-1])[keep]  # (K, H) only real completion tokens
    targets = completion_ids.reshape(-1)[keep]  # (K,)

    use_checkpoint = torch.is_grad_enabled()
    lp_chunks, ent_chunks = [], []
    for start in range(0, hidden.shape[0], chunk_size):
        args = (
            lm_head,
            hidden[start : start + chunk_size],
            targets[start : start + chunk_size],
            temperature,
            softcap,
            with_entropy,
        )
        if use_checkpoint:
            lp, ent = checkpoint(_chunk_logprobs, *args, use_reentrant=False)
        else:
            lp, ent = _chunk_logprobs(*args)
        lp_chunks.append(lp)
        ent_chunks.append(ent)

    N, Lc = completion_ids.shape
    flat = hidden.new_zeros(N * Lc, dtype=torch.float32)  # (N*Lc,)
    if lp_chunks:
        flat = flat.masked_scatter(keep, torch.cat(lp_chunks))
    logprobs = flat.view(N, Lc)  # (N, Lc)
    entropy = None
    if with_entropy:
        entropy = torch.zeros(N * Lc, dtype=torch.float32, device=flat.device)
        if ent_chunks:
            entropy[keep] = torch.cat(ent_chunks).detach()
        entropy = entropy.view(N, Lc)  # (N, Lc)
    return logprobs, entropy


@torch.no_grad()
def reference_logprobs(
    model: torch.nn.Module,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    completion_ids: Tensor,
    completion_mask: Tensor,
    *,
    ref_model: torch.nn.Module | None = None,
    temperature: float = 1.0,
    chunk_size: int = 1024,
) -> Tensor:
    """(N, Lc) log-probs under the frozen reference, without gradient.

    With ``ref_model`` given, that model is used. Otherwise ``model`` must be a PEFT model and the
    reference is its base with the adapter switched off (``model.disable_adapter()``): no second copy
    of the weights (ALGORITHMS.md sec. 9).
    """
    if ref_model is not None:
        ctx, scorer = contextlib.nullcontext(), ref_model
    elif hasattr(model, "disable_adapter"):
        ctx, scorer = model.disable_adapter(), model
    else:
        raise ValueError(
            "reference_logprobs needs a ref_model, or a PEFT model whose adapter can be disabled"
        )
    with ctx:
        logprobs, _ = completion_logprobs(
            scorer,
            prompt_ids,
            prompt_mask,
            completion_ids,
            completion_mask,
            temperature=temperature,
            chunk_size=chunk_size,
        )
    return logprobs
