"""Stand-ins for the parts issue 23 is splitting GRPOTrainer into (``grpokit.learner.Learner``,
``load_model``; ``grpokit.run_state.RunState``), with their API, so that grpokit.sft is written against
those parts today. They hold no training machinery of their own: the micro-batch retry and the clipped
optimizer step are update.MicroBatchMixin's methods, checkpoints and the output folder
run_state.RunStateMixin's, each run on a small object carrying the attributes those methods read.
When the parts land on main this file is deleted and grpokit.sft imports them instead.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from grpokit.checkpoint import load_trainer_state, load_weights_into, set_rng_state
from grpokit.distributed import Distributed
from grpokit.loading import load_policy, pick_device, prepare_policy
from grpokit.output_lock import claim_output_dir, discard_aside, is_main_rank
from grpokit.precision import make_grad_scaler, make_optimizer, resolve_precision
from grpokit.run_state import RunStateMixin
from grpokit.schedules import lr_factor, warmup_steps
from grpokit.update import MicroBatchMixin, peak_memory_mb

__all__ = ["Learner", "RunState", "load_model", "peak_memory_mb", "run_callbacks"]


def load_model(cfg, model=None, tokenizer=None):
    """(model, tokenizer, precision, device): cfg.model loaded (or the given model cast to the precision
    mode's weight dtype and prepared), LoRA applied, as GRPOTrainer loads its policy."""
    if model is None:
        precision = resolve_precision(cfg.optim.precision, cfg.model.dtype, pick_device(cfg.model.device))
        model, tokenizer, device = load_policy(cfg.model, cfg.lora, precision.weight_dtype)
        return model, tokenizer, precision, device
    device = next(model.parameters()).device
    given = str(next(model.parameters()).dtype).removeprefix("torch.")
    auto = cfg.model.dtype == "auto" and cfg.optim.precision == "auto"
    precision = resolve_precision(cfg.optim.precision, given if auto else cfg.model.dtype, device)
    for p in model.parameters():  # parameters only: buffers such as RoPE's inv_freq stay float32
        if p.is_floating_point():
            p.data = p.data.to(precision.weight_dtype)
    return prepare_policy(model, cfg.model, cfg.lora), tokenizer, precision, device


def run_callbacks(trainer, metrics: dict[str, float]) -> None:
    """``fn(step, metrics, trainer)`` for each of trainer.callbacks; one that raises stops the run with a
    checkpoint (trainer.save()) and a TrainingError naming it: RunStateMixin._run_callbacks, which reads
    only trainer.callbacks, .step and .save."""
    RunStateMixin._run_callbacks(trainer, metrics)


class _Stepper(MicroBatchMixin):
    """What MicroBatchMixin's _with_micro_retry / _micro_rows / _clip_and_step read, and nothing else."""


class Learner:
    """A model with its optimizer, schedule, loss scaler and micro-batching (grpokit.learner's API)."""

    def __init__(self, model, precision, device, optim, dist: Distributed | None = None, *, total_steps: int):
        self.model, self.precision, self.device = model, precision, device
        self.dist = dist or Distributed()
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = make_optimizer(params, precision, optim, device)
        self.scaler = make_grad_scaler(precision, device)
        warm = warmup_steps(total_steps, optim.warmup_steps, optim.warmup_ratio)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_factor(s, optim.schedule, warm, total_steps)
        )
        m = self._m = _Stepper()
        m.cfg, m.model, m.device, m.dist = SimpleNamespace(optim=optim), model, device, self.dist
        m.optimizer, m.scaler, m.auto_micro_rows, m.last_micro_rows, m.log, m.step = self.optimizer, self.scaler, None, 0, None, 0
        self.micro = SimpleNamespace(rows=m._micro_rows)

    def step(self, lengths, split, loss_fn, normaliser, *, step: int = 0):
        """One optimizer step: the gradient of sum_micro loss_sum / normaliser over ``split(rows)``, clipped
        and applied. Returns (grad norm or None when skipped, each micro-batch's stats)."""
        self.model.train()
        self._m.step = step

        def accumulate(rows: int):
            self.optimizer.zero_grad(set_to_none=True)
            stats = []
            for micro in split(rows):
                with self.precision.autocast(self.device):
                    loss_sum, micro_stats = loss_fn(self.model, micro)
                loss = loss_sum / normaliser
                if not torch.isfinite(loss) and not self.dist.active:
                    return stats, False
                scaled = loss * self.dist.world  # DDP/FSDP average gradients over ranks
                (self.scaler.scale(scaled) if self.scaler is not None else scaled).backward()
                stats.append(micro_stats)
            return stats, True

        stats, finite = self._m._with_micro_retry(accumulate, lengths)
        return self.clip_and_step(finite, step), stats

    def clip_and_step(self, finite: bool, step: int = 0, label: str = "update") -> float | None:
        """Unscale, clip, check, step (MicroBatchMixin._clip_and_step); None when a NaN/inf skipped it."""
        self._m.step = step
        return self._m._clip_and_step(finite, label=label)

    def metrics(self) -> dict[str, float]:
        out = {"lr": self.scheduler.get_last_lr()[0]}
        if self.scaler is not None:
            out["loss_scale"] = float(self.scaler.get_scale())
        out["micro_batch_size"] = float(self._m.last_micro_rows)
        return out

    def state(self) -> dict[str, Any]:
        return {
            "optimizer": self.dist.optimizer_state(self.model, self.optimizer),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "precision": self.precision.name,
        }

    def load_state(self, state: dict[str, Any], weights_from: Path | None = None) -> None:
        if weights_from is not None:
            load_weights_into(self.model, weights_from)
        self.dist.load_optimizer(self.model, self.optimizer, state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])


class _Folder(RunStateMixin):
    """What RunStateMixin's save / _start_run / _pick_checkpoint / _previous_summary read."""

    algo = None  # config.yaml gets no resolved algorithm

    def critic_state(self):
        return None

    def critic_folders(self):
        return None


class RunState:
    """A run's output folder, checkpoints and resume (grpokit.run_state.RunState's API)."""

    def __init__(self, cfg, dist: Distributed | None = None, *, resume=False, overwrite=False):
        self.cfg, self.dist = cfg, dist or Distributed()
        self.out = Path(cfg.train.output_dir)
        # not in use by another run; train() locks it until it ends (grpokit.output_lock's run_holding_lock)
        self.lock = claim_output_dir(self.out, resume=resume is not False, overwrite=overwrite, main=is_main_rank())
        f = self._f = _Folder()
        f.cfg, f.dist, f.out, f.overwrite, f._saved = cfg, self.dist, self.out, overwrite, None
        self.resume_from: Path | None = None

    def pick_checkpoint(self, resume, allow_changed_config: bool) -> Path | None:
        if resume is False:
            return None
        self.resume_from = self._f._pick_checkpoint(resume, allow_changed_config)
        return self.resume_from

    def load_resume_state(self) -> dict[str, Any]:
        state = load_trainer_state(self.resume_from)
        self.dist.check_resume(state, self.resume_from)
        set_rng_state(self.dist.my_rng(state))
        self._f._saved = (state["step"], self.resume_from)
        return state

    def start(self) -> None:
        self._f._start_run()

    def step_logged(self) -> None:
        """A step of this run is logged: the run it replaced (--overwrite, set aside by start()) is deleted."""
        if self.dist.is_main:
            discard_aside(self.out)

    def save(self, step: int, learner: Learner, tokenizer, state: dict[str, Any]) -> Path:
        f = self._f
        f.step, f.model, f.tokenizer, f.precision = step, learner.model, tokenizer, learner.precision
        f.optimizer, f.scheduler, f.scaler = learner.optimizer, learner.scheduler, learner.scaler
        f.stream = SimpleNamespace(state=lambda: state["stream"])
        return f.save()

    def previous_summary(self, summary: dict[str, Any]) -> dict[str, Any]:
        return self._f._previous_summary(summary)

    def finish(self, summary: dict[str, Any]) -> None:
        if self.dist.is_main:
            (self.out / "summary.json").write_text(json.dumps(summary, indent=2))
