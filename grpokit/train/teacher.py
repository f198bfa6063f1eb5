"""On-policy distillation's teacher: a frozen causal LM whose log-probs of the student's own sampled tokens make the
dense advantage w (log pi_T - log pi_s) per token (grpokit.algos.distill; algo.teacher_kl_coef, teacher.*).

    teacher = Teacher.build(cfg, algo, tokenizer, device, precision)   # None: no teacher
    teacher_logprobs = teacher.logprobs(policy, batch.rollout)         # (N, Lc)

The teacher is loaded from teacher.name_or_path (a local folder, or a model id the hub cache holds) in
teacher.dtype, frozen and in eval mode, and makes its pass as the reference does (grpokit.train.reference
.ReferencePass: the same eval_logprobs, micro-batches and autocast), at the sampling temperature, so the student's
and the teacher's log-probs are of the same distribution's tokens. It must share the student's tokenizer: its
folder's tokenizer is compared with the student's when it is built, and its embedding must hold every id.

Where the pass runs: beside the reference's, in the trainer, before the advantages; in an asynchronous run
(rollout.max_staleness >= 1) the trainer makes it too (the teacher never changes, so the batch's age does not
matter), not yet the sampler process. Under torchrun each rank holds a whole teacher and scores its own rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from grpokit.algos.distill import teacher_kl
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
    """The frozen teacher and its log-prob pass (module docstring)."""

    def __init__(self, model: torch.nn.Module, log_pass: ReferencePass, source: str):
        self.model, self.log_pass, self.source = model, log_pass, source

    @classmethod
    def build(
        cls, cfg: Any, algo: Any, tokenizer: Any, device: torch.device, precision: Precision
    ) -> Teacher | None:
        """The teacher of ``cfg.teacher`` for a run with ``algo.teacher_kl_coef > 0``; None when neither is set.
        ConfigError: one without the other, a teacher that does not load, or another tokenizer than the
        student's ``tokenizer``."""
        path = cfg.teacher.name_or_path
        key = f"teacher.name_or_path={path!r}"
        if not algo.uses_teacher:
            default = type(cfg.teacher)()
            changed = [
                f"teacher.{f}={getattr(cfg.teacher, f)!r}"
                for f in ("name_or_path", "dtype")
                if getattr(cfg.teacher, f) != getattr(default, f)
            ]
            if changed:
                raise ConfigError(
                    f"{', '.join(changed)}: the teacher is read only by on-policy distillation; set "
                    "algo.teacher_kl_coef > 0 (its weight in the advantage), or remove the setting."
                )
            return None
        if path is None:
            raise ConfigError(
                f"algo.teacher_kl_coef={algo.advantage.teacher_kl_coef:g} needs a teacher: set teacher.name_or_path "
                "to the teacher model's folder (it must share the student's tokenizer)."
            )
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
        optim = cfg.optim
        log_pass = ReferencePass(
            model, precision, device, cfg.rollout.temperature, optim.logprob_chunk_size, optim.micro_batch_size,
            optim.micro_batch_tokens if optim.packing else None,
        )  # fmt: skip
        return cls(model, log_pass, path)

    def logprobs(self, policy: torch.nn.Module, r: Rollout) -> torch.Tensor:
        """(N, Lc) the teacher's log-probs of ``r``'s completion tokens (0 at padding); ``policy``: the student,
        whose train/eval mode the pass leaves as it found it."""
        return self.log_pass.logprobs(policy, r)


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
