"""A naive oracle of the distribution a rollout engine draws each token from (grpokit.rollout.generation's
convention, shared by the fast, hf and vllm engines): one token at a time, in float64, from a full forward
pass over the prompt and the completion.

    lp = processed_logprobs(model, rollout, temperature=0.8, min_p=0.1, repetition_penalty=1.3)  # (N, Lc)

For each completion token t: the model's raw logits at its position; the repetition penalty on every token
of the prompt's real tokens and of completion[:t] (logit / p if > 0 else logit * p); divided by the
temperature (greedy, T = 0: not, and no filter); top-k, top-p, then min-p (the tokens at least min_p times as likely
as the most likely one); the log-prob of t under the tokens kept, renormalised.
"""

from __future__ import annotations

import math

import torch


def raw_logits(model, rollout) -> torch.Tensor:
    """(N, Lc, V) float64: the model's logits that predict each completion token, one forward pass."""
    ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], 1)  # (N, L)
    mask = torch.cat([rollout.prompt_mask, rollout.attention_mask], 1)  # (N, L)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits.double()  # (N, L, V)
    Lp = rollout.prompt_ids.shape[1]
    return logits[:, Lp - 1 : -1]


def processed_distribution(
    logits: list[float],
    seen: set[int],
    *,
    temperature: float,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    repetition_penalty: float = 1.0,
) -> dict[int, float]:
    """{token: probability} of the tokens kept, from one position's raw ``logits`` (a list), by the rule above."""
    z = list(logits)
    for s in seen:
        z[s] = z[s] / repetition_penalty if z[s] > 0 else z[s] * repetition_penalty
    kept = list(range(len(z)))
    if temperature > 0:
        z = [v / temperature for v in z]
        if top_k:
            kth = sorted(z, reverse=True)[top_k - 1]
            kept = [i for i in kept if z[i] >= kth]
        if top_p < 1:  # the most likely tokens until their mass reaches top_p (of the tokens kept so far)
            top = max(z[i] for i in kept)
            total = sum(math.exp(z[i] - top) for i in kept)
            nucleus, mass = [], 0.0
            for i in sorted(kept, key=lambda i: -z[i]):
                if mass >= top_p:
                    break
                nucleus.append(i)
                mass += math.exp(z[i] - top) / total
            kept = nucleus
        if min_p > 0:  # p_i >= min_p * p_max, i.e. exp(z_i - z_max) >= min_p
            top = max(z[i] for i in kept)
            kept = [i for i in kept if math.exp(z[i] - top) >= min_p]
    top = max(z[i] for i in kept)
    total = sum(math.exp(z[i] - top) for i in kept)
    return {i: math.exp(z[i] - top) / total for i in kept}


def processed_logprobs(model, rollout, *, temperature: float, **sampling) -> torch.Tensor:
    """(N, Lc) float64: each sampled token's log-prob under the processed distribution (module docstring),
    0 at padding; -inf for a token the processing would never have kept."""
    logits = raw_logits(model, rollout)
    out = torch.zeros(rollout.completion_ids.shape, dtype=torch.float64)
    for r in range(rollout.completion_ids.shape[0]):
        prompt = rollout.prompt_ids[r][rollout.prompt_mask[r].bool()].tolist()
        completion = rollout.completion_ids[r][rollout.completion_mask[r].bool()].tolist()
        for t, token in enumerate(completion):
            probs = processed_distribution(
                logits[r, t].tolist(), set(prompt + completion[:t]), temperature=temperature, **sampling
            )
            out[r, t] = math.log(probs[token]) if token in probs else -math.inf
    return out
