"""The trainer's one entry point to the advantage estimators: a preset (or its settings, or an estimator's
name) and the batch's tensors -> advantages. Above advantages.py, presets.py and settings.py, which it
reads; nothing in grpokit.algos imports it."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from .advantages import AdvantageInputs, _group_mean, estimator
from .distill import teacher_advantages
from .presets import PRESETS
from .settings import AlgoSettings


def compute_advantages(
    rewards: Tensor,
    group_size: int,
    preset_or_kind: str | AlgoSettings | Mapping[str, object],
    *,
    completion_mask: Tensor | None = None,
    kl: Tensor | None = None,
    kl_coef: float = 0.0,
    old_logprobs: Tensor | None = None,
    ref_logprobs: Tensor | None = None,
    values: Tensor | None = None,
    step_rewards: list[list[tuple[int, float]]] | None = None,
    std_ddof: int | None = None,
    eps: float | None = None,
    scored: Tensor | None = None,
    trained_mask: Tensor | None = None,
    teacher_logprobs: Tensor | None = None,
) -> Tensor:
    """One entry point for the trainer: build AdvantageInputs and run the named estimator.

    `preset_or_kind` is a preset name or an AlgoSettings (its estimator, std_ddof, std_eps and the estimator's own
    parameters are used), a mapping of flat settings over the defaults ({"advantage": "group_centre", "std_ddof":
    0}; refused as AlgoSettings.of refuses them), or an estimator name (a key of ADVANTAGES, an alias, or
    "module:function": its parameters at their defaults).

    With an AlgoSettings whose algo.teacher_kl_coef w > 0 (on-policy distillation), the estimator's advantages get
    the teacher's dense term added, w (teacher_logprobs - old_logprobs) per token (grpokit.algos.distill): (N, L),
    on unscored rows too (the teacher needs no reward).

    Args:
        rewards: (N,) groups contiguous; group_size: G; the rest as in AdvantageInputs. eps: added to
            every std (None: the AlgoSettings' std_eps, else 1e-6).
        teacher_logprobs: (N, L) the teacher's log-probs of the completion tokens (needs old_logprobs and
            completion_mask), required when w > 0.
    Returns:
        (N,) or (N, L) advantages, the estimator's exactly 0 at unscored rows (`scored` False).
    Raises:
        ValueError: unknown estimator, or an estimator output of any other shape.
    """
    if isinstance(preset_or_kind, str) and preset_or_kind in PRESETS:
        preset_or_kind = PRESETS[preset_or_kind]
    elif isinstance(preset_or_kind, Mapping):  # flat settings over the defaults, checked as AlgoSettings.of's
        preset_or_kind = AlgoSettings.of(**preset_or_kind)  # type: ignore[arg-type]
    std_eps, params, teacher_coef = 1e-6, None, 0.0
    if isinstance(preset_or_kind, AlgoSettings):
        teacher_coef = preset_or_kind.advantage.teacher_kl_coef
        kind, ddof = preset_or_kind.advantage.estimator, preset_or_kind.advantage.std_ddof
        std_eps = preset_or_kind.advantage.std_eps
        entry = estimator(kind)
        params = None if entry.params is None else preset_or_kind.params_of(entry.params)
    else:
        kind, ddof = preset_or_kind, 1
        entry = estimator(kind)
        params = None if entry.params is None else entry.params()
    ddof = ddof if std_ddof is None else std_ddof
    if scored is not None:
        scored = scored.to(device=rewards.device, dtype=torch.bool)
        if bool(scored.all()):
            scored = None
        elif not entry.scored_aware:
            rewards = torch.where(scored, rewards, _group_mean(rewards, group_size, scored))  # (N,)
    inputs = AdvantageInputs(
        rewards=rewards,
        group_size=group_size,
        completion_mask=completion_mask,
        kl=kl,
        kl_coef=kl_coef,
        old_logprobs=old_logprobs,
        ref_logprobs=ref_logprobs,
        values=values,
        step_rewards=step_rewards,
        std_ddof=ddof,
        scored=scored,
        trained_mask=trained_mask,
        eps=std_eps if eps is None else eps,
        params=params,
    )
    out = entry.fn(inputs)
    n = rewards.shape[0]
    allowed = [(n,)] + ([tuple(completion_mask.shape)] if completion_mask is not None else [])
    if not isinstance(out, Tensor) or tuple(out.shape) not in allowed:
        got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
        raise ValueError(
            f"advantage {kind!r} returned {got}; an estimator must return (N,) or (N, L), here "
            f"{' or '.join(map(str, allowed))}"
        )
    if scored is not None:  # unscored rows carry no signal, whatever the estimator
        keep = scored if out.dim() == 1 else scored[:, None]
        out = torch.where(keep, out, torch.zeros_like(out))
    if teacher_coef > 0:  # on-policy distillation: the teacher's dense per-token term
        if teacher_logprobs is None or old_logprobs is None or completion_mask is None:
            raise ValueError(
                f"algo.teacher_kl_coef={teacher_coef:g} needs teacher_logprobs, old_logprobs and completion_mask (N, L)"
            )
        dense = teacher_advantages(old_logprobs, teacher_logprobs, completion_mask, teacher_coef)  # (N, L)
        out = (out[:, None] if out.dim() == 1 else out).to(dense.dtype) + dense  # (N, L)
    return out
