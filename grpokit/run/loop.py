"""One training run, the same for every trainer (GRPO, SFT), in the order it happens:

    do its checkpoints fit on the disk? -> lock the output folder -> start it (config.yaml)
    -> open the run's log, catch SIGINT / SIGTERM
    -> evaluate before training (a fresh run with held-out rows)
    -> until train.steps: train_step -> log it -> callbacks -> a signal? stop here, with a checkpoint
                          -> evaluate every eval.every steps -> checkpoint every train.save_every steps
                          -> train.max_cpu_seconds used (this leg and those before a resume)? stop here,
                             as a finished run
    -> evaluate after -> the last checkpoint -> summary.json (and curves.png)

    summary = run_training(trainer)          # what trainer.train() returns

The trainer supplies what is its own (``Trainer`` below): one step, its evaluation, its checkpoint, the
lines it opens the log with, its entries in the summary. Every rank runs the loop; rank 0 alone writes.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Protocol

from grpokit.compat.trl.api import fire
from grpokit.core.clock import TrainingClock
from grpokit.core.errors import CallbackError, EngineError, FlatRewardsError, UserCodeFailedError, with_text
from grpokit.run.lock import holding
from grpokit.run.log import RunLogger
from grpokit.run.state import RunState, StopOnSignals
from grpokit.train.distributed import Distributed
from grpokit.train.learner import Learner


class Trainer(Protocol):
    """What the loop reads of a trainer (GRPOTrainer, SFTTrainer), and the five things it supplies."""

    cfg: Any  # train.steps / save_every / report_to / tensorboard, eval.enabled / every
    dist: Distributed  # torchrun's ranks (one process: a no-op)
    run: RunState  # the output folder: its lock, checkpoints and summary
    step: int  # steps taken; train_step() takes the next
    callbacks: list[Any]  # fn(step, metrics, trainer); TRL callbacks' events too (grpokit.compat.trl.api)
    log_history: list[dict[str, float]]  # every logged step's metrics (TRL's state.log_history)
    stopped_early: str | None  # why to end as a finished run before train.steps (trainer.stop), or None
    eval_rows: list[dict]  # held-out rows: evaluated before, every eval.every steps, after
    learner: Learner  # the model trained, its precision (sizes the checkpoints: RunState.check_space)

    def begin(self, log: RunLogger, stop: StopOnSignals) -> None:
        """The run's log is open: the trainer's first lines, and where it writes while the run lasts; ``stop``:
        the run's signals (a signal sent to another process of the run stops it through ``stop.request``)."""

    def train_step(self) -> dict[str, float]:
        """One step; its metrics, or {} when it was not taken (``stopped_early`` then says why, or a signal came
        while it waited: ``stop.signal_name``)."""

    def held_out_metrics(self) -> dict[str, float]:
        """The held-out metrics at this step, under grpokit's names (``evaluate()`` is TRL's call)."""

    def save(self) -> Path:
        """A checkpoint of this step."""

    def finish(self, summary: dict[str, Any], final: Path) -> None:
        """The trainer's own entries in ``summary``, once the last checkpoint ``final`` is written."""


def run_training(trainer: Trainer) -> dict[str, Any]:
    """Run ``trainer`` from its step to cfg.train.steps (the module docstring); returns the summary also
    written to OUTPUT/summary.json. SIGINT/SIGTERM stop the run at the end of the current step with a
    checkpoint; the summary then holds ``stopped_by`` (the signal's name) and is not written (a second
    Ctrl-C stops at once)."""
    cfg, run, dist = trainer.cfg, trainer.run, trainer.dist
    evaluates = bool(trainer.eval_rows) and cfg.eval.enabled
    summary: dict[str, Any] = {}
    run.check_space(trainer.learner, trainer.step)  # a first checkpoint that cannot fit: refused now
    with holding(run.lock):
        dist.on_main(run.start)
        with (
            dist.main_only(RunLogger)(
                run.out,
                total_steps=cfg.train.steps,
                tensorboard=cfg.train.tensorboard,
                resume=trainer.step > 0,
                report_to=cfg.train.report_to,
                config=dataclasses.asdict(cfg),
            ) as log,
            StopOnSignals() as stop,
        ):
            trainer.begin(log, stop)
            fire(trainer.callbacks, "on_train_begin", trainer)
            if evaluates and trainer.step == 0:
                summary.update(eval_summary(evaluate(trainer, log), "before"))
            # a run resumed from a checkpoint that had used its budget takes no step (the checkpoint's count
            # alone, before this leg's clock starts: reward workers warming up are no step's)
            budget_reached = cpu_budget_reached(cfg.train.max_cpu_seconds, run.clock, dist)
            run.clock.start()  # the training steps' seconds, continuing a resumed run's (grpokit.core.clock)
            agreed = None  # under torchrun: the signal every rank agreed to stop for after the last step
            while (
                trainer.step < cfg.train.steps
                and not stopping_for(stop, agreed, dist)
                and not trainer.stopped_early
                and not budget_reached
            ):
                metrics = take_step(trainer)
                if trainer.stopped_early:
                    break  # the step was not taken (GRPO: the prompts are solved)
                if not metrics and stop.signal_name:
                    break  # a signal while the step waited for its batch: not taken, the last one is saved
                log.log_step(trainer.step, metrics)
                run.step_logged()  # --overwrite: the run replaced goes once this one has a step
                trainer.log_history.append({"step": trainer.step, **metrics})
                run_callbacks(trainer, metrics)  # one that raises: checkpoint, CallbackError
                # every rank stops at the same step. The flag is not overwritten by the answer: a signal caught while
                # this collective ran (after this rank gave None) is agreed on after the next step, not lost
                agreed = dist.agree(stop.signal_name)
                if agreed:
                    stop.signal_name = agreed
                    break  # the safe point: this step is done and logged
                every = cfg.eval.every
                if (
                    every
                    and trainer.eval_rows
                    and trainer.step % every == 0
                    and trainer.step < cfg.train.steps
                ):
                    evaluate(trainer, log)
                if cfg.train.save_every and trainer.step % cfg.train.save_every == 0:
                    fire(trainer.callbacks, "on_save", trainer, trainer.save())
                budget_reached = cpu_budget_reached(cfg.train.max_cpu_seconds, run.clock, dist)
            if stopping_for(stop, agreed, dist):
                checkpoint = trainer.save() if trainer.step > 0 else None
                return {
                    "stopped_by": stop.signal_name,
                    "steps": trainer.step,
                    "checkpoint": checkpoint and str(checkpoint),
                }
            run.clock.stop()  # the evaluation after the steps is not theirs
            after_steps = time.perf_counter()  # what the run spends after them: summary's seconds_after_steps
            # the work, whatever the machine's load; a resumed run's count goes on from its checkpoint's
            summary["train_seconds"], summary["train_cpu_seconds"] = run.clock.wall(), run.clock.cpu()
            if budget_reached:
                log.print(budget_reached)
                summary["budget_reached"] = budget_reached
            if trainer.stopped_early:
                log.print(trainer.stopped_early)
                summary["stopped_early"] = trainer.stopped_early
            if evaluates:
                summary.update(eval_summary(evaluate(trainer, log), "after"))
            final = trainer.save()
            fire(trainer.callbacks, "on_save", trainer, final)
            summary.update(steps=trainer.step, checkpoint=str(final), output_dir=str(run.out))
            trainer.finish(summary, final)
            summary.update(run.previous_summary(summary))  # a resumed run keeps its first leg's "before"
            # the evaluation after the steps, the final checkpoint and (finish) curves.png: not in train_seconds
            summary["seconds_after_steps"] = time.perf_counter() - after_steps
            run.finish(summary)  # summary.json, curves.png
            fire(trainer.callbacks, "on_train_end", trainer, summary)
    return summary


def cpu_budget_reached(budget: float | None, clock: TrainingClock, dist: Distributed) -> str | None:
    """Why to stop at this step for train.max_cpu_seconds: the CPU seconds the training steps used (``clock``,
    RunState's: this process and its children, every leg of a resumed run) reached it; else None. Under
    torchrun every rank stops when one has reached it."""
    if budget is None:  # the same config on every rank: no collective
        return None
    used = clock.cpu()
    if not dist.agree("reached" if used >= budget else None):
        return None
    return f"train.max_cpu_seconds={budget:g} reached: {used:.1f} CPU seconds of training"


def take_step(trainer: Trainer) -> dict[str, float]:
    """``trainer.train_step()``; a run stopped for flat rewards (FlatRewardsError), by the user's code
    (UserCodeFailedError: a reward function) or by its engine or sampler process (EngineError) gets a checkpoint
    of the last step taken, named in its message. Under torchrun only when every rank stops with it (flat
    rewards are decided on every rank's rewards; an asynchronous sampler's failure is said to every rank,
    ``every_rank``): one rank's own failure leaves the others inside the step's collectives."""
    try:
        return trainer.train_step()
    except (FlatRewardsError, UserCodeFailedError, EngineError) as e:
        agreed = isinstance(e, FlatRewardsError) or getattr(e, "every_rank", False)
        if trainer.dist.active and not agreed:
            raise
        where = f" Checkpoint of step {trainer.step}: {trainer.save()}." if trainer.step > 0 else ""
        raise with_text(e, where) from None


def evaluate(trainer: Trainer, log: RunLogger) -> dict[str, float]:
    """The trainer's held-out metrics at this step, logged (eval.jsonl) and given to the callbacks."""
    result = trainer.held_out_metrics()
    log.log_eval(trainer.step, result)
    fire(trainer.callbacks, "on_evaluate", trainer, result)
    return result


def eval_summary(result: dict[str, float], when: str) -> dict[str, Any]:
    """eval_loss_<when> and eval_accuracy_<when> (those ``result`` has), and after training the whole
    ``result`` as eval_after."""
    out: dict[str, Any] = {f"eval_{key}_{when}": result[key] for key in ("loss", "accuracy") if key in result}
    if when == "after":
        out["eval_after"] = result
    return out


def run_callbacks(trainer: Trainer, metrics: dict[str, float]) -> None:
    """``fn(step, metrics, trainer)`` for each of ``trainer.callbacks``, in order; one that raises stops the
    run with a checkpoint (``trainer.save()``) and a CallbackError (the user's code: exit 3) naming the callback."""
    for callback in trainer.callbacks:
        try:
            callback(trainer.step, metrics, trainer)
        except Exception as e:
            name = getattr(callback, "__qualname__", repr(callback))
            raise CallbackError(
                f"callback {name} stopped the run at step {trainer.step}: {type(e).__name__}: {e} "
                f"(checkpoint of step {trainer.step}: {trainer.save()})."
            ) from e


def stopping_for(stop: StopOnSignals, agreed: str | None, dist: Distributed) -> str | None:
    """The signal the run stops for now: alone, the one this process caught; under torchrun, only one every rank
    agreed on at a step's end (``agreed``), as one rank stopping alone would leave the others in a collective."""
    return agreed if dist.active else stop.signal_name
