"""Start-up, resume and checkpoints of a run, its other outputs, and stopping it cleanly on a signal.

``RunStateMixin`` holds the GRPOTrainer methods that read and write the output folder."""

from __future__ import annotations

import dataclasses
import json
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from grpokit.batch import ScoredBatch
from grpokit.checkpoint import (
    CheckpointError,
    find_resumable,
    list_checkpoints,
    load_trainer_state,
    load_weights_into,
    prune_checkpoints,
    remove_partial,
    save_checkpoint,
    set_rng_state,
    verify_checkpoint,
)
from grpokit.config import ConfigError, save_config
from grpokit.errors import TrainingError
from grpokit.output_lock import set_aside
from grpokit.rollout_record import sample_rows, write_rollouts
from grpokit.validate import config_changes


class StopOnSignals:
    """Inside ``with``: the first SIGINT or SIGTERM only records its name (``signal_name``), so the
    training loop can stop at the end of the step and save; a second SIGINT stops at once
    (KeyboardInterrupt). Outside the main thread (where handlers cannot be set) it does nothing."""

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopOnSignals:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc_info: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _handle(self, signum: int, frame: object) -> None:
        if self.signal_name is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signal_name = signal.Signals(signum).name
        print(
            f"\ngrpokit: {self.signal_name}: stopping after this step with a checkpoint "
            "(Ctrl-C again stops at once, without one)",
            file=sys.stderr,
            flush=True,
        )


class RunStateMixin:
    """GRPOTrainer's output-folder side: the run started, checkpoints saved and resumed from, callbacks
    (one that raises saves a checkpoint), sample tables and the curves plot."""

    def trainer_state(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "optimizer": self.dist.optimizer_state(self.model, self.optimizer),  # torchrun: consolidated
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "precision": self.precision.name,
            "stream": self.stream.state(),
            "config": dataclasses.asdict(self.cfg),
            "world_size": self.dist.world,  # a run resumes at the same number of processes
            "rng_ranks": self.dist.rng_states(),  # torchrun: every rank's RNG state, else None
            "critic": self.critic_state(),  # PPO's critic optimizer/scheduler (grpokit.critic), else None
        }

    def save(self) -> Path:
        """Checkpoint this step (once: a second call at the same step returns the same folder), then prune
        every step_N folder but the newest train.keep_checkpoints complete ones up to this step."""
        if self._saved is not None and self._saved[0] == self.step:
            return self._saved[1]
        root = self.out / "checkpoints"
        path = root / f"step_{self.step:06d}"
        weights, state = self.dist.full_state(self.model), self.trainer_state()  # every rank gathers
        if self.dist.is_main:  # under torchrun rank 0 alone writes the consolidated checkpoint
            save_checkpoint(
                path, self.model, self.tokenizer, state, state_dict=weights, subfolders=self.critic_folders()
            )
            prune_checkpoints(root, self.cfg.train.keep_checkpoints, current_step=self.step)
        self.dist.barrier()
        self._saved = (self.step, path)
        return path

    def _start_run(self) -> None:
        """The run starts: only now are run files written. A run being replaced (overwrite) is moved
        aside (deleted after this run's first step, put back if it fails before), checkpoints left
        half-written by a kill are removed, the resolved config is saved."""
        if self.overwrite:
            set_aside(self.out)  # deleted once this run logs its first step (grpokit.output_lock)
            self.overwrite = False  # a second train() call continues this run
        self.out.mkdir(parents=True, exist_ok=True)
        for partial in remove_partial(self.out / "checkpoints"):
            print(f"grpokit: removed {partial}, a checkpoint left half-written", file=sys.stderr)
        save_config(self.cfg, self.out / "config.yaml", resolved_algo=self.algo)

    def _pick_checkpoint(self, resume: bool | str | Path, allow_changed_config: bool) -> Path:
        """The checkpoint to resume from, verified without loading it: the one named, or the newest
        complete one (damaged newer ones are reported and skipped). Raises ConfigError when there is
        none, or when the run's settings changed and allow_changed_config is False."""
        root = self.out / "checkpoints"
        if resume is True:
            try:
                path, damaged = find_resumable(root)
            except CheckpointError as e:
                raise ConfigError(str(e)) from None
            for bad, problem in damaged:
                warning = f"grpokit: warning: {bad} is damaged ({problem}); resuming from {path.name}"
                print(warning, file=sys.stderr)
        else:
            path = Path(resume) if Path(resume).is_dir() else root / str(resume)
            problem = verify_checkpoint(path) if path.is_dir() else "no such checkpoint folder"
            if problem:
                present = ", ".join(p.name for p in list_checkpoints(root)) or "none"
                raise ConfigError(f"--resume-from {resume}: {problem} (checkpoints in {root}: {present}).")
        changes = config_changes(load_trainer_state(path, mmap=True).get("config"), self.cfg)
        if changes and not allow_changed_config:
            raise ConfigError(
                f"--resume: settings differ from the run in {path} ({'; '.join(changes)}); set them back, "
                "or pass --allow-changed-config to continue with the new ones."
            )
        if changes:
            print(f"grpokit: resuming with changed settings: {'; '.join(changes)}", file=sys.stderr)
        return path

    def _resume(self) -> None:
        latest = self.resume_from
        state = load_trainer_state(latest)
        self.dist.check_resume(state, latest)  # the same world size, or a clear refusal
        if not self.dist.active:  # under torchrun the weights were loaded before sharding (dist.wrap)
            load_weights_into(self.model, latest)
        self.dist.load_optimizer(self.model, self.optimizer, state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.resume_critic(state, latest)  # PPO's critic/ folder and optimizer (grpokit.critic)
        self.stream.load_state(state["stream"])
        set_rng_state(self.dist.my_rng(state))
        self.step = state["step"]
        self._saved = (self.step, latest)

    def _previous_summary(self, summary: dict[str, Any]) -> dict[str, Any]:
        """On resume, keep the before-training accuracy of the first leg of the run."""
        path = self.out / "summary.json"
        if "eval_accuracy_before" in summary or not path.is_file():
            return {}
        old = json.loads(path.read_text())
        return {"eval_accuracy_before": old["eval_accuracy_before"]} if "eval_accuracy_before" in old else {}

    def _run_callbacks(self, metrics: dict[str, float]) -> None:
        for callback in self.callbacks:
            try:
                callback(self.step, metrics, self)
            except Exception as e:
                name = getattr(callback, "__qualname__", repr(callback))
                raise TrainingError(
                    f"callback {name} stopped the run at step {self.step}: {type(e).__name__}: {e} "
                    f"(checkpoint of step {self.step}: {self.save()})."
                ) from e

    def _save_samples(self, batch: ScoredBatch, advantages, record) -> None:
        """samples/step_N.jsonl: every completion with its rewards and advantage (TRL's log_completions, also a
        W&B table); rollouts/step_N.parquet: the same with the per-token numbers ``record`` holds."""
        G, column = self.cfg.rollout.group_size, self.cfg.data.prompt_column
        self.log.log_samples(self.step, sample_rows(batch, advantages, G, column))
        if record is not None:
            write_rollouts(
                self.out, self.step, batch, record, advantages=advantages, group_size=G,
                prompt_column=column, tokenizer=self.tokenizer, algo=self.algo,
            )  # fmt: skip

    def _plot(self) -> None:
        from grpokit.plots import plot_training_curves

        eval_path = self.out / "eval.jsonl"
        plot_training_curves(
            self.out / "metrics.jsonl",
            self.out / "curves.png",
            eval_path=eval_path if eval_path.is_file() else None,
        )
