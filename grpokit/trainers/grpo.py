"""The GRPO training loop, in the order the data flows:

    prompts -> G completions each -> rewards -> group-relative advantages
            -> mu passes of mini-batched, gradient-accumulated clipped updates -> metrics
            -> evaluation -> checkpoint

``GRPOTrainer`` runs a loop over parts that each own their state (grpokit.trainers.parts builds them:
``build_parts``, the same a loop of one's own is written with); ``train_step`` passes values between them, and no
part calls back into the trainer:

    BatchSource  (grpokit.collect)          the Sampler in this process, or a sampler process beside the update
                                            (rollout.max_staleness >= 1) -> ScoredBatch (rollout, rewards)
    advantages   (grpokit.train.advantages) rewards, log-probs, values      -> advantages (N,) or (N, Lc)
    PolicyUpdate (grpokit.train.update)     rollout, advantages             -> steps the Learner, update metrics
    Learner      (grpokit.train.learner)    the policy, precision, optimizer, schedule, micro-batching
    Critic       (grpokit.train.critic)     PPO's value model, its own Learner -> values, critic metrics
    RunState     (grpokit.run.state)        the output folder, checkpoints, resume
    Distributed  (grpokit.train.distributed) torchrun's ranks and reductions (a no-op in one process)

The trainer never learns how its batch was made. The run around the steps (log, signals, callbacks, evaluation
and checkpoint cadence, summary) is grpokit.run.loop's, shared with SFT. The maths lives in ``grpokit.algos``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from grpokit.collect.sampler import Sampler
from grpokit.compat.trl.after_train import (
    TrainResult,
    check_resume_request,
    create_model_card,
    epoch_of,
    log_metrics,
    refuse_push_to_hub,
    save_hf_model,
    save_metrics,
    save_state,
    trainer_state,
    trl_evaluation,
)
from grpokit.compat.trl.api import ProcessView, trl_arguments
from grpokit.compat.trl.names import tokens_so_far, with_trl_names
from grpokit.config.schema import Config
from grpokit.core.errors import ConfigError
from grpokit.core.notices import Notices
from grpokit.data.templates import describe_templates
from grpokit.rollout.batch import ANSWER_FORMAT_HINT, ScoredBatch, advantage_abs_mean, step_metrics
from grpokit.rollout.evaluate import evaluate
from grpokit.rollout.record import TokenRecorder, sample_rows, write_rollouts
from grpokit.run.log import RunLogger
from grpokit.run.loop import run_training
from grpokit.run.state import StopOnSignals
from grpokit.train.costs import step_costs
from grpokit.train.critic import Critic
from grpokit.train.teacher import teacher_metrics
from grpokit.train.update import PolicyUpdate
from grpokit.trainers.parts import GRPOParts, build_parts, run_reward_functions


def _of_parts(name: str, doc: str, where: str = "") -> property:
    """A trainer attribute that is its parts' (GRPOParts) of that name, or of their ``where`` ("inputs": what step
    1 found, RunInputs; "policy": the loaded policy, Policy); set, it sets theirs (a test swaps a part so)."""

    def holder(self):
        return getattr(self.parts, where) if where else self.parts

    return property(
        lambda self: getattr(holder(self), name), lambda self, value: setattr(holder(self), name, value), doc=doc
    )


class GRPOTrainer:
    """Trains ``cfg.model`` on ``cfg.data`` with the algorithm ``cfg.algo`` names.

    model/tokenizer/rows/reward_functions may be passed in directly (tests, notebooks);
    otherwise they are loaded from the config. Everything cheap is checked before the model loads
    (output folder, data, rewards, the model's config.json, the checkpoint to resume from), and
    nothing is written to the output folder until train() starts.

    resume: True continues from the newest complete checkpoint in train.output_dir (damaged newer
    ones are reported and skipped), a path from exactly that checkpoint. Settings that differ from the
    checkpoint's run (validate.FREE_TO_CHANGE aside) need allow_changed_config. overwrite: replace a
    run already in train.output_dir (its files are deleted when train() starts).

    callbacks: functions ``fn(step, metrics, trainer)`` called after each step is logged, in order, with
    the step's metrics dict (the line written to metrics.jsonl). One that raises stops the run: a
    checkpoint of the step is saved and TrainingError carries the callback's name and message;
    ``trainer.stop(reason)`` ends it cleanly instead. TRL's forms are taken too (grpokit.compat.trl.api): model as a
    path or id, processing_class, reward_funcs as bare functions or names, peft_config (a peft.LoraConfig),
    transformers.TrainerCallback objects with their events and control.should_training_stop, tools (functions:
    multi-turn rollouts with them beside rollout.tools; grpokit.compat.trl.call.tool_specs), environment_factory
    (TRL's environments: grpokit.integrations.trl_environment).

    sampler, updater, critic: the classes the parts are built from (``Sampler``, ``PolicyUpdate``,
    ``Critic``); a subclass swaps a stage, as tests do to see what a stage was given.

    What a user reads or calls: ``cfg``, ``model``, ``tokenizer``, ``step``, ``log_history``,
    ``stopped_early``, ``train()``, ``train_step()``, ``evaluate()``, ``save()``, ``stop(reason)``; what TRL
    scripts call after training (grpokit.compat.trl.after_train): ``save_model(output_dir)``, ``accelerator``
    (print, is_main_process, wait_for_everyone), ``state``, ``log_metrics``, ``save_metrics``, ``save_state``,
    ``create_model_card``; the parts
    (grpokit.trainers.parts.GRPOParts, built by ``build_parts``: ``parts``) are attributes too (``source``: how
    batches are made, ``sampler``, ``learner``: the optimizer and schedule, ``updater``, ``critic``: PPO's or
    None, ``run``: the output folder, ``dist``).
    """

    def __init__(
        self,
        cfg: Config | None = None,
        *,
        args=None,
        model=None,
        tokenizer=None,
        train_rows: list[dict] | None = None,
        eval_rows: list[dict] | None = None,
        train_dataset=None,
        eval_dataset=None,
        reward_functions: list[tuple[str, Any, float]] | None = None,
        resume: bool | str | Path = False,
        overwrite: bool = False,
        allow_changed_config: bool = False,
        callbacks: Sequence[Callable[[int, dict[str, float], GRPOTrainer], Any]] = (),
        peft_config=None,
        processing_class=None,
        reward_funcs=None,
        tools: Sequence[Any] | None = None,
        environment_factory: Any = None,
        sampler: type[Sampler] = Sampler,
        updater: type[PolicyUpdate] = PolicyUpdate,
        critic: type[Critic] = Critic,
        **unexpected: Any,
    ):
        given = trl_arguments(  # grpokit's forms, or TRL's call and argument forms (grpokit.compat.trl)
            cfg, args=args, model=model, tokenizer=tokenizer, processing_class=processing_class,
            reward_functions=reward_functions, reward_funcs=reward_funcs, callbacks=callbacks, peft_config=peft_config,
            train_rows=train_rows, eval_rows=eval_rows, train_dataset=train_dataset, eval_dataset=eval_dataset,
            tools=tools, environment_factory=environment_factory, unexpected=unexpected,
        )  # fmt: skip
        cfg, model, tokenizer, reward_functions, callbacks, train_rows, eval_rows = given
        self.cfg = cfg
        self.say = Notices()  # the parts' messages: the run's log while train() runs, else stderr
        self.parts: GRPOParts = build_parts(
            cfg, model=model, tokenizer=tokenizer, train_rows=train_rows, eval_rows=eval_rows,
            reward_functions=reward_functions, resume=resume, overwrite=overwrite,
            allow_changed_config=allow_changed_config, say=self.say, sampler=sampler, updater=updater, critic=critic,
        )  # fmt: skip
        self.callbacks = list(callbacks)
        # every step's metrics, as TRL's state.log_history (a resumed run's read back from its metrics.jsonl: the
        # reward functions' trainer_state and the callbacks see the whole run)
        self.log_history: list[dict[str, float]] = self.run.logged_history(self.step) if self.step else []
        self.stopped_early: str | None = None  # why the run ended before train.steps (not an error)
        self._log: RunLogger | None = None  # the run's log while train() runs: samples go there
        self._stop: StopOnSignals | None = None  # the run's signals while train() runs (begin)

    # the parts, as attributes (grpokit.trainers.parts.GRPOParts)
    algo = _of_parts("algo", "the resolved algorithm (grpokit.algos.AlgoSettings)")
    dist = _of_parts("dist", "torchrun's ranks (grpokit.train.distributed; one process: a no-op)")
    run = _of_parts("run", "the output folder, its checkpoints and resume (grpokit.run.state.RunState)")
    source = _of_parts("source", "how a step gets its batch (grpokit.collect.source.BatchSource)")
    sampler = _of_parts("sampler", "the prompts, engine and rewards (grpokit.collect.sampler.Sampler)")
    learner = _of_parts("learner", "the policy's precision, optimizer, schedule and micro-batching")
    updater = _of_parts("updater", "the policy-gradient update (grpokit.train.update.PolicyUpdate)")
    critic = _of_parts("critic", "PPO's value model (grpokit.train.critic.Critic), or None")
    mismatch = _of_parts("mismatch", "the sampler/trainer KL watch (grpokit.train.mismatch.MismatchGuard)")
    model = _of_parts("model", "the policy being trained (under torchrun: this rank's FSDP shards or DDP replica)")
    tokenizer = _of_parts("tokenizer", "the policy's tokenizer", "policy")
    ref_model = _of_parts("ref_model", "the frozen reference, or None (no KL; LoRA: the base, adapter off)", "policy")
    teacher = _of_parts("teacher", "on-policy distillation's teacher (grpokit.train.teacher), or None", "policy")
    train_rows = _of_parts("train_rows", "the training prompts' rows", "inputs")
    eval_rows = _of_parts("eval_rows", "the held-out rows ([] without an accuracy reward)", "inputs")
    reward_names = _of_parts("reward_names", "the rewards' names in metrics", "inputs")
    reward_weights = _of_parts("reward_weights", "{reward name: weight}", "inputs")
    accuracy_name = _of_parts("accuracy_name", "the reward whose 1 means correct, or None", "inputs")
    accuracy_why = _of_parts("accuracy_why", "why that reward is the accuracy (said in the log)", "inputs")
    accuracy_fn = _of_parts("accuracy_fn", "the accuracy reward's function, or None", "inputs")

    @property
    def step(self) -> int:
        """Steps taken; ``train_step()`` takes the next."""
        return self.parts.step

    @step.setter
    def step(self, value: int) -> None:
        self.parts.step = value

    @property
    def eval_generator(self):
        """The engine held-out evaluation decodes with (the batch source's choice)."""
        return self.source.eval_generator

    @staticmethod
    def reward_functions(
        cfg: Config, algo, given: list[tuple[str, Any, float]] | None
    ) -> tuple[list, dict[str, str]]:
        """The run's (name, fn, weight) rewards and {name as given: name in metrics}
        (grpokit.trainers.parts.run_reward_functions)."""
        return run_reward_functions(cfg, algo, given)

    def checkpoint_state(self) -> dict[str, Any]:
        """Every part's own state, by its trainer_state.pt key (GRPOParts.state: the one path a checkpoint's state
        takes, and GRPOParts.restore the way back)."""
        return self.parts.state()

    # ----------------------------------------------------------------------------- the run

    def train(self, resume_from_checkpoint: bool | str | Path | None = None) -> TrainResult:
        """Run cfg.train.steps steps (grpokit.run.loop); returns the summary also written to
        OUTPUT/summary.json (a dict, also read as transformers' TrainOutput: ``.metrics``, ``.global_step``,
        ``.training_loss``). SIGINT/SIGTERM stop the run at the end of the current step with a checkpoint;
        the summary then holds ``stopped_by`` (the signal's name) and is not written (a second Ctrl-C stops
        at once). ``resume_from_checkpoint`` (TRL's): grpokit resumes when the trainer is built
        (``GRPOTrainer(..., resume=...)``); given here it must name what the trainer was built from, or the call
        is refused saying so (grpokit.compat.trl.after_train.check_resume_request)."""
        check_resume_request(self, resume_from_checkpoint)
        try:
            summary = run_training(self)
        finally:  # what the batch source started (a sampler process) ends with the run, however it ends
            self.source.close()
        return TrainResult(summary, self.log_history, epoch_of(self))

    def begin(self, log: RunLogger, stop: StopOnSignals | None = None) -> None:
        """The run's log is open (grpokit.run.loop): the parts' messages and the samples go there. ``stop``: the
        run's signal handling (a signal sent to the sampler process stops the run through it)."""
        self._log = self.say.log = log
        self._stop = stop
        self.source.start(log, stop, self.log_history)  # a sampler process makes the first batch while we evaluate
        prompts = [row[self.cfg.data.prompt_column] for row in self.train_rows]
        if self.sampler.episodes is not None:  # episodes render every prompt with the chat template
            log.print(f"prompts: {self.sampler.episodes.describe_prompts(len(prompts))}")
        else:
            log.print(f"prompts: {describe_templates(prompts, self.cfg.data.template)}")  # TRL's convention or not
        adoption = self.parts.policy.adoption
        if adoption is not None:  # train.adopt_average: the policy's weights may be replaced, said once
            log.print(
                f"average: every {adoption.every} steps the policy takes the weights of its average when that "
                f"scores higher on {len(adoption.row_ids)} training prompts, beyond the noise (train.adopt_average)"
            )
        if self.accuracy_name is None:  # TRL's behaviour: train on the rewards given, say what is missing
            log.print(f"accuracy: {self.accuracy_why}")
        else:
            log.print(f"accuracy: reward {self.accuracy_name!r} ({self.accuracy_why})")  # never a format reward

    def finish(self, summary: dict[str, Any], final: Path) -> None:
        """The batch source's entries in the summary (an asynchronous run's samples dropped for their age)."""
        self.source.finish(summary)

    def stop(self, reason: str) -> None:
        """End the run after the current step as a finished one (final evaluation, checkpoint, summary with
        ``stopped_early``): for callbacks (a TrainerCallback's control.should_training_stop calls it)."""
        self.stopped_early = reason

    def train_step(self) -> dict[str, float]:
        """One rollout and its updates, in the order the data flows: sample -> score -> advantages -> update
        -> metrics. Each stage is a part given the values it needs; it returns what the next one takes. {}: the
        step was not taken (solved prompts: ``stopped_early``; or a signal came while it waited for its batch)."""
        cfg, step, dist, device = self.cfg, self.step, self.dist, self.learner.device
        t0 = time.perf_counter()
        # sample and score: N = P*G rows (this rank's share), rewards (N,); None: a signal came while it waited
        got = self.source.next_batch(step, self.log_history)
        if got is None:
            return {}
        batch, timing = got.batch, got.timing
        everyone = batch.across_ranks(dist)  # torchrun: every rank's rows, for the spread check and metrics
        # raises FlatRewardsError if stuck; not with a teacher, whose dense advantage teaches with flat rewards
        solved = self.sampler.check_spread(everyone, step) if self.teacher is None else None
        if solved:
            self.stopped_early = solved  # the prompts are solved: the step is not taken
            return {}
        t_update = time.perf_counter()
        # the log-probs before the update, (N, Lc) or None: the ratio's denominator, the reference's for a KL
        # (a batch may come with the reference's, made where it was sampled: their seconds are in timing)
        old_logprobs, ref_logprobs, ref_seconds = self.updater.rollout_logprobs(batch.rollout, batch.ref_logprobs)
        timing["reference"] = timing.get("reference", 0.0) + ref_seconds
        values = self.critic.values(batch.rollout) if self.critic else None  # (N, Lc) PPO, else None
        # the teacher's log-probs of the student's tokens (N, Lc): on-policy distillation, else None
        teacher_logprobs = self.teacher.logprobs(self.model, batch.rollout) if self.teacher else None
        advantages = self.parts.advantages(batch, old_logprobs, ref_logprobs, values, teacher_logprobs)  # (N,) / (N, Lc)
        # the steps whose rollouts are saved: the update records its per-token numbers (grpokit.rollout.record)
        sampled = cfg.train.samples_every and (step + 1) % cfg.train.samples_every == 0
        record = TokenRecorder(*batch.rollout.completion_ids.shape) if sampled and dist.is_main else None
        if self.critic is None or self.critic.policy_trains(step):
            update_metrics, _ = self.updater.update(
                batch.rollout, advantages, old_logprobs, ref_logprobs, step=step, record=record
            )
        else:  # PPO's critic warm-up: the policy waits; log what its update would have
            update_metrics = self.updater.waiting_metrics(batch.rollout, old_logprobs, ref_logprobs)
        if self.critic is not None:
            update_metrics.update(self.critic.update(batch, values, old_logprobs, ref_logprobs, step=step))
        timing["update"] = time.perf_counter() - t_update - ref_seconds
        self.step += 1
        self.learner.scheduler.step()
        self.updater.sync_reference(self.step)  # algo.ref_sync_every: the reference moves toward the policy
        average, adoption, adopted = self.parts.policy.average, self.parts.policy.adoption, {}
        if average is not None:  # train.ema_decay / adopt_average: the average of the weights takes this step's
            average.step(self.model)
        if adoption is not None and adoption.due(self.step):  # train.adopt_average: the policy may take the average
            adopted = adoption.compare(average, self.dist.generation_model(self.model, self.step), self._greedy_reward,
                                       agree=self.dist.all_true)  # fmt: skip
        self.source.trained(self.model, self.step)  # e.g. the sampler process gets the new weights when due
        # metrics: the global batch's under torchrun
        abs_mean = advantage_abs_mean(advantages, batch.rollout.completion_mask, dist)
        metrics = step_metrics(everyone, abs_mean, update_metrics, got.sampling, self.accuracy_name)
        metrics.update(adopted)  # average/adopted, average/score, average/policy_score: on a comparison's steps
        if teacher_logprobs is not None:  # teacher/kl: the student's per-token reverse KL to the teacher
            metrics.update(teacher_metrics(old_logprobs, teacher_logprobs, batch.rollout.completion_mask, dist))
        generated = float(batch.rollout.completion_mask.sum())
        metrics.update(step_costs(time.perf_counter() - t0, generated, device, dist, timing))
        metrics.update(got.metrics(metrics["time/step"]))  # the source's: rollout/*, episode/*, tools/*, async/*
        self.mismatch.check(metrics, self.step)  # the sampler drifting from the trainer: a notice, then a stop
        with_trl_names(metrics)  # TRL's names beside ours where they mean the same (grpokit.compat.trl.names)
        # TRL's num_tokens: every step's tokens so far (a resumed run's history is read back from metrics.jsonl)
        metrics["num_tokens"] = tokens_so_far(self.log_history, metrics["tokens/step"])
        if sampled:
            self._save_samples(batch, advantages, record)
        return metrics

    def _greedy_reward(self, model: torch.nn.Module) -> list[float]:
        """train.adopt_average's scores of ``model``: the reward of its greedy completion of each of the comparison's
        training rows, decoded by the evaluation's engine."""
        rows = self.parts.policy.adoption.row_ids
        return self.sampler.greedy_reward(
            model, self.eval_generator, rows, step=self.step, log_history=self.log_history, reward=self.accuracy_name
        )

    # ----------------------------------------------------------------------------- samples, eval, io

    def save(self) -> Path:
        """Checkpoint this step (grpokit.run.state): the policy, its optimizer and schedule, and every part's own
        state (GRPOParts.save); PPO's critic in its folder."""
        return self.parts.save()

    def save_model(self, output_dir: str | Path | None = None) -> Path | None:
        """TRL's ``trainer.save_model(output_dir)``: the policy and its tokenizer as a Hugging Face folder (default
        train.output_dir); not a checkpoint (``save()``). grpokit.compat.trl.after_train.save_hf_model."""
        return save_hf_model(self, output_dir)

    @property
    def state(self):
        """The run as a transformers TrainerState (global_step, max_steps, epoch, num_train_epochs, log_history),
        made when read, as TRL scripts and notebooks read ``trainer.state``."""
        return trainer_state(self)

    def log_metrics(self, split: str, metrics: dict[str, Any]) -> None:
        """transformers' ``trainer.log_metrics(split, metrics)``: a block of aligned lines, main process only."""
        log_metrics(self, split, metrics)

    def save_metrics(self, split: str, metrics: dict[str, Any], combined: bool = True) -> Path | None:
        """transformers' ``save_metrics``: OUTPUT/{split}_results.json (and all_results.json), main process only."""
        return save_metrics(self, split, metrics, combined)

    def save_state(self) -> Path | None:
        """transformers' ``save_state``: OUTPUT/trainer_state.json (``state``), main process only."""
        return save_state(self)

    def create_model_card(
        self, model_name: str | None = None, dataset_name: str | None = None, tags: str | list[str] | None = None
    ) -> Path | None:
        """TRL's ``create_model_card``: OUTPUT/README.md, a model card of this run, main process only."""
        return create_model_card(self, model_name, dataset_name, tags)

    def push_to_hub(self, *args: Any, **kwargs: Any) -> None:
        """TRL's ``trainer.push_to_hub(...)``: refused in one line with what to do, never a silent no-op."""
        refuse_push_to_hub(self)

    @property
    def accelerator(self) -> ProcessView:
        """What TRL scripts call on ``trainer.accelerator`` (print, is_main_process, wait_for_everyone, ...),
        from grpokit's own process group (grpokit.compat.trl.api.ProcessView)."""
        return ProcessView(self.dist, self.learner.device)

    def _save_samples(
        self, batch: ScoredBatch, advantages: torch.Tensor, record: TokenRecorder | None
    ) -> None:
        """samples/step_N.jsonl: every completion with its rewards and advantage (TRL's log_completions, also a
        W&B table); rollouts/step_N.parquet: the same with the per-token numbers ``record`` holds."""
        if self._log is None:  # train_step() outside train(): nothing is written to the output folder
            return
        G, column = self.cfg.rollout.group_size, self.cfg.data.prompt_column
        self._log.log_samples(self.step, sample_rows(batch, advantages, G, column))
        if record is not None:
            write_rollouts(
                self.run.out, self.step, batch, record, advantages=advantages, group_size=G,
                prompt_column=column, tokenizer=self.tokenizer, algo=self.algo,
                ground_truth_column=next(iter(getattr(self.accuracy_fn, "columns", ())), None),
            )  # fmt: skip

    def evaluate(
        self, eval_dataset: Any = None, ignore_keys: Any = None, metric_key_prefix: str = "eval"
    ) -> dict[str, Any]:
        """transformers' ``trainer.evaluate()``: ``held_out_metrics`` (of ``eval_dataset``'s rows when given, in
        TRL's forms; else ``eval_rows``) under grpokit's names and again under transformers' (``eval_accuracy``,
        ``eval_runtime``, ...: after_train.trl_evaluation). These are greedy accuracy and mean/pass/maj@k, not TRL's
        eval_loss and eval_reward of sampled completions. ``ignore_keys`` names model outputs to drop in
        transformers; grpokit's evaluation reads none, so it changes nothing."""
        from grpokit.compat.trl.call import rows_of
        from grpokit.data.prompts import check_given_rows, check_reward_columns

        started = time.perf_counter()
        rows = None
        if eval_dataset is not None:
            if self.accuracy_fn is None:
                raise ConfigError(
                    "evaluate(eval_dataset=...): grpokit evaluates held-out rows with the run's accuracy reward, and "
                    "this run has none; set train.accuracy_reward to the reward whose 1 means correct"
                )
            rows = rows_of(eval_dataset, "eval_dataset")
            check_given_rows(rows, "eval_dataset", self.cfg.data.prompt_column)
            check_reward_columns(rows, [(self.accuracy_name, self.accuracy_fn, 1.0)], "eval_dataset")
        elif self.accuracy_fn is None:  # a TRL script's closing evaluate(): said, not a crash at the end of a run
            self.say(f"evaluate(): nothing evaluated: {self.accuracy_why}")
            return trl_evaluation(self, {}, rows=0, prefix=metric_key_prefix, seconds=time.perf_counter() - started)
        elif not self.eval_rows:
            raise ConfigError(
                "evaluate(): there are no held-out rows; give eval_dataset (to the trainer or to evaluate) or data.eval"
            )
        result = self.held_out_metrics(rows=rows)
        return trl_evaluation(self, result, rows=len(self.eval_rows if rows is None else rows),
                              prefix=metric_key_prefix, seconds=time.perf_counter() - started)  # fmt: skip

    def _held_out(self, generating, rows: list[dict], examples: list) -> dict[str, float]:
        """``generating``'s held-out metrics on ``rows`` (held_out_metrics' evaluation, of the policy or its average)."""
        cfg, eos_ids = self.cfg, self.sampler.eos_ids
        if self.sampler.episodes is not None:  # multi-turn: greedy episodes scored on their transcripts
            result = self.sampler.episodes.evaluate(
                self.eval_generator, generating, self.tokenizer, rows, self.accuracy_fn,
                eos_token_ids=eos_ids, seed=cfg.train.seed, examples=examples, progress=self.say,
            )  # fmt: skip
        else:
            result = evaluate(
                generating,
                self.tokenizer,
                rows,
                accuracy_fn=self.accuracy_fn,
                generator=self.eval_generator,
                data_cfg=cfg.data,
                eos_token_ids=eos_ids,
                num_samples=cfg.eval.num_samples,
                temperature=cfg.eval.temperature,
                repetition_penalty=cfg.rollout.repetition_penalty,  # how the model decodes; filters are not
                max_new_tokens=cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens,
                seed=cfg.train.seed,
                examples=examples,
                split=self.dist if self.dist.active else None,
                progress=self.say,  # stderr lines while it runs (the run's log: above the progress bar)
                stop_strings=self.sampler.stop_strings,  # rollout.stop ends the held-out completions too
            )
        return result

    def held_out_metrics(self, examples: list[dict] | None = None, rows: list[dict] | None = None) -> dict[str, float]:
        """Held-out accuracy (greedy pass@1) and mean/pass/maj@k on ``rows`` (default ``eval_rows``), scored by the
        accuracy reward (grpokit.rollout.evaluate; multi-turn: greedy episodes): what the run logs to eval.jsonl.
        ``examples`` receives the first greedy {prompt, completion, score}. Before training (step 0), every row
        scoring 0 is warned about."""
        examples = [] if examples is None else examples
        rows = self.eval_rows if rows is None else rows
        model, cfg = self.model, self.cfg
        was = model.training
        result = self._held_out(self.dist.generation_model(model, self.step), rows, examples)
        average = self.parts.policy.average
        if average is not None and cfg.train.ema_decay:  # train.ema_decay: the averaged weights, evaluated the same way
            result.update({f"ema/{k}": v for k, v in self._held_out(average.model, rows, []).items()})
        model.train(was)
        sampled_zero = result.get(f"mean_at_{cfg.eval.num_samples}", 0) == 0
        if self.step == 0 and result.get("greedy_score", 1) == 0 and sampled_zero:  # before any training
            ex = examples[0]
            self.say(
                f"WARNING evaluation before training: every held-out row scored 0 with "
                f"'{self.accuracy_name}'. The verifier may not read this model's answer format "
                f"({ANSWER_FORMAT_HINT}), or the task is too hard. Sample: {str(ex['prompt'])[:200]!r} -> "
                f"{ex['completion'][:300]!r}, score {ex['score']}."
            )
        return result
