"""The GRPO training loop, in the order the data flows:

    prompts -> G completions each -> rewards -> group-relative advantages
            -> mu passes of mini-batched, gradient-accumulated clipped updates -> metrics
            -> evaluation -> checkpoint

``GRPOTrainer`` composes parts that each own their state; ``train_step`` passes values between them, and
no part calls back into the trainer:

    Sampler      (grpokit.collect.sampler)    prompts, generator, rewards     -> ScoredBatch (rollout, rewards)
    AsyncSampler (grpokit.collect.async_sampler) rollout.max_staleness >= 1: the Sampler in a process beside the
                 update -> ScoredBatch at most K steps old, with the policy version that sampled it
    advantages   (grpokit.train.advantages) rewards, log-probs, values      -> advantages (N,) or (N, Lc)
    PolicyUpdate (grpokit.train.update)     rollout, advantages             -> steps the Learner, update metrics
    Learner      (grpokit.train.learner)    the policy, precision, optimizer, schedule, micro-batching
    Critic       (grpokit.train.critic)     PPO's value model, its own Learner -> values, critic metrics
    RunState     (grpokit.run.state)        the output folder, checkpoints, resume
    Distributed  (grpokit.train.distributed) torchrun's ranks and reductions (a no-op in one process)

The run around the steps (log, signals, callbacks, evaluation and checkpoint cadence, summary) is
grpokit.run.loop's, shared with SFT. The maths lives in ``grpokit.algos``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch

from grpokit.collect.async_ranks import (
    agree_on_age,
    checkpoint_over_ranks,
    rank_state,
    sampler_for_process,
    sampling_weights,
    say_died,
    taken_over_ranks,
)
from grpokit.collect.async_sampler import AsyncSampler, StopRequested, check_sendable
from grpokit.collect.reference import sampler_reference
from grpokit.collect.sampler import Sampler, encode_rows
from grpokit.compat.trl.api import trl_arguments
from grpokit.compat.trl.names import with_trl_names
from grpokit.config.checks import check_settings_in_use, check_vllm_installed
from grpokit.config.run_file import given_in_code
from grpokit.config.schema import Config, ConfigError, resolve_algo, validated
from grpokit.core.errors import TrainingError
from grpokit.core.notices import Notices
from grpokit.data.prompts import check_reward_columns, load_train_eval
from grpokit.data.templates import describe_templates
from grpokit.model.loading import (
    check_tokenizer_fits,
    frozen_reference,
    load_tokenizer_checked,
    read_model_config,
)
from grpokit.rewards import RewardRunner, resolve_reward, resolve_reward_specs
from grpokit.rewards.process import check_process_setup
from grpokit.rewards.which_accuracy import pick_accuracy_reward
from grpokit.rollout.batch import ANSWER_FORMAT_HINT, ScoredBatch, advantage_abs_mean, step_metrics
from grpokit.rollout.engines import engine_class
from grpokit.rollout.episodes import EpisodeSampler, environment_rewards, multi_turn, name_callables
from grpokit.rollout.evaluate import evaluate
from grpokit.rollout.generation import FastGenerator, rollout_metrics
from grpokit.rollout.record import TokenRecorder, sample_rows, write_rollouts
from grpokit.run.log import RunLogger, reward_metric_names
from grpokit.run.loop import run_training
from grpokit.run.preflight import check_context, check_positions, check_tracker_login
from grpokit.run.state import RunState, StopOnSignals
from grpokit.train.advantages import batch_advantages
from grpokit.train.costs import step_costs
from grpokit.train.critic import Critic
from grpokit.train.distributed import Distributed
from grpokit.train.learner import Learner, load_model
from grpokit.train.mismatch import MismatchCorrection, MismatchGuard
from grpokit.train.teacher import Teacher, teacher_metrics
from grpokit.train.update import PolicyUpdate


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
    transformers.TrainerCallback objects with their events and control.should_training_stop.

    sampler, updater, critic: the classes the parts are built from (``Sampler``, ``PolicyUpdate``,
    ``Critic``); a subclass swaps a stage, as tests do to see what a stage was given.

    What a user reads or calls: ``cfg``, ``model``, ``tokenizer``, ``step``, ``log_history``,
    ``stopped_early``, ``train()``, ``train_step()``, ``evaluate()``, ``save()``, ``stop(reason)``; the parts
    are attributes too (``sampler``, ``learner``: the optimizer and schedule, ``updater``, ``critic``: PPO's
    or None, ``run``: the output folder, ``dist``).
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
        sampler: type[Sampler] = Sampler,
        updater: type[PolicyUpdate] = PolicyUpdate,
        critic: type[Critic] = Critic,
        **unexpected: Any,
    ):
        given = trl_arguments(  # grpokit's forms, or TRL's call and argument forms (grpokit.compat.trl)
            cfg, args=args, model=model, tokenizer=tokenizer, processing_class=processing_class,
            reward_functions=reward_functions, reward_funcs=reward_funcs, callbacks=callbacks, peft_config=peft_config,
            train_rows=train_rows, eval_rows=eval_rows, train_dataset=train_dataset, eval_dataset=eval_dataset,
            unexpected=unexpected,
        )  # fmt: skip
        cfg, model, tokenizer, reward_functions, callbacks, train_rows, eval_rows = given
        name_callables(cfg.rollout)  # rollout.tools given as functions (TRL's way) are kept by name
        validated(cfg)  # the CLI's checks, for a Config built in code too
        check_settings_in_use(cfg)  # lora.*, multi-turn or cache settings of a part that is off: not ignored
        check_tracker_login(cfg.train.report_to)  # wandb without a login fails now, not after the model loads
        check_vllm_installed(cfg.rollout.engine, "rollout.engine", cfg.rollout.vllm.mode)  # not after the load either
        self.cfg = cfg
        self.algo = resolve_algo(cfg)
        if cfg.rollout.temperature <= 0:
            raise ConfigError("rollout.temperature must be > 0 for training (log-probs are taken at it)")
        self.say = Notices()  # the parts' messages: the run's log while train() runs, else stderr
        torch.manual_seed(cfg.train.seed)
        self.dist = Distributed.from_env(cfg)  # torchrun: the process group (grpokit.train.distributed)
        # the output folder: not in use by another run; train() locks it until it ends (grpokit.run.lock)
        recorded = given_in_code(cfg, model=model, tokenizer=tokenizer, train_rows=train_rows, eval_rows=eval_rows,
                                 reward_functions=reward_functions)  # for config.yaml; placeholders given again
        self.run = RunState(cfg, self.dist, resume=resume, overwrite=overwrite, resolved_algo=self.algo, given=recorded)
        self.callbacks = list(callbacks)
        self.log_history: list[dict[str, float]] = []  # every step's metrics, as TRL's state.log_history

        # data
        self.train_rows, self.eval_rows = load_train_eval(cfg.data, train_rows, eval_rows)
        if (
            cfg.train.num_train_epochs
        ):  # TRL's epochs: passes over the prompts, one rollout of P prompts a step
            cfg.train.steps = math.ceil(
                cfg.train.num_train_epochs * len(self.train_rows) / cfg.rollout.prompts_per_step
            )

        # rewards, resolved before the model loads: a bad reward fails in a second
        given_rewards = reward_functions
        reward_functions, renamed = self.reward_functions(cfg, self.algo, given_rewards)
        if cfg.rollout.max_staleness:  # the sampler process resolves them again: they must reach it by name
            process_rewards = partial(sampler_rewards, cfg, self.algo, given_rewards)
            check_sendable(process_rewards, cfg.rollout.max_staleness, "the reward functions")
        check_reward_columns(self.train_rows, reward_functions, cfg.data.train or "train_rows")  # e.g. the answers
        self.reward_names = [name for name, _, _ in reward_functions]
        self.reward_weights = {name: float(weight) for name, _, weight in reward_functions}  # GDPO's weights
        # grpo_process needs a reward that scores steps (or an environment's per-turn rewards)
        check_process_setup(self.algo, reward_functions, turn_rewards=bool(cfg.rollout.environment))
        # multi-turn rollouts (rollout.tools / rollout.environment): bad tools fail before the model loads
        episodes = EpisodeSampler(cfg, reward_functions, self.algo) if multi_turn(cfg.rollout) else None
        rewards = RewardRunner(reward_functions, timeout_s=cfg.train.reward_timeout_s)
        if not cfg.rollout.max_staleness:  # (an asynchronous run scores in its sampler process)
            rewards.start()  # the reward workers set up (math-verify's process) while the model loads
        shaped = [
            n for n in self.reward_names if n != "overlong_penalty" or not self.algo.batch.overlong_shaping
        ]
        self.accuracy_name, self.accuracy_why = pick_accuracy_reward(
            shaped, cfg.train.accuracy_reward, renamed
        )
        # None: only format/length rewards (TRL's quickstart reward_len): no accuracy metric, no evaluation
        self.accuracy_fn = dict((n, f) for n, f, _ in reward_functions).get(self.accuracy_name)
        if self.accuracy_fn is None:
            self.eval_rows = []
        if self.eval_rows and cfg.eval.enabled:  # held-out rows are scored by the accuracy reward
            check_reward_columns(self.eval_rows, [(self.accuracy_name, self.accuracy_fn, 1.0)], cfg.data.eval or "eval_rows")

        # the model's config.json, its tokenizer, the prompts against its positions and the checkpoint to
        # resume from, all checked before the model loads
        if model is None:
            model_config, source = read_model_config(cfg.model), cfg.model.name_or_path
            early_tokenizer = load_tokenizer_checked(cfg.model)
        else:
            given_config = getattr(model, "config", None)
            model_config, source = (given_config.to_dict() if given_config else None), "the given model"
            early_tokenizer = tokenizer
        check_positions(cfg, model_config, source)
        encoded = encode_rows(cfg.data, self.train_rows, early_tokenizer)  # a prompt too long fails here
        held_out = self.eval_rows if self.eval_rows and cfg.eval.enabled else []
        eval_lengths = (
            [len(ids) for ids in encode_rows(cfg.data, held_out, early_tokenizer)] if held_out else []
        )
        check_context(cfg, [len(ids) for ids in encoded], eval_lengths, model_config, source)
        self.run.pick_checkpoint(resume, allow_changed_config)

        # the parts: policy (model, precision, optimizer), sampler, update, critic
        model, self.tokenizer, precision, device = load_model(cfg, model, tokenizer)
        self.run.check_resumable(model, auto=resume is True)  # weights of another architecture: skipped
        check_tokenizer_fits(model, self.tokenizer, "the tokenizer")
        # a reference for a KL in the loss or in the reward (with LoRA: the base, adapter disabled)
        self.ref_model = frozen_reference(model, cfg.lora.enabled) if self.algo.uses_reference else None
        # on-policy distillation (algo.teacher_kl_coef > 0): a frozen teacher scores the student's tokens
        self.teacher = Teacher.build(cfg, self.algo, self.tokenizer, device, precision)
        self.dist.wrap(model, self.ref_model, self.run.resume_from)  # torchrun: FSDP2 / DDP
        if episodes is not None:
            episodes.check_tokenizer(self.tokenizer)  # a template that cannot render tools or turns
        self.sampler = sampler(
            cfg,
            self.algo,
            model,
            self.tokenizer,
            self.train_rows,
            rewards,
            self.reward_names,
            dist=self.dist,
            has_critic=self.algo.uses_critic,
            episodes=episodes,
            encoded=encoded,
            say=self.say,
        )
        self.learner = Learner(
            model,
            precision,
            device,
            cfg.optim,
            self.dist,
            total_steps=cfg.train.steps,
            say=self.say,
            make_room=self.sampler.generator.release,  # an OOM in the update first frees the KV cache
        )
        self.updater = updater(
            self.learner,
            self.algo,
            cfg.optim,
            temperature=cfg.rollout.temperature,
            seed=cfg.train.seed,
            dist=self.dist,
            ref_model=self.ref_model,
            correction=MismatchCorrection.from_settings(cfg.rollout),  # rollout.mismatch_correction
            behaviour_ratio=bool(cfg.rollout.max_staleness) and cfg.rollout.async_ratio == "behaviour",
        )
        self.mismatch = MismatchGuard(cfg.rollout.max_sampler_kl, self.say, cfg.rollout.max_staleness)  # train.mismatch
        self.critic = critic.build(self.learner, cfg, self.algo, self.dist) if self.algo.uses_critic else None
        self.step = 0
        self.stopped_early: str | None = None  # why the run ended before train.steps (not an error)
        self._log: RunLogger | None = None  # the run's log while train() runs: samples go there
        self._stop: StopOnSignals | None = None  # the run's signals while train() runs (begin)
        # rollout.max_staleness >= 1: batches made by a sampler process beside the update (grpokit.collect.async_sampler;
        # torchrun: one per rank for its share, grpokit.collect.async_ranks); None: the synchronous loop
        self.async_sampler = None
        if cfg.rollout.max_staleness:
            policy = sampling_weights(self.dist, self.model, self.step)  # fsdp: the unsharded copy
            self.async_sampler = AsyncSampler(
                sampler_for_process(self.sampler, self.dist, policy), policy, rewards=process_rewards,
                max_staleness=cfg.rollout.max_staleness, sync_every=cfg.rollout.sync_every, version=self.step,
                # the reference's log-probs made in the process, beside the update (a CPU run; not fsdp)
                reference=sampler_reference(cfg, self.algo, self.dist, device, self.ref_model, precision),
                timeout_s=cfg.rollout.sampler_timeout_s,
            )  # fmt: skip
        if self.run.resume_from is not None:  # every part built: each takes its piece of the checkpoint
            self.restore(self.run.load_resume_state())
        # what evaluation decodes with: the sampler's engine; but when the sampler process owns an engine that holds
        # its own weights (vLLM's; rollout.max_staleness >= 1), the fast engine over the trainer's own weights: the
        # trainer's engine would start for evaluation alone, a second copy beside the process's (on a GPU, in the
        # same memory)
        self.eval_generator = self.sampler.generator
        if self.async_sampler is not None and engine_class(cfg.rollout.engine).holds_weights:
            self.eval_generator = FastGenerator(kv_cache=cfg.rollout.kv_cache, cuda_graphs=cfg.rollout.cuda_graphs)

    @property
    def model(self) -> torch.nn.Module:
        """The policy being trained (under torchrun: this rank's FSDP shards, or its DDP replica)."""
        return self.learner.model

    @staticmethod
    def reward_functions(
        cfg: Config, algo, given: list[tuple[str, Any, float]] | None
    ) -> tuple[list, dict[str, str]]:
        """(name, fn, weight) per reward: the given ones or cfg.rewards', those the environments bring (a
        verifiers rubric's functions: grpokit.rollout.episodes.environment_rewards), the overlong penalty when
        the preset (``algo``, resolved) shapes lengths, named by function in metrics ("my_rewards.py:brevity"
        logs reward/brevity/mean); and {name as given: name in metrics}."""
        # problems with cfg.rewards name their rewards[i] entry
        functions = given if given is not None else resolve_reward_specs(cfg.rewards)
        # the rewards environments bring (a verifiers rubric: each function with its weight)
        functions = [*functions, *environment_rewards(cfg.rollout, [name for name, _, _ in functions])]
        if algo.batch.overlong_shaping:
            r = cfg.rollout
            budget = r.max_new_tokens
            if multi_turn(r):  # the model's tokens of a whole episode against the episode's budget
                budget = r.max_episode_tokens or r.max_turns * r.max_new_tokens
            shaping = resolve_reward(
                "overlong_penalty",
                max_len=budget,
                buffer_len=algo.batch.overlong_buffer,
            )
            functions = [*functions, ("overlong_penalty", shaping, 1.0)]
        given_names = [name for name, _, _ in functions]
        renamed = dict(zip(given_names, reward_metric_names(given_names)))
        return [(renamed[name], fn, weight) for name, fn, weight in functions], renamed

    # ----------------------------------------------------------------------------- checkpoints

    def checkpoint_state(self) -> dict[str, Any]:
        """Every part's own state, by its trainer_state.pt key; ``restore`` gives each its piece back (the two are
        the one path a checkpoint's state takes). The learner's (weights, optimizer wherever it lives,
        schedule, loss scale), the step, the clock and the RNG states are RunState.save's.

            stream           the prompt stream's position (an asynchronous run: after the last batch taken)
            spread           the spread check's memory: flat steps in a row, best reward so far (Sampler)
            critic           PPO's critic's optimizer, schedule and scaler (its weights: the critic/ folder)
            entropy_control  the entropy bonus's adaptive coefficient
            mismatch         the sampler/trainer KL watch's run of steps above its limit
            async            the sampler process's last push and batches in flight (AsyncSampler; torchrun:
                             every rank's, grpokit.collect.async_ranks)"""
        sampler = self.sampler
        state: dict[str, Any] = {
            "stream": sampler.stream.state(),
            "spread": sampler.spread_state(),
            "critic": self.critic.state() if self.critic else None,
            "entropy_control": self.updater.entropy_state(),
            "mismatch": self.mismatch.state(),
        }
        if self.async_sampler is not None:  # waits for the batches in flight (while its process lives)
            own = self.async_sampler.checkpoint_state(self.step)
            state["stream"] = own["stream"]
            state["async"] = checkpoint_over_ranks(self.dist, own)
        return state

    def restore(self, state: dict[str, Any]) -> None:
        """Every part takes its own piece of a checkpoint's trainer_state.pt (``checkpoint_state``; RunState's
        ``load_resume_state`` has checked the world size and restored the RNG and the clock), once every part
        is built, so that nothing built after it replaces what it restored. A piece a checkpoint of an
        older grpokit lacks leaves its part as built."""
        # the weights (under torchrun loaded before sharding, dist.wrap), optimizer (its offloaded copies synced)
        self.learner.load_state(state, weights_from=None if self.dist.active else self.run.resume_from)
        if self.critic is not None:
            self.critic.load(state, self.run.resume_from)  # PPO's critic/ folder and optimizer
        self.step = state["step"]
        self.sampler.stream.load_state(state["stream"])
        self.sampler.load_spread_state(state.get("spread"))
        self.updater.load_entropy_state(state.get("entropy_control"))  # the entropy bonus's adaptive coefficient
        self.mismatch.load_state(state.get("mismatch"))
        self.log_history = self.run.logged_history(self.step)  # reward functions' trainer_state, callbacks
        if self.async_sampler is None:
            return
        own = rank_state(self.dist, state.get("async"))  # torchrun: this rank's prompt position and batches
        if own and own.get("stream"):
            self.sampler.stream.load_state(own["stream"])
        policy = sampling_weights(self.dist, self.model, self.step)  # the restored weights (fsdp: gathered)
        lost = self.async_sampler.load_state(own, policy, self.step, self.sampler.stream.state())
        if lost:
            r = self.cfg.rollout
            self.say(
                f"resuming an asynchronous run at step {self.step}: the {lost} batch(es) its sampler process had "
                f"made or was making ({lost * r.prompts_per_step * r.group_size} samples) were not in the checkpoint "
                f"(its process had ended or stalled, or an older grpokit wrote it); they are made again from the "
                f"weights of step {self.step}, so this run departs from the uninterrupted one."
            )

    # ----------------------------------------------------------------------------- the run

    def train(self) -> dict[str, Any]:
        """Run cfg.train.steps steps (grpokit.run.loop); returns the summary also written to
        OUTPUT/summary.json. SIGINT/SIGTERM stop the run at the end of the current step with a checkpoint;
        the summary then holds ``stopped_by`` (the signal's name) and is not written (a second Ctrl-C stops
        at once)."""
        try:
            return run_training(self)
        finally:  # an asynchronous run's sampler process ends with the run, however it ends
            if self.async_sampler is not None:
                self.async_sampler.close()

    def begin(self, log: RunLogger, stop: StopOnSignals | None = None) -> None:
        """The run's log is open (grpokit.run.loop): the parts' messages and the samples go there. ``stop``: the
        run's signal handling (a signal sent to the sampler process stops the run through it)."""
        self._log = self.say.log = log
        self._stop = stop
        if self.async_sampler is not None:  # the first batch is made while the trainer evaluates
            self.async_sampler.start(self.log_history)
            r = self.cfg.rollout
            log.print(
                f"asynchronous rollouts: sampler process {self.async_sampler.pid}, batches at most "
                f"{r.max_staleness} step(s) old, weights pushed every {r.sync_every} step(s)"
            )
        prompts = [row[self.cfg.data.prompt_column] for row in self.train_rows]
        if self.sampler.episodes is not None:  # episodes render every prompt with the chat template
            log.print(f"prompts: {self.sampler.episodes.describe_prompts(len(prompts))}")
        else:
            log.print(f"prompts: {describe_templates(prompts, self.cfg.data.template)}")  # TRL's convention or not
        if self.accuracy_name is None:  # TRL's behaviour: train on the rewards given, say what is missing
            log.print(f"accuracy: {self.accuracy_why}")
        else:
            log.print(f"accuracy: reward {self.accuracy_name!r} ({self.accuracy_why})")  # never a format reward

    def finish(self, summary: dict[str, Any], final: Path) -> None:
        """An asynchronous run's samples dropped for their age (rollout.max_staleness) go into the summary."""
        if self.async_sampler is not None:  # torchrun: every rank's
            dropped = self.dist.reduce({"dropped": float(self.async_sampler.dropped_total)}, {"dropped": "sum"})
            summary["async_dropped_samples"] = int(dropped["dropped"])

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
        # sample and score: N = P*G rows (this rank's share), rewards (N,)
        if self.async_sampler is None:
            batch, timing, sampling = self.sampler.sample_batch(step, self.log_history)
            overlap = {}
        else:  # made by the sampler process beside the last update: at most rollout.max_staleness steps old
            try:
                batch, timing, sampling, overlap = self._take_async(step)
            except StopRequested:  # a signal while it waited: the run stops at the last step taken
                self._sampler_signal()
                return {}
        everyone = batch.across_ranks(dist)  # torchrun: every rank's rows, for the spread check and metrics
        # raises FlatRewardsError if stuck; not with a teacher, whose dense advantage teaches with flat rewards
        solved = self.sampler.check_spread(everyone, step) if self.teacher is None else None
        if solved:
            self.stopped_early = solved  # the prompts are solved: the step is not taken
            return {}
        t_update = time.perf_counter()
        # the log-probs before the update, (N, Lc) or None: the ratio's denominator, the reference's for a KL
        # (an asynchronous run's batch may come with the reference's: its sampler process's seconds are in timing)
        old_logprobs, ref_logprobs, ref_seconds = self.updater.rollout_logprobs(batch.rollout, batch.ref_logprobs)
        timing["reference"] = timing.get("reference", 0.0) + ref_seconds
        values = self.critic.values(batch.rollout) if self.critic else None  # (N, Lc) PPO, else None
        G = cfg.rollout.group_size
        # the teacher's log-probs of the student's tokens (N, Lc): on-policy distillation, else None
        teacher_logprobs = self.teacher.logprobs(self.model, batch.rollout) if self.teacher else None
        advantages = batch_advantages(  # (N,) or (N, Lc)
            batch, self.algo, G, old_logprobs, ref_logprobs, values, device=device, dist=dist,
            reward_weights=self.reward_weights, teacher_logprobs=teacher_logprobs,
        )
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
        if self.async_sampler is not None:  # the sampler process gets the new weights every rollout.sync_every steps
            self.async_sampler.trained(sampling_weights(self.dist, self.model, self.step), self.step)
            self._sampler_signal()  # a signal sent to its process: this is the run's last step
        # metrics: the global batch's under torchrun
        abs_mean = advantage_abs_mean(advantages, batch.rollout.completion_mask, dist)
        metrics = step_metrics(everyone, abs_mean, update_metrics, sampling, self.accuracy_name)
        if teacher_logprobs is not None:  # teacher/kl: the student's per-token reverse KL to the teacher
            metrics.update(teacher_metrics(old_logprobs, teacher_logprobs, batch.rollout.completion_mask, dist))
        generated = float(batch.rollout.completion_mask.sum())
        metrics.update(step_costs(time.perf_counter() - t0, generated, device, dist, timing))
        if overlap:  # async/*: staleness, dropped samples, queue depth, how busy each side was
            overlap["async/trainer_busy"] = 1.0 - overlap["async/wait_s"] / metrics["time/step"]
            metrics.update(overlap)
        if self.async_sampler is None:  # else the sampler process's engine's, sent with the batch (overlap)
            metrics.update(rollout_metrics(self.sampler.generator))  # rollout/cuda_graphs, rollout/static_kv_cache
        metrics.update(self.sampler.episode_metrics())  # multi-turn: episode/turns_mean, tools/calls...
        self.mismatch.check(metrics, self.step)  # the sampler drifting from the trainer: a notice, then a stop
        with_trl_names(metrics)  # TRL's names beside ours where they mean the same (grpokit.compat.trl.names)
        if sampled:
            self._save_samples(batch, advantages, record)
        return metrics

    def _take_async(
        self, step: int
    ) -> tuple[ScoredBatch, dict[str, float], dict[str, float], dict[str, float]]:
        """The asynchronous sampler's next batch, with the steps logged so far for its reward functions. Its
        process dying or stalling, or the user's code failing there, stops the run (with a checkpoint:
        grpokit.run.loop.take_step; torchrun: on every rank, grpokit.collect.async_ranks); a signal (to this process or to the sampler's) while it waits
        raises StopRequested (one process: under torchrun the ranks take their batches in step)."""
        sampler = self.async_sampler
        stopping = None
        if not self.dist.active:
            stopping = lambda: bool(self._stop and self._stop.signal_name) or bool(sampler.signal_name())  # noqa: E731
        try:
            batch, timing, sampling, overlap = sampler.take(
                step, log_history=self.log_history, agree=agree_on_age(self.dist), stopping=stopping
            )
        except (TrainingError, ConfigError) as e:
            say_died(self.dist, e)  # the other ranks wait for this batch's agreement: they stop too
            e.every_rank = True  # so every rank saves the checkpoint (grpokit.run.loop.take_step)
            raise
        sampling, overlap = taken_over_ranks(self.dist, sampling, overlap)
        return batch, timing, sampling, overlap

    def _sampler_signal(self) -> None:
        """A SIGTERM or SIGINT sent to the sampler process stops the run as one sent to the trainer does."""
        name = self.async_sampler.signal_name() if self.async_sampler is not None else None
        if name and self._stop is not None:
            self._stop.request(name, f"sent to the sampler process {self.async_sampler.pid}")

    # ----------------------------------------------------------------------------- samples, eval, io

    def save(self) -> Path:
        """Checkpoint this step (grpokit.run.state): the policy, its optimizer and schedule, and every part's own
        state (``checkpoint_state``); PPO's critic in its folder."""
        subfolders = self.critic.folders() if self.critic else {}
        return self.run.save(self.step, self.learner, self.tokenizer, self.checkpoint_state(), subfolders)

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

    def evaluate(self, examples: list[dict] | None = None) -> dict[str, float]:
        """Held-out accuracy (greedy pass@1) and mean/pass/maj@k on ``eval_rows``, scored by the accuracy
        reward (grpokit.rollout.evaluate; multi-turn: greedy episodes). ``examples`` receives the first greedy
        {prompt, completion, score}. Before training (step 0), every row scoring 0 is warned about."""
        examples = [] if examples is None else examples
        model, cfg, eos_ids = self.model, self.cfg, self.sampler.eos_ids
        was = model.training
        generating = self.dist.generation_model(model, self.step)
        if self.sampler.episodes is not None:  # multi-turn: greedy episodes scored on their transcripts
            result = self.sampler.episodes.evaluate(
                self.eval_generator, generating, self.tokenizer, self.eval_rows, self.accuracy_fn,
                eos_token_ids=eos_ids, seed=cfg.train.seed, examples=examples, progress=self.say,
            )  # fmt: skip
        else:
            result = evaluate(
                generating,
                self.tokenizer,
                self.eval_rows,
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
            )
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


def sampler_rewards(
    cfg: Config, algo, given: list[tuple[str, Any, float]] | None
) -> list[tuple[str, Any, float]]:
    """The run's reward functions again, in an asynchronous run's sampler process (a fresh interpreter,
    grpokit.collect.async_sampler): ``given`` (functions given in code, which reach it by name) or cfg.rewards
    resolved there, as GRPOTrainer.reward_functions resolved them in the trainer."""
    return GRPOTrainer.reward_functions(cfg, algo, given)[0]
