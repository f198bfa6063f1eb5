"""What every rollout engine is: the base class with its capabilities, the sampling parameters it takes and the
:class:`Rollout` it returns.

    params = SamplingParams(group_size=4, max_new_tokens=64, temperature=1.0, eos_token_ids=[2], pad_token_id=0)
    rollout = engine.generate(model, prompt_ids, params)          # or the same as keywords:
    rollout = engine.generate(model, prompt_ids, group_size=4, max_new_tokens=64, temperature=1.0,
                              eos_token_ids=[2], pad_token_id=0)

An engine implements ``sample(model, prompt_ids, params)``; its capabilities are class attributes that the
rest of the library reads instead of the engine's name (docs/design/engines.md says how to add one).

Conventions every engine keeps (and ``grpokit.model.logprobs.completion_logprobs``):

- rows are prompt-major: rows ``[i*G:(i+1)*G]`` are prompt i's G samples;
- ``completion_mask`` is 1 for every generated token up to and INCLUDING the terminating EOS;
- ``logprobs`` are the sampled token's log-prob under the distribution it was drawn from: the behaviour
  policy, in transformers' order: the repetition penalty on the raw logits, the temperature, then top-k, top-p
  and min-p, renormalised over the tokens they keep. With none of them on that is ``log_softmax(logits / T)``,
  the quantity the trainer recomputes for its policy. With any on, the trainer's log-probs (the raw model's at
  T) differ from the sampler's by design, and the sampler/trainer metrics (``sampler_logprob_diff/*``,
  ``sampler_kl``) and the importance-sampling correction (``rollout.mismatch_correction``) see that gap, as
  they see a kernel mismatch: the samples come from the processed distribution, not from the policy being
  trained. With ``temperature == 0`` (greedy) they are ``log_softmax`` of the (penalised) logits of the
  argmax token, at T = 1; the filters do not apply.
- ``ignore_eos=True`` (``rollout.ignore_eos``): an EOS drawn is an ordinary token and ends nothing, so every
  completion has exactly ``max_new_tokens`` tokens and is flagged ``truncated`` (benchmarks).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import torch
from torch import Tensor

from grpokit.rollout.engines.stop import StopStrings, cut_at_stop


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """Every knob of one rollout call, for every engine (vLLM's ``SamplingParams`` is the model). Checked when
    made: a bad value is a ValueError naming it."""

    group_size: int
    """G: completions per prompt (rows prompt-major)."""
    max_new_tokens: int
    """Tokens generated per completion at most (the EOS included)."""
    temperature: float
    """T; 0 = greedy (argmax, log-probs at T = 1)."""
    eos_token_ids: tuple[int, ...]
    """The tokens that end a completion (kept in it, masked 1)."""
    pad_token_id: int
    """What fills the rows after their end, in ids and in the left-padded prompts."""
    top_p: float = 1.0
    """Nucleus: the smallest set of most likely tokens whose probability reaches top_p (1 = off)."""
    top_k: int = 0
    """The k most likely tokens (0 = off)."""
    min_p: float = 0.0
    """Tokens at least min_p times as likely as the most likely one (0 = off)."""
    repetition_penalty: float = 1.0
    """CTRL's penalty over the prompt's and the completion's tokens so far (1 = off)."""
    seed: int | None = None
    """The rollout's seed: the same seed, model and params give the same rollout (None: the global RNG)."""
    ignore_eos: bool = False
    """An EOS drawn ends nothing: every completion has max_new_tokens tokens (benchmarks)."""
    stop_strings: StopStrings | None = None
    """Strings that end a completion at the token that completes one (rollout.stop; grpokit.rollout.engines.stop),
    kept in it; None: EOS and max_new_tokens alone."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "eos_token_ids", tuple(int(t) for t in self.eos_token_ids))
        if self.group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {self.group_size}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1] (0 = off), got {self.min_p}")
        if not self.repetition_penalty > 0:
            raise ValueError(f"repetition_penalty must be > 0 (1 = off), got {self.repetition_penalty}")
        if not self.eos_token_ids:
            raise ValueError("eos_token_ids must name at least one token")

    @classmethod
    def of(cls, params: SamplingParams | None = None, **changes: Any) -> SamplingParams:
        """``params`` with ``changes`` applied, or made from ``changes`` alone (the keyword form of
        ``Engine.generate``). An unknown name is a TypeError that names it."""
        unknown = sorted(set(changes) - {f.name for f in fields(cls)})
        if unknown:
            raise TypeError(f"unknown sampling parameter(s) {unknown}; SamplingParams takes {cls.names()}")
        if params is None:
            return cls(**changes)
        return dataclasses.replace(params, **changes) if changes else params

    @classmethod
    def from_settings(cls, section: Any, **given: Any) -> SamplingParams:
        """The knobs ``section`` holds by the same names (``rollout.*`` or ``sample.*``: temperature, top_p, ...,
        with ``n`` read as group_size), then ``given``. A knob added here and to the section reaches every caller
        that builds its params this way."""
        values = {f.name: getattr(section, f.name) for f in fields(cls) if hasattr(section, f.name)}
        if "group_size" not in values and hasattr(section, "n"):
            values["group_size"] = section.n
        return cls.of(**{**values, **given})

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]


@dataclass
class Rollout:
    """G sampled completions for each of P prompts; N = P * G rows, prompt-major.

    Every engine returns it on the CPU (``to_host``): scoring, advantages and the update's bookkeeping
    index it with CPU tensors, and the update moves one micro-batch at a time to the model's device
    (grpokit.train.update.micro_tensors)."""

    prompt_ids: Tensor  # (N, Lp) long, left-padded with pad_token_id
    prompt_mask: Tensor  # (N, Lp) long, 1 = real prompt token
    completion_ids: Tensor  # (N, Lc) long, right-padded with pad_token_id
    completion_mask: Tensor  # (N, Lc) long, 1 for generated tokens up to and including the EOS
    logprobs: (
        Tensor  # (N, Lc) float32, the sampled token's log-prob as drawn (module docstring), 0 at padding
    )
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
        """(N,) generated token ids of each row, EOS included, padding removed (``kept_ids``)."""
        return kept_ids(self.completion_ids, self.completion_mask)

    def decode(self, tokenizer, token_ids: list[list[int]] | None = None) -> list[str]:
        """(N,) completion texts (special tokens such as EOS skipped), in one batch_decode call (a fast
        tokenizer decodes the rows in Rust, not one Python call each); token_ids: completion_token_ids()'s, when
        the caller has them already."""
        ids = self.completion_token_ids() if token_ids is None else token_ids
        return list(tokenizer.batch_decode(ids, skip_special_tokens=True)) if ids else []


def kept_ids(ids: Tensor, mask: Tensor) -> list[list[int]]:
    """(N,) each row of ``ids`` (N, L) where ``mask`` (N, L) is non-zero, as Python lists. One copy to lists for the
    batch (a per-row tensor mask and copy cost ~1 ms a step on a GRPO batch of 128 rows)."""
    rows, keep = ids.tolist(), mask.bool().tolist()
    return [[t for t, m in zip(row, k) if m] for row, k in zip(rows, keep)]


def _rows(t: Tensor | None, index: Tensor) -> Tensor | None:
    return None if t is None else t[index]


def _on_cpu(t: Tensor | None) -> Tensor | None:
    return None if t is None else t.cpu()


class Engine:
    """A rollout engine: ``generate`` turns prompts (token ids) into a :class:`Rollout` under
    :class:`SamplingParams`. A subclass implements ``sample`` and says what it can do in the capabilities below
    (class attributes, read by the trainer, the sampler process and the mismatch correction instead of the
    engine's name)."""

    name: ClassVar[str] = ""
    """rollout.engine's value for this engine."""
    exact_logprobs: ClassVar[bool] = True
    """Its log-probs are computed by the trainer's own model object (the same weights and torch kernels), so the
    importance-sampling correction is off by default (rollout.mismatch_correction=auto); False: another
    implementation computes them (vLLM's kernels), and auto turns the correction on."""
    holds_weights: ClassVar[bool] = False
    """It keeps its own copy of the policy's weights, brought up to date by ``sync`` (a push): a second
    instance is a second copy of the model in memory, and a push can be late, fail or time out."""
    needs_fresh_process: ClassVar[bool] = False
    """It cannot run in a forked process (its own threads, or CUDA): a sampler process that runs it is spawned."""
    takes_lora_adapters: ClassVar[bool] = False
    """A LoRA policy's adapter alone can be pushed to it (rollout.vllm.lora_push); False: the merged weights
    (an engine that holds no weights runs the PEFT model itself)."""

    stats: dict
    """How the last call went (engine, decode_steps, pushes, push_bytes...): read by :func:`rollout_metrics`."""

    @classmethod
    def from_settings(
        cls, rollout: Any, *, max_model_len: int = 0, seed: int = 0, say: Callable[[str], None] | None = None
    ) -> Engine:
        """The engine set up from the run's ``rollout`` section (grpokit.config.schema.RolloutConfig): the
        settings it reads; ``max_model_len`` (prompt plus completion tokens at most, 0: the model's limit),
        ``seed`` and ``say`` (where notices go) for an engine that needs them. By default: no settings."""
        return cls()

    def generate(
        self,
        model: torch.nn.Module,
        prompt_ids: list[list[int]],
        params: SamplingParams | None = None,
        **knobs: Any,
    ) -> Rollout:
        """G completions of each prompt, sampled from ``model`` (or from the engine's copy of its weights) under
        ``params``, or the same knobs as keywords (``SamplingParams.of``). With stop strings, each completion is
        cut after the token that completes one (``cut_at_stop``), whichever engine drew it."""
        params = SamplingParams.of(params, **knobs)
        rollout = self.sample(model, prompt_ids, params)
        if params.stop_strings is not None:
            rollout = cut_at_stop(rollout, params.stop_strings, params.pad_token_id)
        return rollout

    def sample(self, model: torch.nn.Module, prompt_ids: list[list[int]], params: SamplingParams) -> Rollout:
        raise NotImplementedError(f"{type(self).__name__} implements no sample()")

    def sync(self, model: torch.nn.Module, step: int) -> None:
        """Before training step ``step``'s rollout: an engine that holds weights brings them up to date (as its
        settings say); the others read the model directly and do nothing."""

    def release(self) -> bool:
        """Free what the engine keeps between calls on demand (caches rebuilt by the next call); True when
        anything was held."""
        return False

    def close(self) -> None:
        """Stop what the engine started (processes, temporary folders); nothing by default."""


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
    is_eos = torch.isin(
        completion_ids, torch.tensor(list(eos_token_ids), device=completion_ids.device)
    )  # (N, Lc)
    eos_before = is_eos.long().cumsum(-1) - is_eos.long()  # (N, Lc) EOS count strictly before t
    mask = (eos_before == 0).long()  # (N, Lc)
    truncated = ~is_eos.any(-1)  # (N,)
    return mask, truncated


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """Eval mode while sampling: no dropout, and HF layers drop the KV cache when gradient
    checkpointing is on in train mode."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def rollout_metrics(engine) -> dict[str, float]:
    """How the last rollout was decoded, as step metrics: ``rollout/cuda_graphs`` (1 when its decode steps
    replayed CUDA graphs), ``rollout/compiled`` (1 when its layers ran compiled, rollout.compile),
    ``rollout/static_kv_cache`` (1 when it ran over the static KV cache),
    ``rollout/weight_lag`` (steps the engine's copy of the weights was behind: vllm's sync_every, else 0), and
    the weight push before it, ``rollout/push_bytes`` and ``rollout/push_s`` (0 when none: an engine that holds
    no weights, or weights that had not changed)."""
    stats = getattr(engine, "stats", {})
    return {
        "rollout/cuda_graphs": float(bool(stats.get("cuda_graphs", False))),
        "rollout/compiled": float(bool(stats.get("compiled", False))),
        "rollout/static_kv_cache": float(stats.get("engine") == "static"),
        "rollout/weight_lag": float(stats.get("weight_lag", 0)),
        "rollout/push_bytes": float(stats.get("push_bytes", 0)),
        "rollout/push_s": float(stats.get("push_s", 0.0)),
    }
