"""The RunState: what a run keeps on disk, and stopping it cleanly on a signal. Any trainer composes one; it
needs no sampler and no critic.

Owns: the output folder (``out``; its ``lock``, grpokit.run.lock, tried when the RunState is built and held
by the trainer's train(); no run file is written there before ``start()``), the checkpoint being resumed
(``resume_from``, picked and verified before any model loads), the last one written (``saved``) and the seconds
the training steps took over every leg of the run (``clock``, grpokit.core.clock.TrainingClock: the loop starts
and stops it, checkpoints record it, a resumed run continues it). Reads
``dist`` (rank 0 alone writes; every rank's RNG state). A checkpoint is the model's Hugging Face folder,
more folders (PPO's ``critic/``), and trainer_state.pt: the learner's state (grpokit.train.learner: optimizer,
scheduler, scaler, precision), whatever else the trainer hands in (the prompt stream, the critic's
optimizer), the step, the training's CPU and wall seconds so far, the config, the world size and the RNG
states.

    run = RunState(cfg, dist, resume=..., overwrite=..., resolved_algo=algo)   # checks the folder (and its lock)
    with holding(run.lock): ...                              # train() (grpokit.run.lock, grpokit.run.loop)
    run.pick_checkpoint(resume, allow_changed_config)        # -> run.resume_from (a Path) or None
    state = run.load_resume_state()                          # trainer_state.pt of resume_from; RNG restored
    run.start()                                              # train() begins: config.yaml; a replaced run aside
    run.step_logged()                                        # ... and deleted once a step of this one is logged
    path = run.save(step, learner, tokenizer, {"stream": ...}, subfolders={"critic": critic_model})
    run.finish(summary)                                      # summary.json and curves.png (curves=True)
    with StopOnSignals() as stop: ...                        # stop.signal_name after SIGINT/SIGTERM
"""

from __future__ import annotations

import dataclasses
import json
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from grpokit.config.schema import Config, ConfigError, save_config
from grpokit.core.clock import TrainingClock
from grpokit.core.errors import RunIOError, TrainingError
from grpokit.core.files import replace_whole
from grpokit.core.workers import listen_for_stops
from grpokit.model.checkpoint import (
    CheckpointError,
    find_resumable,
    list_checkpoints,
    load_trainer_state,
    prune_checkpoints,
    remove_partial,
    resumable_for_model,
    save_checkpoint,
    set_rng_state,
    verify_checkpoint,
)
from grpokit.run.lock import OutputLock, claim_output_dir, discard_aside, is_main_rank, set_aside
from grpokit.run.log import read_metrics
from grpokit.run.preflight import check_free_space, checkpoint_bytes, checkpoints_at_peak, config_changes
from grpokit.train.distributed import Distributed
from grpokit.train.learner import Learner


class StopOnSignals:
    """Inside ``with``: the first SIGINT or SIGTERM only records its name (``signal_name``), so the
    training loop can stop at the end of the step and save; a second SIGINT stops at once
    (KeyboardInterrupt). Outside the main thread (where handlers cannot be set) it does nothing. One sent to a
    tool or environment worker of this process does the same (``request``: grpokit.core.workers.listen_for_stops)."""

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self._previous: dict[int, Any] = {}
        self._previous_listener: Any = None

    def __enter__(self) -> StopOnSignals:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._handle)
        self._previous_listener = listen_for_stops(lambda name, where, pid: self.request(name, where))
        return self

    def __exit__(self, *exc_info: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        listen_for_stops(self._previous_listener)

    def request(self, name: str, where: str) -> None:
        """Stop after this step as for the signal ``name`` sent to another process of the run (``where``: "sent
        to the sampler process 123"), with the same line on stderr."""
        if self.signal_name is None:
            self.signal_name = name
            print(
                f"\ngrpokit: {name} {where}: stopping after this step with a checkpoint",
                file=sys.stderr,
                flush=True,
            )

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


class RunState:
    """A run's output folder, checkpoints and resume (see the module docstring)."""

    def __init__(
        self,
        cfg: Config,
        dist: Distributed | None = None,
        *,
        resume: bool | str | Path = False,
        overwrite: bool = False,
        resolved_algo=None,
        curves: bool = True,
        given: dict[str, Any] | None = None,
    ):
        self.cfg, self.dist = cfg, dist or Distributed()
        self.out = Path(cfg.train.output_dir)
        # not in use by another run now; the run loop holds it while train() runs (grpokit.run.lock.holding)
        self.lock: OutputLock = claim_output_dir(
            self.out, resume=resume is not False, overwrite=overwrite, main=is_main_rank()
        )
        self.overwrite = overwrite
        self.resolved_algo = resolved_algo  # written into config.yaml beside the config
        self.given = given  # what the run was given in code (grpokit.config.run_file.given_in_code), recorded there too
        self.curves = curves and cfg.train.plots  # finish() draws curves.png (GRPO's reward, KL, ... panels)
        self.resume_from: Path | None = None
        self.saved: tuple[int, Path] | None = None  # (step, path) of the last checkpoint written or loaded
        # the training steps' seconds, every leg's (train.max_cpu_seconds; summary's train_cpu_seconds)
        self.clock = TrainingClock()

    def check_space(self, learner: Learner, step: int) -> None:
        """Before the run writes anything: its checkpoints fit on the disk of the output folder
        (grpokit.run.preflight.check_free_space, from rank 0's view): a RunIOError on every rank when the
        first would not fit, a warning when the later ones may not."""
        refusal = None
        if self.dist.is_main:
            t = self.cfg.train
            one = checkpoint_bytes(learner.model, learner.precision.bytes_per_param)
            existing = len(list_checkpoints(self.out / "checkpoints"))
            count = checkpoints_at_peak(t.steps - step, t.save_every, t.keep_checkpoints, existing)
            try:
                warning = check_free_space(self.out, one, count)
            except TrainingError as e:
                refusal = str(e)
            else:
                if warning:
                    print(f"grpokit: warning: {warning}", file=sys.stderr)
        refusal = self.dist.agree(refusal)
        if refusal:
            raise RunIOError(refusal)  # disk full: exit 5 (grpokit.core.errors)

    def start(self) -> None:
        """The run starts: only now are run files written. A run being replaced (overwrite) is moved
        aside (deleted after this run's first step, put back if it fails before), checkpoints left
        half-written by a kill are removed, the resolved config is saved. Rank 0 only (the trainer calls it
        through ``dist.on_main``)."""
        if self.overwrite:
            set_aside(self.out)  # deleted once this run logs its first step (grpokit.run.lock)
            self.overwrite = False  # a second train() call continues this run
        self.out.mkdir(parents=True, exist_ok=True)
        for partial in remove_partial(self.out / "checkpoints"):
            print(f"grpokit: removed {partial}, a checkpoint left half-written", file=sys.stderr)
        save_config(self.cfg, self.out / "config.yaml", resolved_algo=self.resolved_algo, given=self.given)

    def step_logged(self) -> None:
        """A step of this run is logged: the run it replaced (--overwrite), set aside by start(), is deleted."""
        if self.dist.is_main:
            discard_aside(self.out)

    def save(
        self,
        step: int,
        learner: Learner,
        tokenizer,
        state: dict[str, Any],
        subfolders: dict[str, Any] | None = None,
    ) -> Path:
        """Checkpoint ``step`` (once: a second call at the same step returns the same folder): the learner's
        model and state, ``state`` (more trainer_state.pt entries), ``subfolders`` (more models); then prune
        every step_N folder but the newest train.keep_checkpoints complete ones up to this step."""
        if self.saved is not None and self.saved[0] == step:
            return self.saved[1]
        root = self.out / "checkpoints"
        path = root / f"step_{step:06d}"
        weights = self.dist.full_state(learner.model)  # every rank gathers
        extra_weights = {name: self.dist.full_state(extra) for name, extra in (subfolders or {}).items()}
        trainer_state = {
            "step": step,
            **learner.state(),  # optimizer (torchrun: consolidated), scheduler, scaler, precision
            **state,
            **self.clock.state(),  # train_cpu_seconds, train_seconds: a resumed run continues the count
            "config": dataclasses.asdict(self.cfg),
            "world_size": self.dist.world,  # a run resumes at the same number of processes
            "rng_ranks": self.dist.rng_states(),  # torchrun: every rank's RNG state, else None
        }
        if self.dist.is_main:  # under torchrun rank 0 alone writes the consolidated checkpoint
            save_checkpoint(
                path, learner.model, tokenizer, trainer_state, state_dict=weights, subfolders=subfolders,
                subfolder_states=extra_weights,
            )
            prune_checkpoints(root, self.cfg.train.keep_checkpoints, current_step=step)
        self.dist.barrier()
        self.saved = (step, path)
        return path

    def pick_checkpoint(self, resume: bool | str | Path, allow_changed_config: bool) -> Path | None:
        """The checkpoint to resume from (None when ``resume`` is False), verified without loading it: the
        one named, or the newest complete one (damaged newer ones are reported and skipped). Raises
        ConfigError when there is none, or when the run's settings changed and allow_changed_config is
        False. Sets ``resume_from``."""
        if resume is False:
            return None
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
        self.resume_from = path
        return path

    def check_resumable(self, model, auto: bool) -> None:
        """Once the model is loaded: a checkpoint whose weights are of another architecture is skipped like a
        damaged one when the newest was asked for (``auto``), else refused (grpokit.model.checkpoint)."""
        if self.resume_from is not None:
            self.resume_from = resumable_for_model(self.resume_from, model, auto=auto)

    def load_resume_state(self) -> dict[str, Any]:
        """trainer_state.pt of ``resume_from``, checked for the world size; this rank's RNG state restored.
        The caller hands the pieces to their parts (``learner.load_state(state)``, the stream's...)."""
        state = load_trainer_state(self.resume_from)
        self.dist.check_resume(state, self.resume_from)  # the same world size, or a clear refusal
        set_rng_state(self.dist.my_rng(state))
        self.saved = (state["step"], self.resume_from)
        self.clock.carry(state)  # the seconds the earlier legs' steps took (rank 0's under torchrun)
        return state

    def logged_history(self, step: int) -> list[dict[str, Any]]:
        """The metrics of steps 1 .. ``step`` as metrics.jsonl holds them (the last line of a step: a run killed
        after logging a step past its newest checkpoint logged it twice), for a resumed run's log_history (what
        reward functions read in trainer_state, and callbacks). Every rank reads it."""
        path = self.out / "metrics.jsonl"
        by_step = {line["step"]: line for line in read_metrics(path)} if path.is_file() else {}
        return [by_step[n] for n in range(1, step + 1) if n in by_step]

    def previous_summary(self, summary: dict[str, Any]) -> dict[str, Any]:
        """On resume, keep the before-training accuracy of the first leg of the run. Rank 0 alone: it alone
        writes summary.json (another rank could read it half-written)."""
        path = self.out / "summary.json"
        if not self.dist.is_main or "eval_accuracy_before" in summary or not path.is_file():
            return {}
        old = json.loads(path.read_text())
        return {"eval_accuracy_before": old["eval_accuracy_before"]} if "eval_accuracy_before" in old else {}

    def finish(self, summary: dict[str, Any]) -> None:
        """Write summary.json and (``curves``) the curves of metrics.jsonl as curves.png (rank 0)."""
        if not self.dist.is_main:
            return
        replace_whole(self.out / "summary.json", json.dumps(summary, indent=2))  # never seen half-written
        if not self.curves:
            return
        start = time.perf_counter()
        from grpokit.run.plots import (
            plot_training_curves,  # lazy: matplotlib is slow to import, needed only here
        )

        eval_path = self.out / "eval.jsonl"
        plot_training_curves(
            self.out / "metrics.jsonl",
            self.out / "curves.png",
            eval_path=eval_path if eval_path.is_file() else None,
        )
        if "seconds_after_steps" in summary:  # the plot's seconds too (train.plots=false leaves them out)
            summary["seconds_after_steps"] += time.perf_counter() - start
            replace_whole(self.out / "summary.json", json.dumps(summary, indent=2))
