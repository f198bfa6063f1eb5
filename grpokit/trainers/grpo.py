"""The GRPO training loop, in the order the data flows:

    prompts -> G completions each -> rewards -> group-relative advantages
            -> mu passes of mini-batched, gradient-accumulated clipped updates -> metrics
            -> evaluation -> checkpoint

``GRPOTrainer`` composes parts that each own their state, and passes values between them:

    Sampler      (grpokit.train.sampler)   prompts, generator, rewards     -> ScoredBatch (rollout, rewards)
    advantages   (grpokit.algos)      rewards, log-probs, values      -> advantages (N,) or (N, Lc)
    PolicyUpdate (grpokit.train.update)     rollout, advantages             -> steps the Learner, update metrics
    Learner      (grpokit.train.learner)    the policy, precision, optimizer, schedule, micro-batching
    Critic       (grpokit.train.critic)     PPO's value model, its own Learner -> values, critic metrics
    RunState     (grpokit.run.state)  the output folder, checkpoints, resume
    Distributed  (grpokit.train.distributed) torchrun's process group (a no-op in one process)

The maths lives in ``grpokit.algos``; this file only moves values between the parts.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from grpokit.algos import compute_advantages, kl_estimate
from grpokit.compat.trl.api import fire, trl_arguments
from grpokit.compat.trl.names import with_trl_names
from grpokit.config.checks import check_settings_in_use
from grpokit.config.schema import Config, ConfigError, resolve_algo, validated
from grpokit.core.errors import FlatRewardsError, TrainingError  # noqa: F401
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

# noqa F401: some of these names are only re-exported (length_sorted, AUTO_MICRO_TOKENS...): they were
# defined in this file, and code and tests import them from grpokit.trainers.grpo
from grpokit.rollout.batch import (  # noqa: F401
    ANSWER_FORMAT_HINT,
    PromptStream,
    ScoredBatch,
    batch_reward_metrics,
    concat_batches,
    flat_groups,
    flat_rewards_message,
    length_sorted,
    step_metrics,
)
from grpokit.rollout.episodes import EpisodeSampler, multi_turn, name_callables
from grpokit.rollout.evaluate import evaluate
from grpokit.rollout.generation import Rollout, rollout_metrics
from grpokit.rollout.record import TokenRecorder, sample_rows, write_rollouts
from grpokit.run.lock import run_holding_lock
from grpokit.run.log import RunLogger, reward_metric_names
from grpokit.run.preflight import check_context, check_positions, check_tracker_login
from grpokit.run.state import RunState, StopOnSignals, run_callbacks  # noqa: F401
from grpokit.train.critic import Critic
from grpokit.train.distributed import Distributed
from grpokit.train.learner import AUTO_MICRO_TOKENS, Learner, load_model, peak_memory_mb  # noqa: F401
from grpokit.train.sampler import Sampler, encode_rows
from grpokit.train.update import PolicyUpdate, loss_mask


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
    """

    def __init__(
        self,
        cfg: Config,
        *,
        model=None,
        tokenizer=None,
        train_rows: list[dict] | None = None,
        eval_rows: list[dict] | None = None,
        reward_functions: list[tuple[str, Any, float]] | None = None,
        resume: bool | str | Path = False,
        overwrite: bool = False,
        allow_changed_config: bool = False,
        callbacks: Sequence[Callable[[int, dict[str, float], GRPOTrainer], Any]] = (),
        peft_config=None,
        processing_class=None,
        reward_funcs=None,
        **unexpected: Any,
    ):
        if unexpected:  # e.g. TRL's args=GRPOConfig(...)
            raise ConfigError(
                f"GRPOTrainer got {sorted(unexpected)}: grpokit takes a Config (load_config); a TRL GRPOConfig "
                "converts with grpokit.config.trl.from_trl or `grpokit config --from-trl FILE`"
            )
        cfg, model, tokenizer, reward_functions, callbacks = trl_arguments(  # TRL's argument forms
            cfg, model, tokenizer if tokenizer is not None else processing_class,
            reward_functions if reward_functions is not None else reward_funcs, callbacks, peft_config,
        )  # fmt: skip
        name_callables(cfg.rollout)  # rollout.tools given as functions (TRL's way) are kept by name
        validated(cfg)  # the CLI's checks, for a Config built in code too
        check_settings_in_use(cfg)  # lora.*, multi-turn or cache settings of a part that is off: not ignored
        check_tracker_login(cfg.train.report_to)  # wandb without a login fails now, not after the model loads
        self.cfg = cfg
        self.algo = resolve_algo(cfg)
        if cfg.rollout.temperature <= 0:
            raise ConfigError("rollout.temperature must be > 0 for training (log-probs are taken at it)")
        self.say = Notices()  # the parts' messages: the run's log while train() runs, else stderr
        torch.manual_seed(cfg.train.seed)
        self.dist = Distributed.from_env(cfg)  # torchrun: the process group (grpokit.train.distributed)
        # the output folder: not in use by another run; train() locks it until it ends (grpokit.run.lock)
        self.run = RunState(cfg, self.dist, resume=resume, overwrite=overwrite, resolved_algo=self.algo)
        self.out = self.run.out
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
        reward_functions, renamed = self._reward_functions(reward_functions)
        check_reward_columns(self.train_rows, reward_functions, cfg.data.train or "train_rows")  # e.g. the answers
        self.reward_names = [name for name, _, _ in reward_functions]
        # grpo_process needs a reward that scores steps (or an environment's per-turn rewards)
        check_process_setup(self.algo, reward_functions, turn_rewards=bool(cfg.rollout.environment))
        # multi-turn rollouts (rollout.tools / rollout.environment): bad tools fail before the model loads
        episodes = EpisodeSampler(cfg, reward_functions, self.algo) if multi_turn(cfg.rollout) else None
        rewards = RewardRunner(reward_functions, timeout_s=cfg.train.reward_timeout_s)
        shaped = [
            n for n in self.reward_names if n != "overlong_penalty" or not self.algo.batch.overlong_shaping
        ]
        self.accuracy_name, self.accuracy_why = pick_accuracy_reward(
            shaped, cfg.train.accuracy_reward, renamed
        )
        self.accuracy_fn = dict((n, f) for n, f, _ in reward_functions)[self.accuracy_name]
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
        self.dist.wrap(model, self.ref_model, self.run.resume_from)  # torchrun: FSDP2 / DDP
        if episodes is not None:
            episodes.check_tokenizer(self.tokenizer)  # a template that cannot render tools or turns
        self.sampler = Sampler(
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
            log_history=self.log_history,
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
        self.updater = PolicyUpdate(
            self.learner,
            self.algo,
            cfg.optim,
            temperature=cfg.rollout.temperature,
            seed=cfg.train.seed,
            dist=self.dist,
            ref_model=self.ref_model,
        )
        self.critic_part = (
            Critic.build(self.learner, cfg, self.algo, self.dist) if self.algo.uses_critic else None
        )
        self.step = 0
        self.stopped_early: str | None = None  # why the run ended before train.steps (not an error)
        self.log: RunLogger | None = None
        if self.run.resume_from is not None:
            self._resume()

    def _reward_functions(self, given: list[tuple[str, Any, float]] | None) -> tuple[list, dict[str, str]]:
        """(name, fn, weight) per reward: the given ones or cfg.rewards', the overlong penalty when the preset
        shapes lengths, named by function in metrics ("my_rewards.py:brevity" logs reward/brevity/mean);
        and {name as given: name in metrics}."""
        cfg = self.cfg
        # problems with cfg.rewards name their rewards[i] entry
        functions = given if given is not None else resolve_reward_specs(cfg.rewards)
        if self.algo.batch.overlong_shaping:
            r = cfg.rollout
            budget = r.max_new_tokens
            if multi_turn(r):  # the model's tokens of a whole episode against the episode's budget
                budget = r.max_episode_tokens or r.max_turns * r.max_new_tokens
            shaping = resolve_reward(
                "overlong_penalty",
                max_len=budget,
                buffer_len=self.algo.batch.overlong_buffer,
            )
            functions = [*functions, ("overlong_penalty", shaping, 1.0)]
        given_names = [name for name, _, _ in functions]
        renamed = dict(zip(given_names, reward_metric_names(given_names)))
        return [(renamed[name], fn, weight) for name, fn, weight in functions], renamed

    def _resume(self) -> None:
        """Every part takes its own piece of the checkpoint being resumed."""
        state = self.run.load_resume_state()  # checks the world size, restores this rank's RNG
        # under torchrun the weights were loaded before sharding (dist.wrap)
        self.learner.load_state(state, weights_from=None if self.dist.active else self.run.resume_from)
        if self.critic_part is not None:
            self.critic_part.load(state, self.run.resume_from)  # PPO's critic/ folder and optimizer
        self.sampler.stream.load_state(state["stream"])
        self.step = state["step"]

    # ----------------------------------------------------------------------------- the parts, as attributes

    # read-only views kept for code and tests written against the single-class trainer
    model = property(lambda self: self.learner.model)
    optimizer = property(lambda self: self.learner.optimizer)
    scheduler = property(lambda self: self.learner.scheduler)
    scaler = property(lambda self: self.learner.scaler)
    precision = property(lambda self: self.learner.precision)
    device = property(lambda self: self.learner.device)
    uses_reference = property(lambda self: self.algo.uses_reference)
    resume_from = property(lambda self: self.run.resume_from)
    output_lock = property(lambda self: self.run.lock)  # (grpokit.run.lock's decorators read it)
    episodes = property(lambda self: self.sampler.episodes)
    rewards = property(lambda self: self.sampler.rewards)
    encoded = property(lambda self: self.sampler.encoded)
    stream = property(lambda self: self.sampler.stream)
    generator = property(lambda self: self.sampler.generator)
    flat_steps = property(lambda self: self.sampler.flat_steps)
    critic = property(lambda self: self.critic_part.model if self.critic_part else None)
    critic_optimizer = property(lambda self: self.critic_part.learner.optimizer if self.critic_part else None)

    @property
    def eos_ids(self) -> list[int]:
        return self.sampler.eos_ids

    @eos_ids.setter
    def eos_ids(self, ids: list[int]) -> None:
        self.sampler.eos_ids = ids

    # ----------------------------------------------------------------------------- the loop

    @run_holding_lock
    def train(self) -> dict[str, Any]:
        """Run cfg.train.steps steps; returns the summary also written to OUTPUT/summary.json.

        SIGINT/SIGTERM stop the run at the end of the current step with a checkpoint; the summary then
        holds ``stopped_by`` (the signal's name) and is not written (a second Ctrl-C stops at once)."""
        cfg = self.cfg
        summary: dict[str, Any] = {}
        self.dist.on_main(self.run.start)
        with (
            self.dist.main_only(RunLogger)(
                self.out,
                total_steps=cfg.train.steps,
                tensorboard=cfg.train.tensorboard,
                resume=self.step > 0,
                report_to=cfg.train.report_to,
                config=dataclasses.asdict(cfg),
            ) as log,
            StopOnSignals() as stop,
        ):
            self.log = self.say.log = log
            prompts = [row[cfg.data.prompt_column] for row in self.train_rows]
            log.print(f"prompts: {describe_templates(prompts, cfg.data.template)}")  # TRL's convention or not
            log.print(
                f"accuracy: reward {self.accuracy_name!r} ({self.accuracy_why})"
            )  # never a format reward
            fire(self.callbacks, "on_train_begin", self)
            if self.eval_rows and cfg.eval.enabled and self.step == 0:
                examples: list[dict] = []
                before = self.evaluate(examples)
                log.log_eval(0, before)
                fire(self.callbacks, "on_evaluate", self, before)
                if (
                    before.get("greedy_score", 1) == 0
                    and before.get(f"mean_at_{cfg.eval.num_samples}", 0) == 0
                ):
                    ex = examples[0]
                    log.print(
                        f"WARNING evaluation before training: every held-out row scored 0 with "
                        f"'{self.accuracy_name}'. The verifier may not read this model's answer format "
                        f"({ANSWER_FORMAT_HINT}), or the task is too hard. Sample: {str(ex['prompt'])[:200]!r} -> "
                        f"{ex['completion'][:300]!r}, score {ex['score']}."
                    )
                summary["eval_accuracy_before"] = before["accuracy"]
            start = time.perf_counter()
            while self.step < cfg.train.steps and not stop.signal_name and not self.stopped_early:
                try:
                    metrics = self.train_step()
                except FlatRewardsError as e:
                    where = f" Checkpoint of step {self.step}: {self.save()}." if self.step > 0 else ""
                    raise FlatRewardsError(f"{e}{where}") from None
                if self.stopped_early:
                    break  # the step was not taken: the prompts are solved
                log.log_step(self.step, metrics)
                self.run.step_logged()  # --overwrite: the run replaced goes once this one has a step
                self.log_history.append({"step": self.step, **metrics})
                self._run_callbacks(metrics)
                stop.signal_name = self.dist.agree(stop.signal_name)  # every rank stops at the same step
                if stop.signal_name:
                    break  # the safe point: this step is done and logged
                if (
                    cfg.eval.every
                    and self.eval_rows
                    and self.step % cfg.eval.every == 0
                    and self.step < cfg.train.steps
                ):
                    during = self.evaluate()
                    log.log_eval(self.step, during)
                    fire(self.callbacks, "on_evaluate", self, during)
                if cfg.train.save_every and self.step % cfg.train.save_every == 0:
                    fire(self.callbacks, "on_save", self, self.save())
            if stop.signal_name:
                checkpoint = self.save() if self.step > 0 else None
                return {
                    "stopped_by": stop.signal_name,
                    "steps": self.step,
                    "checkpoint": checkpoint and str(checkpoint),
                }
            summary["train_seconds"] = time.perf_counter() - start
            if self.stopped_early:
                log.print(self.stopped_early)
                summary["stopped_early"] = self.stopped_early
            if self.eval_rows and cfg.eval.enabled:
                after = self.evaluate()
                log.log_eval(self.step, after)
                fire(self.callbacks, "on_evaluate", self, after)
                summary["eval_accuracy_after"] = after["accuracy"]
                summary["eval_after"] = after
            final = self.save()
            fire(self.callbacks, "on_save", self, final)
            summary.update(steps=self.step, checkpoint=str(final), output_dir=str(self.out))
            summary.update(self.run.previous_summary(summary))
            self.run.finish(summary)  # summary.json, curves.png
            fire(self.callbacks, "on_train_end", self, summary)
        return summary

    def stop(self, reason: str) -> None:
        """End the run after the current step as a finished one (final evaluation, checkpoint, summary with
        ``stopped_early``): for callbacks (a TrainerCallback's control.should_training_stop calls it)."""
        self.stopped_early = reason

    def train_step(self) -> dict[str, float]:
        """One rollout and its updates, in the order the data flows: sample -> score -> advantages -> update
        -> metrics. Each stage is a part's method given the values it needs (its docstring says which)."""
        t0 = time.perf_counter()
        batch, timing, sampling = self.sample_batch()  # ScoredBatch: rollout (N = P*G rows), rewards (N,)
        solved = self.sampler.check_spread(batch, self.step)  # raises FlatRewardsError if stuck
        if solved:
            self.stopped_early = solved  # the prompts are solved: the step is not taken
            return {}
        t_update = time.perf_counter()
        old_logprobs, ref_logprobs, timing["reference"] = self.rollout_logprobs(
            batch.rollout
        )  # (N, Lc) | None
        values = (
            self.critic_part.values(batch.rollout) if self.critic_part else None
        )  # (N, Lc) PPO, else None
        advantages = self.advantages(batch, old_logprobs, ref_logprobs, values)  # (N,) or (N, Lc)
        # the steps whose rollouts are saved: the update records its per-token numbers (grpokit.rollout.record)
        sampled = self.cfg.train.samples_every and (self.step + 1) % self.cfg.train.samples_every == 0
        record = TokenRecorder(*batch.rollout.completion_ids.shape) if sampled and self.dist.is_main else None
        if self.policy_trains():
            update_metrics, _ = self.update(batch, advantages, old_logprobs, ref_logprobs, record=record)
        else:  # PPO's critic warm-up: the policy waits; log what its update would have
            update_metrics = self._warmup_metrics(batch, old_logprobs, ref_logprobs)
        update_metrics.update(self.critic_update(batch, values, old_logprobs, ref_logprobs))  # critic/*
        timing["update"] = time.perf_counter() - t_update - timing["reference"]
        self.step += 1
        self.learner.scheduler.step()
        metrics = self._step_metrics(batch, advantages, update_metrics, sampling)
        step_seconds = time.perf_counter() - t0
        metrics.update({f"time/{k}": v for k, v in timing.items()})
        metrics["time/step"] = step_seconds
        generated = float(batch.rollout.completion_mask.sum())
        metrics["tokens_per_s"] = generated / step_seconds
        metrics["peak_memory_mb"] = peak_memory_mb(self.device)
        metrics.update(
            rollout_metrics(self.sampler.generator)
        )  # rollout/cuda_graphs, rollout/static_kv_cache
        metrics.update(self.sampler.episode_metrics())  # multi-turn: episode/turns_mean, tools/calls...
        self.dist.finish_metrics(metrics)
        with_trl_names(metrics)  # TRL's names beside ours where they mean the same (grpokit.compat.trl.names)
        if sampled:
            self._save_samples(batch, advantages, record)
        return metrics

    # ----------------------------------------------------------------------------- the stages

    def sample_batch(self) -> tuple[ScoredBatch, dict[str, float], dict[str, float]]:
        """(batch, timing, sampling metrics) of this step (grpokit.train.sampler), scored by ``self.score``."""
        return self.sampler.sample_batch(self.step, score=self.score)

    def rollout(self, prompt_ids: list[list[int]], **kwargs) -> Rollout:
        return self.sampler.rollout(prompt_ids, step=self.step, **kwargs)

    def score(self, rollout: Rollout, rows: list[dict]) -> ScoredBatch:
        return self.sampler.score(rollout, rows, step=self.step)

    def rollout_logprobs(self, r: Rollout) -> tuple[torch.Tensor | None, torch.Tensor | None, float]:
        """(old_logprobs, ref_logprobs, seconds spent on the reference): ``PolicyUpdate.rollout_logprobs``."""
        return self.updater.rollout_logprobs(r)

    def advantages(
        self,
        batch: ScoredBatch,
        old_logprobs: torch.Tensor | None,
        ref_logprobs: torch.Tensor | None,
        values=None,
    ) -> torch.Tensor:
        """(N,) or (N, Lc) advantages from the preset's estimator. With a KL in the reward (kl_reward_coef
        > 0) the estimator also gets k1 = old - ref per token, the sampling policy's KL to the reference."""
        kl_coef = self.algo.kl.reward_coef
        kl = None
        if kl_coef > 0:
            kl = kl_estimate(old_logprobs, ref_logprobs, "k1").to(self.device)  # (N, Lc)
        d = self.device
        return self.dist.advantages(  # torchrun: batch-wide estimators see every rank's rows
            compute_advantages,
            batch.rewards.to(d),
            self.cfg.rollout.group_size,
            self.algo,
            completion_mask=batch.rollout.completion_mask.to(d),
            kl=kl,
            kl_coef=kl_coef,
            old_logprobs=old_logprobs.to(d) if old_logprobs is not None else None,
            ref_logprobs=ref_logprobs.to(d) if ref_logprobs is not None else None,
            values=values.to(d) if values is not None else None,
            step_rewards=batch.step_rewards,
            scored=batch.scored.to(d),  # rows no reward function scored: out of the statistics, advantage 0
            # algo.mask_truncated: per-token whitening over the tokens the loss trains on
            trained_mask=loss_mask(batch.rollout, True).to(d) if self.algo.batch.mask_truncated else None,
        )

    def update(
        self,
        batch: ScoredBatch,
        advantages: torch.Tensor,
        old_logprobs: torch.Tensor | None = None,
        ref_logprobs: torch.Tensor | None = None,
        record: TokenRecorder | None = None,
    ) -> tuple[dict[str, float], float]:
        """The policy's update on this step's batch (``PolicyUpdate.update``): metrics, seconds on the reference.
        ``record``: the TokenRecorder to fill with the per-token numbers (train_step gives one on the steps
        whose rollouts are saved)."""
        return self.updater.update(
            batch.rollout,
            advantages,
            old_logprobs,
            ref_logprobs,
            step=self.step,
            clip_and_step=self._clip_and_step,
            record=record,
        )

    def _lr_factor(self, step: int) -> float:
        return self.learner.lr_factor(step)

    def _clip_and_step(self, finite: bool) -> float | None:
        return self.learner.clip_and_step(finite, self.step)

    def policy_trains(self) -> bool:
        """False during PPO's critic warm-up (critic.warmup_steps): only the critic is updated then."""
        return self.critic_part is None or self.critic_part.policy_trains(self.step)

    def critic_update(self, batch: ScoredBatch, values, old_logprobs, ref_logprobs) -> dict[str, float]:
        """PPO's critic update (``Critic.update``): critic/* metrics, {} without a critic."""
        if self.critic_part is None:
            return {}
        return self.critic_part.update(batch, values, old_logprobs, ref_logprobs, step=self.step)

    def _warmup_metrics(self, batch: ScoredBatch, old_logprobs, ref_logprobs) -> dict[str, float]:
        """What a skipped policy update would have logged: lr and the KL of the samples to the reference."""
        metrics = {"lr": self.learner.scheduler.get_last_lr()[0]}
        if ref_logprobs is not None and old_logprobs is not None:
            mask = loss_mask(batch.rollout, self.algo.batch.mask_truncated).bool()  # (N, Lc)
            kl = kl_estimate(old_logprobs, ref_logprobs, self.algo.kl.kind)  # (N, Lc)
            metrics["kl"] = float(kl[mask].mean()) if mask.any() else 0.0
        return metrics

    # ----------------------------------------------------------------------------- metrics, eval, io

    def _step_metrics(self, batch: ScoredBatch, advantages, update_metrics, sampling) -> dict[str, float]:
        return self.dist.step_metrics(batch, advantages, update_metrics, sampling, self.accuracy_name)

    def save(self) -> Path:
        """Checkpoint this step (grpokit.run.state): the policy, its optimizer, the prompt stream, the critic."""
        critic = self.critic_part
        state = {"stream": self.sampler.stream.state(), "critic": critic.state() if critic else None}
        subfolders = critic.folders() if critic else {}
        return self.run.save(self.step, self.learner, self.tokenizer, state, subfolders)

    def _run_callbacks(self, metrics: dict[str, float]) -> None:
        run_callbacks(self, metrics)  # one that raises: checkpoint, TrainingError (grpokit.run.state)

    def _save_samples(
        self, batch: ScoredBatch, advantages: torch.Tensor, record: TokenRecorder | None
    ) -> None:
        """samples/step_N.jsonl: every completion with its rewards and advantage (TRL's log_completions, also a
        W&B table); rollouts/step_N.parquet: the same with the per-token numbers ``record`` holds."""
        G, column = self.cfg.rollout.group_size, self.cfg.data.prompt_column
        self.log.log_samples(self.step, sample_rows(batch, advantages, G, column))
        if record is not None:
            write_rollouts(
                self.out, self.step, batch, record, advantages=advantages, group_size=G,
                prompt_column=column, tokenizer=self.tokenizer, algo=self.algo,
            )  # fmt: skip

    def evaluate(self, examples: list[dict] | None = None) -> dict[str, float]:
        was = self.model.training
        if self.episodes is not None:  # multi-turn: greedy episodes scored on their transcripts
            result = self.episodes.evaluate(
                self.sampler.generator, self.dist.generation_model(self.model, self.step), self.tokenizer,
                self.eval_rows, self.accuracy_fn, eos_token_ids=self.eos_ids, seed=self.cfg.train.seed,
                examples=examples,
            )  # fmt: skip
            self.model.train(was)
            return result
        result = evaluate(
            self.dist.generation_model(self.model, self.step),
            self.tokenizer,
            self.eval_rows,
            accuracy_fn=self.accuracy_fn,
            generator=self.sampler.generator,
            data_cfg=self.cfg.data,
            eos_token_ids=self.eos_ids,
            num_samples=self.cfg.eval.num_samples,
            temperature=self.cfg.eval.temperature,
            max_new_tokens=self.cfg.eval.max_new_tokens or self.cfg.rollout.max_new_tokens,
            seed=self.cfg.train.seed,
            examples=examples,
            split=self.dist if self.dist.active else None,
        )
        self.model.train(was)
        return result
