"""The fast engine (``rollout.engine: fast``, the default): its own sampling loop over a decode engine
(:mod:`grpokit.rollout.engines.fast.decode`). Each prompt is prefilled once, then its KV cache is repeated
``group_size`` times, so a prompt's forward cost is paid once per group instead of once per sample. Rows that
have emitted EOS (or a stop string, rollout.stop) are dropped from the batch once at least half of it has finished. On supported models (Llama
family) decode runs over a static KV cache, replayed as CUDA graphs on a GPU.

The distribution a token is drawn from is :func:`process_logits`' (transformers' order; the conventions every
engine keeps are grpokit.rollout.engines.base's).
"""

from __future__ import annotations

import torch
from torch import Tensor

from grpokit.rollout.engines.base import (
    Engine,
    Rollout,
    SamplingParams,
    completion_mask_from_ids,
    eval_mode,
    left_pad,
    model_device,
)
from grpokit.rollout.engines.fast.decode import check_kv_cache, make_engine
from grpokit.rollout.engines.stop import stopped_rows


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


class FastGenerator(Engine):
    """Own sampling loop over a decode engine (:mod:`grpokit.rollout.engines.fast.decode`): one prefill per
    prompt, its KV cache repeated G times, finished rows dropped.

    kv_cache: ``auto`` (the static KV cache with CUDA graphs where the model supports it, else the
        model's dynamic cache), ``static`` (error if unsupported) or ``dynamic``.
    cuda_graphs: record and replay the static engine's decode steps on CUDA.
    compile: the static engine's elementwise work (norms, residual adds, RoPE, SwiGLU) through torch.compile,
        a fused kernel each (grpokit.model.fused_layers; rollout.compile); ``auto``: on a CUDA device with cuda_graphs.
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

    name = "fast"

    def __init__(
        self,
        compact: bool = True,
        kv_cache: str = "auto",
        cuda_graphs: bool = True,
        check_every: int = 0,
        compile: bool | str = False,
    ):
        check_kv_cache(kv_cache)
        if check_every < 0:
            raise ValueError(f"check_every must be >= 0 (0 = automatic), got {check_every}")
        self.compact = compact
        self.check_every = check_every
        self.kv_cache = kv_cache
        self.cuda_graphs = cuda_graphs
        if compile not in (True, False, "auto"):
            raise ValueError(f"compile must be true, false or auto, got {compile!r}")
        self.compile = compile
        self.engine = None
        self.stats: dict = {}  # of the last call: engine, decode_steps, compactions

    @classmethod
    def from_settings(cls, rollout, *, max_model_len: int = 0, seed: int = 0, say=None) -> FastGenerator:
        """rollout.kv_cache, rollout.cuda_graphs and rollout.compile."""
        return cls(kv_cache=rollout.kv_cache, cuda_graphs=rollout.cuda_graphs, compile=rollout.compile)

    def engine_for(self, model: torch.nn.Module):
        """The decode engine for ``model``, built on first use and kept while the model stays the same."""
        if self.engine is None or self.engine.model is not model:
            # auto: where the steps replay CUDA graphs, as measured; launched one by one, each compiled call adds host
            # work (its guards) per layer and step, not measured
            auto = self.compile == "auto" and self.cuda_graphs and model_device(model).type == "cuda"
            compiled = self.compile is True or auto
            self.engine = make_engine(model, self.kv_cache, cuda_graphs=self.cuda_graphs, compiled=compiled)
        return self.engine

    def release(self) -> bool:
        """Free the engine's device buffers (the static KV cache, CUDA graphs; rebuilt by the next call);
        True when any were held."""
        return self.engine is not None and bool(self.engine.release())

    @torch.no_grad()
    def sample(self, model: torch.nn.Module, prompt_ids: list[list[int]], params: SamplingParams) -> Rollout:
        device = model_device(model)
        G = params.group_size
        p_ids, p_mask = left_pad(prompt_ids, params.pad_token_id, device)  # (P, Lp)
        N = p_ids.shape[0] * G
        eos = torch.tensor(params.eos_token_ids, device=device)
        gen = None
        if params.seed is not None:
            gen = torch.Generator(device=device)
            gen.manual_seed(params.seed)

        out_ids = torch.full((N, params.max_new_tokens), params.pad_token_id, dtype=torch.long, device=device)
        out_mask = torch.zeros((N, params.max_new_tokens), dtype=torch.long, device=device)
        out_lp = torch.zeros((N, params.max_new_tokens), dtype=torch.float32, device=device)

        engine = self.engine_for(model)
        with eval_mode(model):
            logits = engine.prefill(p_ids, p_mask, G, params.max_new_tokens)  # (N, V)
            rows = torch.arange(N, device=device)  # (B,) global row of each batch row
            done = torch.zeros(N, dtype=torch.bool, device=device)  # (B,)
            compactions, decode_steps = 0, 0
            check_every = self.check_every or (8 if device.type == "cuda" else 1)
            seen = None  # (B, V) bool: tokens in each row's prompt and completion so far (repetition penalty)
            if params.repetition_penalty != 1.0:
                seen = seen_tokens(p_ids, p_mask, logits.shape[-1]).repeat_interleave(G, dim=0)  # (N, V)
            sampling = dict(min_p=params.min_p, repetition_penalty=params.repetition_penalty)

            for t in range(params.max_new_tokens):
                noise = None
                if params.temperature > 0:
                    # Drawn for all N rows every step so a row's sample never depends on the batch layout.
                    noise = torch.empty((N, logits.shape[-1]), device=device).exponential_(generator=gen)
                    if compactions:
                        noise = noise[rows]  # (B, V) the live rows' own noise
                tokens, lp = sample_tokens(
                    logits, params.temperature, params.top_k, params.top_p, noise, seen=seen, **sampling
                )  # (B,)
                if seen is not None:
                    seen[torch.arange(tokens.shape[0], device=device), tokens] = True
                tokens = tokens.masked_fill(done, params.pad_token_id)
                out_ids[rows, t] = tokens
                out_mask[rows, t] = (~done).long()
                out_lp[rows, t] = lp.masked_fill(done, 0.0)
                if not params.ignore_eos:
                    done = done | torch.isin(tokens, eos)
                if params.stop_strings is not None and (t + 1) % check_every == 0:
                    # a row whose text ends in a stop string draws no more (what it drew since is cut: Engine.generate)
                    done = done | stopped_rows(params.stop_strings, out_ids, rows, t, ~done)
                if t == params.max_new_tokens - 1:
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
            "compiled": bool(getattr(getattr(engine, "ops", None), "compiled", False)),
            "decode_steps": decode_steps,
            "compactions": compactions,
        }
        completion_ids = out_ids[:, :steps]  # (N, Lc)
        if params.ignore_eos:  # an EOS drawn is an ordinary token: every row ran to params.max_new_tokens
            truncated = torch.ones(N, dtype=torch.bool, device=device)
        else:
            _, truncated = completion_mask_from_ids(completion_ids, params.eos_token_ids)
        return Rollout(
            prompt_ids=p_ids.repeat_interleave(G, dim=0),
            prompt_mask=p_mask.repeat_interleave(G, dim=0),
            completion_ids=completion_ids,
            completion_mask=out_mask[:, :steps],
            logprobs=out_lp[:, :steps],
            truncated=truncated,
        ).to_host()
