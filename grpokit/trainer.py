"""The GRPO training loop, in the order the data flows:

    prompts -> G completions each -> rewards -> group-relative advantages
            -> mu passes of mini-batched, gradient-accumulated clipped updates -> metrics
            -> evaluation -> checkpoint

The maths lives in ``grpokit.algos``; this file only moves tensors between the pieces. Around the loop:
``grpokit.batch`` (the scored batch and its metrics), ``grpokit.update`` (micro-batches, the optimizer
step) and ``grpokit.run_state`` (checkpoints, resume, signals, what a run writes).
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from grpokit.algos import compute_advantages, kl_estimate

# noqa F401: some of these names are only re-exported (length_sorted, AUTO_MICRO_TOKENS...): they were
# defined in this file, and code and tests import them from grpokit.trainer
from grpokit.batch import (  # noqa: F401
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
from grpokit.checkpoint import resumable_for_model
from grpokit.config import Config, ConfigError, resolve_algo, validated
from grpokit.critic import CriticMixin
from grpokit.data import load_train_eval
from grpokit.distributed import Distributed
from grpokit.episodes import EpisodeSampler, multi_turn, name_callables
from grpokit.errors import FlatRewardsError, TrainingError  # noqa: F401
from grpokit.evaluate import evaluate
from grpokit.generation import FastGenerator, HFGenerator, Rollout, rollout_metrics
from grpokit.loading import (
    check_tokenizer_fits,
    eos_token_ids,
    frozen_reference,
    load_policy,
    load_tokenizer_checked,
    pick_device,
    prepare_policy,
    read_model_config,
)
from grpokit.output_lock import (
    claim_output_dir,
    discard_aside,
    is_main_rank,
    run_holding_lock,
)
from grpokit.precision import make_grad_scaler, make_optimizer, resolve_precision
from grpokit.rewards import RewardRunner, resolve_reward, resolve_reward_specs
from grpokit.rewards.process import check_process_setup
from grpokit.rewards.which_accuracy import pick_accuracy_reward
from grpokit.rollout_record import TokenRecorder
from grpokit.run_state import RunStateMixin, StopOnSignals  # noqa: F401
from grpokit.runlog import RunLogger, reward_metric_names
from grpokit.sampling import SamplingMixin
from grpokit.schedules import lr_factor, warmup_steps
from grpokit.templates import describe_templates, encode_prompts
from grpokit.trl_api import fire, trl_arguments
from grpokit.trl_names import with_trl_names
from grpokit.update import AUTO_MICRO_TOKENS, MicroBatchMixin, peak_memory_mb  # noqa: F401
from grpokit.update_stats import UpdateStats
from grpokit.validate import check_context, check_positions, check_tracker_login


class GRPOTrainer(SamplingMixin, RunStateMixin, MicroBatchMixin, CriticMixin):
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
    ``trainer.stop(reason)`` ends it cleanly instead. TRL's forms are taken too (grpokit.trl_api): model as a
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
                "converts with grpokit.trl_config.from_trl or `grpokit config --from-trl FILE`"
            )
        cfg, model, tokenizer, reward_functions, callbacks = trl_arguments(  # TRL's argument forms
            cfg, model, tokenizer if tokenizer is not None else processing_class,
            reward_functions if reward_functions is not None else reward_funcs, callbacks, peft_config,
        )  # fmt: skip
        name_callables(cfg.rollout)  # rollout.tools given as functions (TRL's way) are kept by name
        validated(cfg)  # the CLI's checks, for a Config built in code too
        check_tracker_login(cfg.train.report_to)  # wandb without a login fails now, not after the model loads
        self.cfg = cfg
        self.algo = resolve_algo(cfg)
        if cfg.rollout.temperature <= 0:
            raise ConfigError("rollout.temperature must be > 0 for training (log-probs are taken at it)")
        self.out = Path(cfg.train.output_dir)
        # not in use by another run; train() locks it until it ends (grpokit.output_lock)
        self.output_lock = claim_output_dir(
            self.out, resume=resume is not False, overwrite=overwrite, main=is_main_rank()
        )
        self.overwrite = overwrite
        self.callbacks = list(callbacks)
        self.log_history: list[dict[str, float]] = []  # every step's metrics, as TRL's state.log_history
        torch.manual_seed(cfg.train.seed)
        self.dist = Distributed.from_env(cfg)  # torchrun: the process group (grpokit.distributed)

        # data
        self.train_rows, self.eval_rows = load_train_eval(cfg.data, train_rows, eval_rows)
        if cfg.train.num_train_epochs:  # TRL's epochs: passes over the prompts, one rollout of P prompts a step
            cfg.train.steps = math.ceil(cfg.train.num_train_epochs * len(self.train_rows) / cfg.rollout.prompts_per_step)

        # rewards, resolved before the model loads: a bad reward fails in a second
        if reward_functions is None:
            reward_functions = resolve_reward_specs(cfg.rewards)  # problems name their rewards[i] entry
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
            reward_functions = [*reward_functions, ("overlong_penalty", shaping, 1.0)]
        # named by function in metrics and plots: "my_rewards.py:brevity" logs reward/brevity/mean
        given_names = [name for name, _, _ in reward_functions]
        renamed = dict(zip(given_names, reward_metric_names(given_names)))
        reward_functions = [(renamed[name], fn, weight) for name, fn, weight in reward_functions]
        self.reward_names = [name for name, _, _ in reward_functions]
        # grpo_process needs a reward that scores steps (or an environment's per-turn rewards)
        check_process_setup(self.algo, reward_functions, turn_rewards=bool(cfg.rollout.environment))
        # multi-turn rollouts (rollout.tools / rollout.environment): bad tools fail before the model loads
        self.episodes = EpisodeSampler(cfg, reward_functions, self.algo) if multi_turn(cfg.rollout) else None
        self.rewards = RewardRunner(reward_functions, timeout_s=cfg.train.reward_timeout_s)
        shaped = [n for n in self.reward_names if n != "overlong_penalty" or not self.algo.batch.overlong_shaping]
        self.accuracy_name, self.accuracy_why = pick_accuracy_reward(shaped, cfg.train.accuracy_reward, renamed)
        self.accuracy_fn = dict((n, f) for n, f, _ in reward_functions)[self.accuracy_name]

        # the model's config.json, its tokenizer, the prompts against its positions and the checkpoint to
        # resume from, all checked before the model loads
        if model is None:
            model_config, source = read_model_config(cfg.model), cfg.model.name_or_path
            self.tokenizer = load_tokenizer_checked(cfg.model)
        else:
            given_config = getattr(model, "config", None)
            model_config, source = (given_config.to_dict() if given_config else None), "the given model"
            self.tokenizer = tokenizer
        check_positions(cfg, model_config, source)
        self.encoded = self._encode_all(self.train_rows)  # a prompt too long fails here, naming its row
        held_out = self.eval_rows if self.eval_rows and cfg.eval.enabled else []
        eval_lengths = [len(ids) for ids in self._encode_all(held_out)] if held_out else []
        check_context(cfg, [len(ids) for ids in self.encoded], eval_lengths, model_config, source)
        self.resume_from = (
            self._pick_checkpoint(resume, allow_changed_config) if resume is not False else None
        )

        # model, its weights in the dtype the precision mode keeps them in (grpokit.precision)
        if model is None:
            self.precision = resolve_precision(cfg.optim.precision, cfg.model.dtype, pick_device(cfg.model.device))
            model, tokenizer, self.device = load_policy(cfg.model, cfg.lora, self.precision.weight_dtype)
        else:
            self.device = next(model.parameters()).device
            # with model.dtype and optim.precision both auto, the given model's dtype decides
            given = str(next(model.parameters()).dtype).removeprefix("torch.")
            auto = cfg.model.dtype == "auto" and cfg.optim.precision == "auto"
            self.precision = resolve_precision(
                cfg.optim.precision, given if auto else cfg.model.dtype, self.device
            )
            for p in model.parameters():  # parameters only: buffers such as RoPE's inv_freq stay float32
                if p.is_floating_point():
                    p.data = p.data.to(self.precision.weight_dtype)
            model = prepare_policy(model, cfg.model, cfg.lora)
        self.model, self.tokenizer = model, tokenizer
        if self.resume_from is not None:  # weights of another architecture: skipped like a damaged checkpoint
            self.resume_from = resumable_for_model(self.resume_from, model, auto=resume is True)
        check_tokenizer_fits(model, tokenizer, "the tokenizer")
        # a reference for a KL in the loss or in the reward (with LoRA: the base, adapter disabled)
        self.uses_reference = self.algo.uses_reference
        self.ref_model = frozen_reference(model, cfg.lora.enabled) if self.uses_reference else None
        self.dist.wrap(self.model, self.ref_model, self.resume_from)  # torchrun: FSDP2 / DDP
        self.eos_ids = eos_token_ids(self.tokenizer, self.model)
        if self.episodes is not None:
            self.episodes.check_tokenizer(self.tokenizer)  # a template that cannot render tools or turns

        self.stream = PromptStream(list(range(len(self.train_rows))), cfg.train.seed, cfg.data.shuffle)

        # optimisation
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = make_optimizer(params, self.precision, cfg.optim, self.device)
        self.scaler = make_grad_scaler(self.precision, self.device)  # float16 loss scaling, else None
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_factor)
        self._setup_critic()  # PPO: self.critic, self.critic_optimizer (grpokit.critic); else both None
        if cfg.rollout.engine == "fast":
            self.generator = FastGenerator(kv_cache=cfg.rollout.kv_cache, cuda_graphs=cfg.rollout.cuda_graphs)
        else:
            self.generator = HFGenerator()
        self.step = 0
        self.flat_steps = 0  # consecutive steps with no reward spread in any group
        self.had_spread, self.best_reward = False, float("-inf")  # for telling "solved" from "stuck"
        self.stopped_early: str | None = None  # why the run ended before train.steps (not an error)
        self.auto_micro_rows: int | None = None  # micro_batch_size=auto on CUDA: cap after an OOM
        self.last_micro_rows = 0  # rows per micro-batch of the last forward/backward pass (a metric)
        self.log: RunLogger | None = None
        self._saved: tuple[int, Path] | None = None  # (step, path) of the last checkpoint written
        if self.resume_from is not None:
            self._resume()

    # ----------------------------------------------------------------------------- set-up helpers

    def _encode_all(self, rows: list[dict]) -> list[list[int]]:
        return encode_prompts(
            [row[self.cfg.data.prompt_column] for row in rows],
            self.tokenizer,
            template=self.cfg.data.template,
            system_prompt=self.cfg.data.system_prompt,
            max_prompt_tokens=self.cfg.data.max_prompt_tokens,
            source=self.cfg.data.train or None,
            chat_template_kwargs=self.cfg.data.chat_template_kwargs,
        )

    def _lr_factor(self, step: int) -> float:
        o, total = self.cfg.optim, self.cfg.train.steps
        return lr_factor(step, o.schedule, warmup_steps(total, o.warmup_steps, o.warmup_ratio), total)

    # ----------------------------------------------------------------------------- the loop

    @run_holding_lock
    def train(self) -> dict[str, Any]:
        """Run cfg.train.steps steps; returns the summary also written to OUTPUT/summary.json.

        SIGINT/SIGTERM stop the run at the end of the current step with a checkpoint; the summary then
        holds ``stopped_by`` (the signal's name) and is not written (a second Ctrl-C stops at once)."""
        cfg = self.cfg
        summary: dict[str, Any] = {}
        self.dist.on_main(self._start_run)
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
            self.log = log
            prompts = [row[cfg.data.prompt_column] for row in self.train_rows]
            log.print(f"prompts: {describe_templates(prompts, cfg.data.template)}")  # TRL's convention or not
            log.print(f"accuracy: reward {self.accuracy_name!r} ({self.accuracy_why})")  # never a format reward
            fire(self.callbacks, "on_train_begin", self)
            if self.eval_rows and cfg.eval.enabled and self.step == 0:
                examples: list[dict] = []
                before = self.evaluate(examples)
                log.log_eval(0, before)
                fire(self.callbacks, "on_evaluate", self, before)
                if before.get("greedy_score", 1) == 0 and before.get(f"mean_at_{cfg.eval.num_samples}", 0) == 0:
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
                if self.dist.is_main:
                    discard_aside(self.out)  # --overwrite: the run replaced goes once this one has a step
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
            summary.update(self._previous_summary(summary))
            if self.dist.is_main:
                (self.out / "summary.json").write_text(json.dumps(summary, indent=2))
                self._plot()
            fire(self.callbacks, "on_train_end", self, summary)
        return summary

    def stop(self, reason: str) -> None:
        """End the run after the current step as a finished one (final evaluation, checkpoint, summary with
        ``stopped_early``): for callbacks (a TrainerCallback's control.should_training_stop calls it)."""
        self.stopped_early = reason

    def train_step(self) -> dict[str, float]:
        """One rollout and its updates: sample -> score -> advantages -> update -> metrics."""
        t0 = time.perf_counter()
        batch, timing, sampling = self.sample_batch()
        self._check_reward_spread(batch)
        if self.stopped_early:
            return {}
        t_update = time.perf_counter()
        old_logprobs, ref_logprobs, timing["reference"] = self.rollout_logprobs(batch.rollout)  # (N, Lc) | None
        values = self.critic_values(batch.rollout)  # (N, Lc) PPO's critic before the update, else None
        advantages = self.advantages(batch, old_logprobs, ref_logprobs, values)  # (N,) or (N, Lc)
        sampled = self.cfg.train.samples_every and (self.step + 1) % self.cfg.train.samples_every == 0
        record = TokenRecorder(*batch.rollout.completion_ids.shape) if sampled and self.dist.is_main else None
        update_metrics, _ = (
            self.update(batch, advantages, old_logprobs, ref_logprobs, record=record) if self.policy_trains() else ({}, 0)
        )
        update_metrics.update(self.critic_update(batch, values, old_logprobs, ref_logprobs))  # critic/*
        timing["update"] = time.perf_counter() - t_update - timing["reference"]
        self.step += 1
        self.scheduler.step()
        metrics = self._step_metrics(batch, advantages, update_metrics, sampling)
        step_seconds = time.perf_counter() - t0
        metrics.update({f"time/{k}": v for k, v in timing.items()})
        metrics["time/step"] = step_seconds
        generated = float(batch.rollout.completion_mask.sum())
        metrics["tokens_per_s"] = generated / step_seconds
        metrics["peak_memory_mb"] = peak_memory_mb(self.device)
        metrics.update(rollout_metrics(self.generator))  # rollout/cuda_graphs, rollout/static_kv_cache
        if self.episodes is not None:  # episode/turns_mean, tools/calls, tools/errors, masked_token_frac...
            metrics.update(self.episodes.take_metrics())
        self.dist.finish_metrics(metrics)
        with_trl_names(metrics)  # TRL's names beside ours where they mean the same (grpokit.trl_names)
        if sampled:
            self._save_samples(batch, advantages, record)
        return metrics

    # ----------------------------------------------------------------------------- the update

    def rollout_logprobs(self, r: Rollout) -> tuple[torch.Tensor | None, torch.Tensor | None, float]:
        """(old_logprobs, ref_logprobs, seconds spent on the reference), each (N, Lc) or None.

        old: the policy's own log-probs before any update, needed by more than one pass (the ratio's
        denominator) or by a KL in the reward (its k1 = old - ref). ref: whenever there is a reference,
        so the KL is logged even when only the reward uses it."""
        needs_old = self._several_passes() or self.algo.kl.reward_coef > 0
        t = time.perf_counter()
        ref_logprobs = self._logprobs_no_grad(self.ref_model, r, reference=True) if self.uses_reference else None
        ref_seconds = time.perf_counter() - t
        old_logprobs = self._logprobs_no_grad(self.model, r) if needs_old else None
        return old_logprobs, ref_logprobs, ref_seconds

    def _several_passes(self) -> bool:
        """More than one gradient step per rollout: the ratio's denominator must be frozen beforehand."""
        return self.cfg.optim.epochs > 1 or self.cfg.optim.mini_batches > 1

    def advantages(
        self, batch: ScoredBatch, old_logprobs: torch.Tensor | None, ref_logprobs: torch.Tensor | None, values=None
    ) -> torch.Tensor:
        """(N,) or (N, Lc) advantages from the preset's estimator. With a KL in the reward (kl_reward_coef
        > 0) the estimator also gets k1 = old - ref per token, the sampling policy's KL to the reference."""
        kl_coef = self.algo.kl.reward_coef
        kl = None
        if kl_coef > 0:
            kl = kl_estimate(old_logprobs, ref_logprobs, "k1").to(self.device)  # (N, Lc)
        d = self.device
        return self.dist.advantages(  # torchrun: batch-wide estimators see every rank's rows
            compute_advantages, batch.rewards.to(d),
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
        )

    def update(
        self,
        batch: ScoredBatch,
        advantages: torch.Tensor,
        old_logprobs: torch.Tensor | None = None,
        ref_logprobs: torch.Tensor | None = None,
        record=None,
    ) -> tuple[dict[str, float], float]:
        """mu passes over the batch, each split into mini-batches (one optimizer step each),
        each split into micro-batches whose gradients accumulate. The loss normaliser is the
        whole mini-batch's (num_sequences / num_tokens), so the split never changes the objective.
        advantages: (N,) or (N, Lc). old/ref log-probs as from `rollout_logprobs` (computed here when
        both are None). ``record``: a rollout_record.TokenRecorder to fill with the per-token numbers the loss
        used. Returns the metrics and the seconds spent on the reference here."""
        cfg = self.cfg
        r = batch.rollout
        loss_mask = self._loss_mask(r)  # (N, Lc), without truncated completions under DAPO
        ref_seconds = 0.0
        if old_logprobs is None and ref_logprobs is None:
            old_logprobs, ref_logprobs, ref_seconds = self.rollout_logprobs(r)
        if not self._several_passes():
            old_logprobs = None  # one pass: the ratio's denominator is logprobs.detach(), ratio exactly 1

        stats = UpdateStats()  # what the update reports, kept out of the gradient loop
        lengths = r.row_lengths  # (N,) real tokens per row
        self.model.train()
        for k, mb in enumerate(self._mini_batch_order(r.completion_ids.shape[0])):  # (M,) rows each
            part, finite = self._with_micro_retry(
                lambda rows, mb=mb, first=(k == 0): self._mini_batch_gradients(
                    r, mb, rows, advantages, loss_mask, lengths, old_logprobs, ref_logprobs, first, record
                ),
                lengths[mb],
            )
            stats.merge(part)
            stats.add_step(self._clip_and_step(finite))

        self.dist.reduce_update_stats(stats)  # torchrun: the global batch's sums
        metrics = stats.metrics(n_updates=cfg.optim.epochs * cfg.optim.mini_batches)
        metrics["lr"] = self.scheduler.get_last_lr()[0]
        if self.scaler is not None:
            metrics["loss_scale"] = float(self.scaler.get_scale())
        metrics["micro_batch_size"] = float(self.last_micro_rows)  # rows per micro-batch in the update
        return metrics, ref_seconds

    # ----------------------------------------------------------------------------- metrics, eval, io

    def _step_metrics(self, batch: ScoredBatch, advantages, update_metrics, sampling) -> dict[str, float]:
        return self.dist.step_metrics(batch, advantages, update_metrics, sampling, self.accuracy_name)

    def evaluate(self, examples: list[dict] | None = None) -> dict[str, float]:
        was = self.model.training
        if self.episodes is not None:  # multi-turn: greedy episodes scored on their transcripts
            result = self.episodes.evaluate(
                self.generator, self.dist.generation_model(self.model, self.step), self.tokenizer, self.eval_rows,
                self.accuracy_fn, eos_token_ids=self.eos_ids, seed=self.cfg.train.seed, examples=examples,
            )
            self.model.train(was)
            return result
        result = evaluate(
            self.dist.generation_model(self.model, self.step),
            self.tokenizer,
            self.eval_rows,
            accuracy_fn=self.accuracy_fn,
            generator=self.generator,
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
