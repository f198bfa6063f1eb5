"""Rollouts: sample ``group_size`` completions for each prompt and record their log-probs.

Two interchangeable generators return the same :class:`Rollout`:

- :class:`FastGenerator` (the default) runs its own sampling loop over a decode engine
  (:mod:`grpokit.rollout.decode`). Each prompt is prefilled once, then its KV cache is repeated
  ``group_size`` times, so a prompt's forward cost is paid once per group instead of once per
  sample. Rows that have emitted EOS are dropped from the batch once at least half of it has
  finished. On supported models (Llama family) decode runs over a static KV cache, replayed as CUDA
  graphs on a GPU.
- :class:`HFGenerator` wraps ``model.generate``; it is the slow, simple reference.

Conventions shared by both (and by ``grpokit.model.logprobs.completion_logprobs``):

- rows are prompt-major: rows ``[i*G:(i+1)*G]`` are prompt i's G samples;
- ``completion_mask`` is 1 for every generated token up to and INCLUDING the terminating EOS;
- ``logprobs`` are the sampled token's log-prob under the distribution it was drawn from: the behaviour
  policy, :func:`process_logits`' (transformers' order): the repetition penalty on the raw logits, the
  temperature, then top-k, top-p and min-p, renormalised over the tokens they keep. With none of them on
  that is ``log_softmax(logits / T)``, the quantity the trainer recomputes for its policy. With any on, the
  trainer's log-probs (the raw model's at T) differ from the sampler's by design, and the sampler/trainer
  metrics (``sampler_logprob_diff/*``, ``sampler_kl``) and the importance-sampling correction
  (``rollout.mismatch_correction``) see that gap, as they see a kernel mismatch: the samples come from the
  processed distribution, not from the policy being trained. vLLM returns the same (its
  ``processed_logprobs``). With ``temperature == 0`` (greedy) they are ``log_softmax`` of the (penalised)
  logits of the argmax token, at T = 1; the filters do not apply.
- ``ignore_eos=True`` (``rollout.ignore_eos``): an EOS drawn is an ordinary token and ends nothing, so
  every completion has exactly ``max_new_tokens`` tokens and is flagged ``truncated`` (benchmarks).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, fields
from typing import Protocol

import torch
from torch import Tensor

from grpokit.rollout.decode import check_kv_cache, make_engine


@dataclass
class Rollout:
    """G sampled completions for each of P prompts; N = P * G rows, prompt-major.

    Every generator returns it on the CPU (``to_host``): scoring, advantages and the update's bookkeeping
    index it with CPU tensors, and the update moves one micro-batch at a time to the model's device
    (grpokit.train.update.micro_tensors)."""

    prompt_ids: Tensor  # (N, Lp) long, left-padded with pad_token_id
    prompt_mask: Tensor  # (N, Lp) long, 1 = real prompt token
    completion_ids: Tensor  # (N, Lc) long, right-padded with pad_token_id
    completion_mask: Tensor  # (N, Lc) long, 1 for generated tokens up to and including the EOS
    logprobs: Tensor  # (N, Lc) float32, the sampled token's log-prob as drawn (module docstring), 0 at padding
    truncated: Tensor  # (N,) bool, True when no EOS was produced within max_new_tokens
    context_mask: Tensor | None = None
    """(N, Lc) long, multi-turn rollouts (grpokit.rollout.multiturn) only: 1 for every real token after the prompt,
    the model's and the tool/environment's, all attended to; completion_mask then marks the model's own
    tokens only (the ones that carry loss, KL and entropy). None: the same as completion_mask."""

    @property
    def attention_mask(self) -> Tensor:
        """(N, Lc) the completion-side tokens attended to: context_mask, or completion_mask when there is none."""
        return self.completion_mask if self.context_mask is None else self.context_mask

    @property
    def completion_lengths(self) -> Tensor:
        """(N,) number of generated tokens per row, EOS included."""
        return self.completion_mask.sum(-1)

    @property
    def row_lengths(self) -> Tensor:
        """(N,) real tokens per row: prompt plus completion (what a micro-batch of the row costs)."""
        return self.prompt_mask.sum(-1) + self.attention_mask.sum(-1)

    def to_host(self) -> Rollout:
        """The same rollout with every tensor on the CPU (one copy per field that is elsewhere)."""
        return Rollout(**{f.name: _on_cpu(getattr(self, f.name)) for f in fields(self)})

    def select(self, index: Tensor) -> Rollout:
        """The rows ``index`` (a (M,) long tensor) of every field."""
        return Rollout(**{f.name: _rows(getattr(self, f.name), index) for f in fields(self)})

    def completion_token_ids(self) -> list[list[int]]:
        """(N,) generated token ids of each row, EOS included, padding removed."""
        return [ids[mask.bool()].tolist() for ids, mask in zip(self.completion_ids, self.completion_mask)]

    def decode(self, tokenizer) -> list[str]:
        """(N,) completion texts (special tokens such as EOS skipped)."""
        return [tokenizer.decode(ids, skip_special_tokens=True) for ids in self.completion_token_ids()]


def _rows(t: Tensor | None, index: Tensor) -> Tensor | None:
    return None if t is None else t[index]


def _on_cpu(t: Tensor | None) -> Tensor | None:
    return None if t is None else t.cpu()


class Generator(Protocol):
    def generate(
        self,
        model: torch.nn.Module,
        prompt_ids: list[list[int]],
        *,
        group_size: int,
        max_new_tokens: int,
        temperature: float,
        top_p: float = 1.0,
        top_k: int = 0,
        min_p: float = 0.0,
        repetition_penalty: float = 1.0,
        eos_token_ids: list[int],
        pad_token_id: int,
        seed: int | None = None,
        ignore_eos: bool = False,
    ) -> Rollout: ...


def left_pad(prompt_ids: list[list[int]], pad_token_id: int, device=None) -> tuple[Tensor, Tensor]:
    """Left-pad token lists into ``(ids, mask)``, both (P, max_len) long; mask 1 = real token."""
    if not prompt_ids or any(len(p) == 0 for p in prompt_ids):
        raise ValueError("every prompt needs at least one token")
    width = max(len(p) for p in prompt_ids)
    ids = torch.full((len(prompt_ids), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(prompt_ids), width), dtype=torch.long)
    for i, p in enumerate(prompt_ids):
        ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p) :] = 1
    return ids.to(device), mask.to(device)


def completion_mask_from_ids(completion_ids: Tensor, eos_token_ids: list[int]) -> tuple[Tensor, Tensor]:
    """Mask up to and including the first EOS, and the truncated flags, of right-padded completions.

    >>> completion_mask_from_ids(torch.tensor([[5, 1, 0], [5, 6, 7]]), eos_token_ids=[1])
    (tensor([[1, 1, 0],
            [1, 1, 1]]), tensor([False,  True]))
    """
    is_eos = torch.isin(completion_ids, torch.tensor(eos_token_ids, device=completion_ids.device))  # (N, Lc)
    eos_before = is_eos.long().cumsum(-1) - is_eos.long()  # (N, Lc) EOS count strictly before t
    mask = (eos_before == 0).long()  # (N, Lc)
    truncated = ~is_eos.any(-1)  # (N,)
    return mask, truncated


def _validate(
    group_size: int,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    top_k: int,
    eos,
    min_p: float = 0.0,
    repetition_penalty: float = 1.0,
) -> None:
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 = off), got {top_k}")
    if not 0 <= min_p <= 1:
        raise ValueError(f"min_p must be in [0, 1] (0 = off), got {min_p}")
    if not repetition_penalty > 0:
        raise ValueError(f"repetition_penalty must be > 0 (1 = off), got {repetition_penalty}")
    if not eos:
        raise ValueError("eos_token_ids must name at least one token")


@contextlib.contextmanager
def _eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """Eval mode while sampling: no dropout, and HF layers drop the KV cache when gradient
    checkpointing is on in train mode."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def _model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def filter_logits(logits: Tensor, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0) -> Tensor:
    """Set logits outside the top-k, nucleus (top-p) and min-p sets to -inf, like transformers' warpers, in
    their order (k, then p, then min-p).

    The nucleus is the smallest set of most likely tokens whose probability reaches ``top_p``; min-p keeps the
    tokens whose probability is at least ``min_p`` times the most likely one's. The most likely token is always
    kept. logits: (B, V), already divided by the temperature.
    """
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # (B, V)
        probs = sorted_logits.softmax(-1)  # (B, V)
        mass_before = probs.cumsum(-1) - probs  # (B, V) mass of strictly more likely tokens
        drop_sorted = mass_before >= top_p  # (B, V); position 0 is never dropped
        drop = drop_sorted.scatter(-1, order, drop_sorted)  # (B, V) back in vocabulary order
        logits = logits.masked_fill(drop, float("-inf"))
    if min_p > 0.0:
        probs = logits.softmax(-1)  # (B, V)
        drop = probs < min_p * probs.amax(-1, keepdim=True)  # (B, V); the most likely token is never dropped
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def penalise_repeats(logits: Tensor, seen: Tensor, penalty: float) -> Tensor:
    """The repetition penalty (CTRL, arXiv 1909.05858; transformers' and vLLM's rule): the logit of every token
    already in the prompt or the completion so far becomes logit / penalty if > 0, else logit * penalty, so
    a penalty > 1 makes a repeat less likely. logits: (B, V) raw; seen: (B, V) bool.

    >>> penalise_repeats(torch.tensor([[2.0, 1.0, -1.0]]), torch.tensor([[True, False, True]]), 2.0)
    tensor([[ 1.,  1., -2.]])
    """
    penalised = torch.where(logits > 0, logits / penalty, logits * penalty)  # (B, V)
    return torch.where(seen, penalised, logits)


def process_logits(
    logits: Tensor,
    temperature: float,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    repetition_penalty: float = 1.0,
    seen: Tensor | None = None,
) -> Tensor:
    """The logits a token is drawn from (B, V) float32, in transformers' order: the repetition penalty over
    ``seen`` (B, V) bool on the raw logits, then the temperature, then :func:`filter_logits`. Greedy
    (``temperature == 0``): the penalised logits, no filter (argmax, log-probs at T = 1)."""
    logits = logits.float()  # (B, V)
    if repetition_penalty != 1.0 and seen is not None:
        logits = penalise_repeats(logits, seen, repetition_penalty)
    if temperature == 0:
        return logits
    scaled = logits / temperature if temperature != 1 else logits  # (B, V)
    return filter_logits(scaled, top_k, top_p, min_p)


def sample_tokens(
    logits: Tensor,
    temperature: float,
    top_k: int,
    top_p: float,
    noise: Tensor | None,
    *,
    min_p: float = 0.0,
    repetition_penalty: float = 1.0,
    seen: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Draw one token per row; return ``(tokens (B,), logprobs (B,))``.

    Sampling is the Gumbel-max trick: ``argmax(z + g)`` over the processed logits z (:func:`process_logits`),
    ``g = -log(E)``, E ~ Exp(1) given in ``noise`` (B, V); this draws exactly from softmax(z) and makes each
    row's draw depend on its own noise only (so dropping finished rows does not change the others).
    logprobs are ``log_softmax(z)`` at the drawn token: the distribution it was drawn from (module docstring).
    """
    z = process_logits(logits, temperature, top_k, top_p, min_p, repetition_penalty, seen)  # (B, V)
    tokens = z.argmax(-1) if temperature == 0 else (z - noise.log()).argmax(-1)  # (B,)
    # log softmax at the drawn token only: z_tok - logsumexp(z), no (B, V) log-prob tensor
    logprobs = z.gather(-1, tokens[:, None]).squeeze(-1) - z.logsumexp(-1)  # (B,)
    return tokens, logprobs


def seen_tokens(prompt_ids: Tensor, prompt_mask: Tensor, vocab: int) -> Tensor:
    """(P, vocab) bool: which tokens each prompt's real (unpadded) tokens hold, for the repetition penalty."""
    counts = torch.zeros((prompt_ids.shape[0], vocab), dtype=torch.long, device=prompt_ids.device)
    counts.scatter_add_(-1, prompt_ids, prompt_mask.long())  # (P, vocab)
    return counts > 0


def rollout_metrics(generator) -> dict[str, float]:
    """How the last rollout was decoded, as step metrics: ``rollout/cuda_graphs`` (1 when its decode
    steps replayed CUDA graphs), ``rollout/static_kv_cache`` (1 when it ran over the static KV cache) and
    ``rollout/weight_lag`` (steps the engine's copy of the weights was behind: vllm's sync_every, else 0)."""
    stats = getattr(generator, "stats", {})
    return {
        "rollout/cuda_graphs": float(bool(stats.get("cuda_graphs", False))),
        "rollout/static_kv_cache": float(stats.get("engine") == "static"),
        "rollout/weight_lag": float(stats.get("weight_lag", 0)),
    }


class FastGenerator:
    """Own sampling loop over a decode engine (:mod:`grpokit.rollout.decode`): one prefill per prompt, its KV
    cache repeated G times, finished rows dropped.

    kv_cache: ``auto`` (the static KV cache with CUDA graphs where the model supports it, else the
        model's dynamic cache), ``static`` (error if unsupported) or ``dynamic``.
    cuda_graphs: record and replay the static engine's decode steps on CUDA.
    compact: drop finished rows from the batch (and the KV cache) whenever at least half of the
        current batch has finished. Each drop copies the cache once; as the batch at least halves
        each time, the total copying is at most about one extra cache.
    check_every: look at which rows have finished (a device sync) every this many steps; 0 = 8 on CUDA,
        where skipping the sync lets the host queue steps ahead, else 1. Rows that finish in between
        generate padding until the next check. Each row's draws do not depend on the batch layout, so
        the rollout is the same for any value up to rounding: the batch size a row runs in can change
        which matmul kernel computes its logits (bit-identical in the CPU tests, not promised in bf16
        on a GPU).
    The engine (and the static engine's buffers and graphs) is kept for the next call on the same model.
    """

    def __init__(
        self, compact: bool = True, kv_cache: str = "auto", cuda_graphs: bool = True, check_every: int = 0
    ):
        check_kv_cache(kv_cache)
        if check_every < 0:
            raise ValueError(f"check_every must be >= 0 (0 = automatic), got {check_every}")
        self.compact = compact
        self.check_every = check_every
        self.kv_cache = kv_cache
        self.cuda_graphs = cuda_graphs
        self.engine = None
        self.stats: dict = {}  # of the last call: engine, decode_steps, compactions

    def engine_for(self, model: torch.nn.Module):
        """The decode engine for ``model``, built on first use and kept while the model stays the same."""
        if self.engine is None or self.engine.model is not model:
            self.engine = make_engine(model, self.kv_cache, cuda_graphs=self.cuda_graphs)
        return self.engine

    def release(self) -> bool:
        """Free the engine's device buffers (the static KV cache, CUDA graphs; rebuilt by the next call);
        True when any were held."""
        return self.engine is not None and bool(self.engine.release())

    @torch.no_grad()
    def generate(
        self,
        model: torch.nn.Module,
        prompt_ids: list[list[int]],
        *,
        group_size: int,
        max_new_tokens: int,
        temperature: float,
        top_p: float = 1.0,
        top_k: int = 0,
        min_p: float = 0.0,
        repetition_penalty: float = 1.0,
        eos_token_ids: list[int],
        pad_token_id: int,
        seed: int | None = None,
        ignore_eos: bool = False,
    ) -> Rollout:
        _validate(
            group_size, max_new_tokens, temperature, top_p, top_k, eos_token_ids, min_p, repetition_penalty
        )
        device = _model_device(model)
        G = group_size
        p_ids, p_mask = left_pad(prompt_ids, pad_token_id, device)  # (P, Lp)
        N = p_ids.shape[0] * G
        eos = torch.tensor(eos_token_ids, device=device)
        gen = None
        if seed is not None:
            gen = torch.Generator(device=device)
            gen.manual_seed(seed)

        out_ids = torch.full((N, max_new_tokens), pad_token_id, dtype=torch.long, device=device)
        out_mask = torch.zeros((N, max_new_tokens), dtype=torch.long, device=device)
        out_lp = torch.zeros((N, max_new_tokens), dtype=torch.float32, device=device)

        engine = self.engine_for(model)
        with _eval_mode(model):
            logits = engine.prefill(p_ids, p_mask, G, max_new_tokens)  # (N, V)
            rows = torch.arange(N, device=device)  # (B,) global row of each batch row
            done = torch.zeros(N, dtype=torch.bool, device=device)  # (B,)
            compactions, decode_steps = 0, 0
            check_every = self.check_every or (8 if device.type == "cuda" else 1)
            seen = None  # (B, V) bool: tokens in each row's prompt and completion so far (repetition penalty)
            if repetition_penalty != 1.0:
                seen = seen_tokens(p_ids, p_mask, logits.shape[-1]).repeat_interleave(G, dim=0)  # (N, V)
            sampling = dict(min_p=min_p, repetition_penalty=repetition_penalty)

            for t in range(max_new_tokens):
                noise = None
                if temperature > 0:
                    # Drawn for all N rows every step so a row's sample never depends on the batch layout.
                    noise = torch.empty((N, logits.shape[-1]), device=device).exponential_(generator=gen)
                    if compactions:
                        noise = noise[rows]  # (B, V) the live rows' own noise
                tokens, lp = sample_tokens(
                    logits, temperature, top_k, top_p, noise, seen=seen, **sampling
                )  # (B,)
                if seen is not None:
                    seen[torch.arange(tokens.shape[0], device=device), tokens] = True
                tokens = tokens.masked_fill(done, pad_token_id)
                out_ids[rows, t] = tokens
                out_mask[rows, t] = (~done).long()
                out_lp[rows, t] = lp.masked_fill(done, 0.0)
                if not ignore_eos:
                    done = done | torch.isin(tokens, eos)
                if t == max_new_tokens - 1:
                    break
                if (t + 1) % check_every == 0:  # reading `done` waits for the device: not every step
                    n_done = int(done.sum())
                    if n_done == done.numel():
                        break
                    if self.compact and 2 * n_done >= done.numel():
                        keep = (~done).nonzero().squeeze(-1)  # (B',)
                        engine.keep(keep)
                        rows, done, tokens = rows[keep], done[keep], tokens[keep]
                        seen = None if seen is None else seen[keep]
                        compactions += 1
                logits = engine.step(tokens)  # (B, V)
                decode_steps += 1

        # Columns after the last row's EOS (all done before the check noticed) hold padding only.
        steps = max(1, int(out_mask.sum(-1).max()))
        self.stats = {
            "engine": engine.name,
            "cuda_graphs": bool(getattr(engine, "use_graphs", False)),
            "decode_steps": decode_steps,
            "compactions": compactions,
        }
        completion_ids = out_ids[:, :steps]  # (N, Lc)
        if ignore_eos:  # an EOS drawn is an ordinary token: every row ran to max_new_tokens
            truncated = torch.ones(N, dtype=torch.bool, device=device)
        else:
            _, truncated = completion_mask_from_ids(completion_ids, eos_token_ids)
        return Rollout(
            prompt_ids=p_ids.repeat_interleave(G, dim=0),
            prompt_mask=p_mask.repeat_interleave(G, dim=0),
            completion_ids=completion_ids,
            completion_mask=out_mask[:, :steps],
            logprobs=out_lp[:, :steps],
            truncated=truncated,
        ).to_host()


class HFGenerator:
    """Reference path: ``model.generate`` with an explicit GenerationConfig, log-probs from the scores it drew
    each token from (transformers' processors: repetition penalty, temperature, top-k, top-p, min-p).

    The prompts are repeated G times before the call (prefill cost G times per prompt). Sampling
    settings stored in the model's own generation_config (min length, ...) are not applied: only the
    arguments given here are.
    """

    def release(self) -> bool:
        """Nothing is kept between calls (transformers builds its cache per call)."""
        return False

    @torch.no_grad()
    def generate(
        self,
        model: torch.nn.Module,
        prompt_ids: list[list[int]],
        *,
        group_size: int,
        max_new_tokens: int,
        temperature: float,
        top_p: float = 1.0,
        top_k: int = 0,
        min_p: float = 0.0,
        repetition_penalty: float = 1.0,
        eos_token_ids: list[int],
        pad_token_id: int,
        seed: int | None = None,
        ignore_eos: bool = False,
    ) -> Rollout:
        from transformers import GenerationConfig

        _validate(
            group_size, max_new_tokens, temperature, top_p, top_k, eos_token_ids, min_p, repetition_penalty
        )
        device = _model_device(model)
        p_ids, p_mask = left_pad(prompt_ids, pad_token_id, device)  # (P, Lp)
        p_ids = p_ids.repeat_interleave(group_size, dim=0)  # (N, Lp)
        p_mask = p_mask.repeat_interleave(group_size, dim=0)  # (N, Lp)
        do_sample = temperature > 0
        stop_ids = list(eos_token_ids)
        if ignore_eos:  # generate() stops on an eos id: give it one no token has (the logits' width)
            head = model.get_output_embeddings()
            stop_ids = [int(head.weight.shape[0]) if head is not None else int(model.config.vocab_size)]
        config = GenerationConfig(
            max_new_tokens=max_new_tokens,
            do_sample=do_sample,
            temperature=temperature if do_sample else None,
            top_k=top_k if do_sample else None,  # 0 said: transformers 5 samples with top_k=50 when it is None
            top_p=top_p if do_sample and top_p < 1 else None,
            min_p=min_p if do_sample and min_p > 0 else None,
            repetition_penalty=float(repetition_penalty) if repetition_penalty != 1 else None,
            eos_token_id=stop_ids,
            pad_token_id=pad_token_id,
            return_dict_in_generate=True,
            output_scores=True,
        )
        rng = contextlib.nullcontext()
        if seed is not None:
            rng = torch.random.fork_rng(devices=[device] if device.type == "cuda" else [])
        with _eval_mode(model), rng:
            if seed is not None:
                torch.manual_seed(seed)
            out = model.generate(input_ids=p_ids, attention_mask=p_mask, generation_config=config)
        completion_ids = out.sequences[:, p_ids.shape[1] :]  # (N, Lc)
        # the scores each token was drawn from: penalised, divided by T, filtered (-inf outside the kept set)
        scores = torch.stack(out.scores, dim=1).float()  # (N, Lc, V)
        logprobs = scores.log_softmax(-1).gather(-1, completion_ids[..., None]).squeeze(-1)  # (N, Lc)
        mask, truncated = completion_mask_from_ids(completion_ids, stop_ids)  # (N, Lc), (N,)
        completion_ids = completion_ids.masked_fill(mask == 0, pad_token_id)
        return Rollout(
            prompt_ids=p_ids,
            prompt_mask=p_mask,
            completion_ids=completion_ids,
            completion_mask=mask,
            logprobs=logprobs.masked_fill(mask == 0, 0.0),  # padding after an EOS may be outside the kept set
            truncated=truncated,
        ).to_host()
