"""On-policy distillation's teacher: a frozen causal LM whose log-probs of the student's own sampled tokens make the
dense advantage w (log pi_T - log pi_s) per token (grpokit.algos.distill; algo.teacher_kl_coef, teacher.*).

    teacher = Teacher.build(cfg, algo, tokenizer, device, precision)   # None: no teacher
    teacher_logprobs = teacher.logprobs(policy, batch.rollout)         # (N, Lc)

Where its pass runs (teacher.engine):
- local: loaded from teacher.name_or_path (a local folder, or a model id the hub cache holds) in teacher.dtype,
  frozen and in eval mode; its pass is the reference's (grpokit.train.reference.ReferencePass: the same
  eval_logprobs, micro-batches and autocast), at the sampling temperature.
- vllm (VLLMTeacherPass): vLLM's prompt log-probs of each row's prompt and completion, from an engine of
  teacher.name_or_path in this process whose logits are divided by the sampling temperature (teacher.vllm.mode=
  colocate), or from a vLLM server started apart, at temperature 1 (server; grpokit.rollout.engines.vllm.teacher).
Either way the student's and the teacher's log-probs are of the same distribution's tokens: log_softmax(logits / T).

It must share the student's tokenizer: a local folder's tokenizer is compared with the student's when the teacher is
built, its embedding must hold every id, and a server's tokenizer is compared through its /tokenize. The settings'
rules between them are grpokit.config.checks.check_teacher's, checked when the config loads.

Where the pass runs in a step: beside the reference's, in the trainer, before the advantages; in an asynchronous run
(rollout.max_staleness >= 1) the trainer makes it too (the teacher never changes, so the batch's age does not
matter), not yet the sampler process. Under torchrun each rank holds a whole teacher (or reaches the server) and
scores its own rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from grpokit.algos.distill import teacher_kl
from grpokit.config.checks import VLLM_INSTALL
from grpokit.core.errors import ConfigError
from grpokit.model.loading import (
    DTYPES,
    TOKENIZER_FILES,
    check_tokenizer_fits,
    load_tokenizer,
)
from grpokit.model.precision import Precision
from grpokit.rollout.engines.base import Rollout
from grpokit.train.distributed import Distributed
from grpokit.train.reference import ReferencePass


class Teacher:
    """The frozen teacher and its log-prob pass (module docstring). ``model``: the local teacher (None when vLLM
    holds it); ``log_pass``: a ReferencePass over it, or a VLLMTeacherPass; ``source``: what it is, for messages."""

    def __init__(self, model: torch.nn.Module | None, log_pass: Any, source: str):
        self.model, self.log_pass, self.source = model, log_pass, source

    @classmethod
    def build(
        cls, cfg: Any, algo: Any, tokenizer: Any, device: torch.device, precision: Precision
    ) -> Teacher | None:
        """The teacher of ``cfg.teacher`` for a run with ``algo.teacher_kl_coef > 0``, None without (a config
        grpokit.config.checks.check_teacher passed: a teacher named, its engine's settings). ConfigError: a teacher
        that does not load or start, vLLM missing for a colocated one, or another tokenizer than the student's
        ``tokenizer``; TeacherServerError: a server that does not answer."""
        if not algo.uses_teacher:
            return None
        if cfg.teacher.engine == "vllm":
            log_pass = VLLMTeacherPass.build(cfg, tokenizer, device, precision)
            return cls(None, log_pass, log_pass.source)
        path = cfg.teacher.name_or_path
        key = f"teacher.name_or_path={path!r}"
        check_same_tokenizer(path, tokenizer, key)
        from transformers import AutoModelForCausalLM

        dtype = precision.weight_dtype if cfg.teacher.dtype == "auto" else DTYPES[cfg.teacher.dtype]
        try:
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        except Exception as e:  # noqa: BLE001 - transformers raises many types for a folder that is not a model
            first = (str(e).strip().splitlines() or [""])[0][:200]
            raise ConfigError(f"{key}: the teacher does not load ({type(e).__name__}: {first}).") from None
        model = model.to(device)
        model.requires_grad_(False)
        model.eval()
        check_tokenizer_fits(model, tokenizer, key)
        return cls(model, ReferencePass.from_config(model, precision, device, cfg), path)

    def logprobs(self, policy: torch.nn.Module, r: Rollout) -> torch.Tensor:
        """(N, Lc) the teacher's log-probs of ``r``'s completion tokens (0 at padding); ``policy``: the student,
        whose train/eval mode the pass leaves as it found it."""
        return self.log_pass.logprobs(policy, r)


class VLLMTeacherPass:
    """The teacher's pass on vLLM (teacher.engine=vllm): each row's real prompt tokens and attended completion tokens
    (the model's, and a multi-turn episode's tool and environment tokens between them) as one sequence, scored by
    ``scorer`` (grpokit.rollout.engines.vllm.teacher: ColocatedScorer or ServedScorer); the completion positions'
    log-probs back in the rollout's (N, Lc) layout, 0 where nothing is attended."""

    def __init__(self, scorer: Any, source: str):
        self.scorer, self.source = scorer, source

    @classmethod
    def build(cls, cfg: Any, tokenizer: Any, device: torch.device, precision: Precision) -> VLLMTeacherPass:
        from grpokit.rollout.engines.vllm.teacher import ColocatedScorer, ServedScorer

        t, path = cfg.teacher, cfg.teacher.name_or_path
        if path is not None:
            check_same_tokenizer(path, tokenizer, f"teacher.name_or_path={path!r}")
        if t.vllm.mode == "server":
            scorer = ServedScorer(
                t.vllm.server_url, server_timeout_s=t.vllm.server_timeout_s, request_timeout_s=t.vllm.request_timeout_s
            ).connect(path)
            scorer.check_tokenizer(tokenizer)
            return cls(scorer, f"the vLLM server at {scorer.describe()}")
        check_teacher_engine(cfg, uses_teacher=True)  # (also before the student loads: trainers.parts.check_inputs)
        dtype = precision.weight_dtype if t.dtype == "auto" else DTYPES[t.dtype]
        scorer = ColocatedScorer.start(
            path, temperature=cfg.rollout.temperature, dtype=str(dtype).removeprefix("torch."), seed=cfg.train.seed,
            max_model_len=_longest_row(cfg, path), cpu_kv_cache_gib=t.vllm.cpu_kv_cache_gib,
            gpu_memory_utilization=t.vllm.gpu_memory_utilization, cuda=device.type == "cuda",
            key=f"teacher.name_or_path={path!r}",
        )  # fmt: skip
        if scorer.vocab_size < len(tokenizer):
            raise ConfigError(
                f"teacher.name_or_path={path!r}: the tokenizer has {len(tokenizer)} tokens but the teacher's embedding "
                f"has {scorer.vocab_size} rows, so it cannot score every token the student samples."
            )
        return cls(scorer, f"{path} (vLLM, in this process)")

    def logprobs(self, policy: torch.nn.Module, r: Rollout) -> torch.Tensor:
        """(N, Lc) float32 on the CPU; ``policy`` is not read (the teacher's weights are vLLM's)."""
        attended = r.attention_mask.bool()  # (N, Lc)
        sequences, places = [], []
        for i in range(r.completion_ids.shape[0]):
            prompt = r.prompt_ids[i][r.prompt_mask[i].bool()].tolist()
            where = attended[i].nonzero().flatten()  # (C,) the completion positions scored
            sequences.append((prompt + r.completion_ids[i, where].tolist(), len(prompt)))
            places.append(where)
        scored = self.scorer.logprobs(sequences)
        out = torch.zeros(r.completion_ids.shape, dtype=torch.float32)  # (N, Lc)
        for i, (where, values) in enumerate(zip(places, scored)):
            out[i, where] = torch.tensor(values, dtype=torch.float32)
        return out * r.completion_mask.to(torch.float32)  # 0 at the tool's tokens and the padding


def check_teacher_engine(cfg: Any, uses_teacher: bool) -> None:
    """A colocated vLLM teacher (teacher.engine=vllm, teacher.vllm.mode=colocate) needs vLLM importable in this
    process: a ConfigError saying how otherwise. Run before any weight loads (grpokit.trainers.parts.check_inputs),
    so a run without vLLM fails in seconds, not after the student has loaded."""
    if not uses_teacher or cfg.teacher.engine != "vllm" or cfg.teacher.vllm.mode == "server":
        return
    missing = _vllm_missing()
    if missing:
        raise ConfigError(
            f"teacher.engine=vllm (teacher.vllm.mode=colocate) needs vLLM, which does not import here ({missing}). "
            f"Install it: {VLLM_INSTALL}; or score on a teacher server started where it is "
            "(teacher.vllm.mode=server), or load the teacher with transformers (teacher.engine=local)."
        )


def _vllm_missing() -> str | None:
    """None when vLLM imports, else why not (grpokit.rollout.engines.vllm.vllm_missing's test)."""
    try:
        from vllm import LLM, SamplingParams  # noqa: F401
    except Exception as e:  # noqa: BLE001 - ImportError, or a broken install failing inside its own imports
        return f"{type(e).__name__}: {e}"
    return None


def _longest_row(cfg: Any, path: str) -> int | None:
    """Tokens the teacher's engine is sized for: the prompt, the longest training completion (a multi-turn episode:
    all of it after the prompt) and the one token a request generates; at most the teacher's positions."""
    r = cfg.rollout
    completion = r.max_new_tokens
    if r.tools or r.environment:
        completion = max(completion, r.max_episode_tokens or r.max_turns * r.max_new_tokens)
    length = cfg.data.max_prompt_tokens + completion + 1
    try:
        from transformers import AutoConfig

        limit = getattr(AutoConfig.from_pretrained(path), "max_position_embeddings", None)
    except Exception:  # noqa: BLE001 - vLLM reports a folder it cannot read, by name, when it starts
        limit = None
    return min(length, limit) if limit else length


def check_same_tokenizer(path: str, tokenizer: Any, key: str) -> None:
    """ConfigError when the teacher's folder holds a tokenizer whose vocabulary differs from the student's: the
    teacher would score other tokens than the student sampled. A folder without one is taken as the student's."""
    local = Path(path).expanduser()
    if not (local.is_dir() and any((local / name).is_file() for name in TOKENIZER_FILES)):
        return
    theirs = load_tokenizer(str(local)).get_vocab()
    ours = tokenizer.get_vocab()
    if theirs == ours:
        return
    differ = sorted(set(theirs.items()) ^ set(ours.items()), key=lambda item: item[1])[:3]
    raise ConfigError(
        f"{key}: the teacher's tokenizer differs from the student's ({len(theirs)} and {len(ours)} tokens; e.g. "
        f"{differ}), so its log-probs would be of other tokens than the student sampled. On-policy distillation "
        "needs one tokenizer: distil from a teacher of the student's family, or SFT on the teacher's samples "
        "(grpokit sample, then grpokit sft)."
    )


def teacher_metrics(
    old_logprobs: torch.Tensor,
    teacher_logprobs: torch.Tensor,
    completion_mask: torch.Tensor,
    dist: Distributed,
) -> dict[str, float]:
    """{"teacher/kl": the mean over every rank's completion tokens of log pi_s - log pi_T}, the per-token reverse KL
    of the student to the teacher on its own samples (k1; grpokit.algos.distill.teacher_kl): what distillation
    lowers."""
    mask = completion_mask.to(old_logprobs.device)
    n = mask.to(torch.bool).sum().double()  # ()
    total = teacher_kl(old_logprobs, teacher_logprobs.to(old_logprobs.device), mask) * n.clamp(min=1)  # ()
    total, n = dist.sum(total.reshape(1)), dist.sum(n.reshape(1))
    return {"teacher/kl": float(total.sum() / n.sum().clamp(min=1))}
