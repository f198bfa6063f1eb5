"""The GRPO training loop, in the order the data flows:

    prompts -> G completions each -> rewards -> group-relative advantages
            -> mu passes of mini-batched, gradient-accumulated clipped updates -> metrics
            -> evaluation -> checkpoint

The maths lives in ``grpokit.algos``; this file only moves tensors between the pieces.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import random
import resource
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from grpokit.algos import compute_advantages, get_loss, kl_estimate
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
from grpokit.config import Config, ConfigError, resolve_algo, save_config
from grpokit.data import load_prompts, reward_columns
from grpokit.evaluate import evaluate
from grpokit.generation import FastGenerator, HFGenerator, Rollout
from grpokit.loading import (
    check_tokenizer_fits,
    frozen_reference,
    load_policy,
    pick_device,
    prepare_policy,
    read_model_config,
)
from grpokit.modeling import completion_logprobs
from grpokit.precision import make_grad_scaler, make_optimizer, resolve_precision
from grpokit.rewards import RewardRunner, resolve_reward, resolve_reward_specs
from grpokit.rewards._text import as_completions
from grpokit.rewards.runner import TrainerState
from grpokit.runlog import RunLogger, clear_run, reward_metric_names
from grpokit.templates import encode_prompts
from grpokit.update_stats import UpdateStats
from grpokit.validate import check_output_dir, check_positions, config_changes

AUTO_MICRO_TOKENS = 4096
"""optim.micro_batch_size=auto off CUDA: rows per micro-batch x longest row <= this many tokens."""


class TrainingError(RuntimeError):
    """The run cannot go on; the message says why and what to change."""


class FlatRewardsError(TrainingError):
    """No group had any reward spread for train.stop_after_flat_steps steps: nothing can be learnt."""


@dataclass
class ScoredBatch:
    """One step's samples: rows are prompt-major, each group of G rows contiguous."""

    rollout: Rollout
    rows: list[dict]  # (N,) dataset row of each completion's prompt
    texts: list[str]  # (N,) decoded completions
    rewards: torch.Tensor  # (N,) weighted total reward
    per_function: dict[str, list]  # name -> (N,) values (None = not applicable)
    reward_metrics: dict[str, float]
    extra: dict[str, list] = dataclasses.field(default_factory=dict)  # log_extra column -> (N,) values

    def select_groups(self, groups: list[int], group_size: int) -> ScoredBatch:
        idx = [g * group_size + j for g in groups for j in range(group_size)]
        t = torch.tensor(idx, dtype=torch.long)
        return ScoredBatch(
            rollout=self.rollout.select(t),
            rows=[self.rows[i] for i in idx],
            texts=[self.texts[i] for i in idx],
            rewards=self.rewards[t],
            per_function={k: [v[i] for i in idx] for k, v in self.per_function.items()},
            reward_metrics=self.reward_metrics,
            extra={k: [v[i] for i in idx] for k, v in self.extra.items()},
        )


def concat_batches(batches: list[ScoredBatch], pad_token_id: int) -> ScoredBatch:
    """Stack batches whose prompts/completions may differ in padded length."""
    if len(batches) == 1:
        return batches[0]

    def cat(tensors: list[torch.Tensor], left: bool, value: float) -> torch.Tensor:
        width = max(t.shape[1] for t in tensors)
        out = []
        for t in tensors:
            pad = width - t.shape[1]
            out.append(torch.nn.functional.pad(t, (pad, 0) if left else (0, pad), value=value))
        return torch.cat(out)

    rs = [b.rollout for b in batches]
    rollout = Rollout(
        prompt_ids=cat([r.prompt_ids for r in rs], True, pad_token_id),
        prompt_mask=cat([r.prompt_mask for r in rs], True, 0),
        completion_ids=cat([r.completion_ids for r in rs], False, pad_token_id),
        completion_mask=cat([r.completion_mask for r in rs], False, 0),
        logprobs=cat([r.logprobs for r in rs], False, 0.0),
        truncated=torch.cat([r.truncated for r in rs]),
    )
    names = batches[0].per_function.keys()
    return ScoredBatch(
        rollout=rollout,
        rows=[row for b in batches for row in b.rows],
        texts=[t for b in batches for t in b.texts],
        rewards=torch.cat([b.rewards for b in batches]),
        per_function={k: [v for b in batches for v in b.per_function[k]] for k in names},
        reward_metrics={},  # set by the caller from the kept rows (batch_reward_metrics)
        extra={
            k: [v for b in batches for v in b.extra.get(k, [None] * len(b.texts))]
            for k in dict.fromkeys(k for b in batches for k in b.extra)
        },
    )


def batch_reward_metrics(batch: ScoredBatch, rounds: list[dict[str, float]]) -> dict[str, float]:
    """reward/<name>/{mean,std,applicable} and reward/total/{mean,std} over the rows that are trained
    on (under dynamic sampling: the kept groups only), std with ddof 0 everywhere; the cost and failure
    counters (seconds, failed, timeouts...) summed over every sampling round ``rounds``, kept or not, and
    what reward functions logged themselves (log_metric) averaged over the rounds."""
    out: dict[str, float] = {}
    logged: dict[str, list[float]] = {}
    for metrics in rounds:
        for key, value in metrics.items():
            if key.endswith(("/failed", "/failed_rows", "/timeouts", "/seconds")):
                out[key] = out.get(key, 0.0) + value  # counters and costs add up over rounds
            elif not key.endswith(("/mean", "/std", "/applicable")):
                logged.setdefault(key, []).append(value)  # a reward's own log_metric values: averaged
    out.update({key: sum(values) / len(values) for key, values in logged.items()})
    for name, values in batch.per_function.items():
        applicable = torch.tensor([v for v in values if v is not None], dtype=torch.float64)
        if applicable.numel():
            out[f"reward/{name}/mean"] = float(applicable.mean())
            out[f"reward/{name}/std"] = float(applicable.std(correction=0))
        out[f"reward/{name}/applicable"] = applicable.numel() / max(len(values), 1)
    total = batch.rewards.double()
    out["reward/total/mean"] = float(total.mean())
    out["reward/total/std"] = float(total.std(correction=0))
    return out


def flat_rewards_message(batch: ScoredBatch, prompt_column: str, reward_names: list[str]) -> str:
    """The likely cause of a batch whose groups all have equal rewards, with one sample and its scores."""
    values = batch.rewards
    failed = [
        name for name in reward_names if batch.reward_metrics.get(f"reward/{name}/failed", 0) > 0
    ]
    if failed:
        cause = f"Reward function(s) {failed} failed (see the warnings above) and count as 0."
    elif bool((values == values[0]).all()):
        v = float(values[0])
        cause = f"Every completion scored {v:g}: the rewards are constant. "
        if v <= 0:
            cause += (
                "Either the verifier cannot read the answers (math_accuracy reads \\boxed{...}, '#### 42' or "
                "'the answer is 42'; a bare number scores 0: set a template or system prompt that asks for "
                "that format, or a reward that reads yours), or the prompts are too hard for this model."
            )
        else:
            cause += "If that is the best score, the prompts are too easy for this model."
    else:
        cause = (
            "Each prompt's completions all score alike, though prompts differ: the reward depends on the "
            "prompt only, or sampling is too narrow (raise rollout.temperature, top_p, top_k)."
        )
    i = 0
    prompt = batch.rows[i][prompt_column]
    scores = ", ".join(f"{k}={v[i]}" for k, v in batch.per_function.items())
    return (
        f"{cause} Sample: prompt {str(prompt)[:200]!r} -> completion {batch.texts[i][:300]!r}, "
        f"scores: {scores}."
    )


class PromptStream:
    """Endless, seeded, reshuffled-each-pass stream of dataset rows; its position is resumable."""

    def __init__(self, rows: list[dict], seed: int, shuffle: bool):
        self.rows, self.seed, self.shuffle = rows, seed, shuffle
        self.epoch, self.index = 0, 0
        self._order = self._permutation()

    def _permutation(self) -> list[int]:
        order = list(range(len(self.rows)))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + self.epoch).shuffle(order)
        return order

    def take(self, n: int) -> list[dict]:
        out = []
        while len(out) < n:
            if self.index == len(self._order):
                self.epoch, self.index = self.epoch + 1, 0
                self._order = self._permutation()
            out.append(self.rows[self._order[self.index]])
            self.index += 1
        return out

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index}

    def load_state(self, state: dict[str, int]) -> None:
        self.epoch, self.index = state["epoch"], state["index"]
        self._order = self._permutation()


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


def _peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def length_sorted(index: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """``index`` (M,) reordered by ``lengths[index]`` (stable), so that consecutive micro-batches hold
    rows of similar length and each, trimmed to its own longest row, carries little padding. The loss
    uses the whole mini-batch's normaliser, so grouping rows differently never changes the gradient."""
    return index[lengths[index].argsort(stable=True)]


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
    checkpoint of the step is saved and TrainingError carries the callback's name and message.
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
    ):
        self.cfg = cfg
        self.algo = resolve_algo(cfg)
        if cfg.rollout.temperature <= 0:
            raise ConfigError("rollout.temperature must be > 0 for training (log-probs are taken at it)")
        self.out = Path(cfg.train.output_dir)
        check_output_dir(self.out, resume=resume is not False, overwrite=overwrite)
        self.overwrite = overwrite
        self.callbacks = list(callbacks)
        torch.manual_seed(cfg.train.seed)

        # data
        if train_rows is None:
            if not cfg.data.train:
                raise ConfigError(
                    "data.train is empty: give a JSONL/JSON/CSV/Parquet file or a save_to_disk folder"
                )
            train_rows = load_prompts(
                cfg.data.train, prompt_column=cfg.data.prompt_column, split=cfg.data.split, config=cfg.data.config
            )
        if eval_rows is None and cfg.data.eval:
            eval_rows = load_prompts(
                cfg.data.eval,
                prompt_column=cfg.data.prompt_column,
                limit=cfg.data.eval_limit,
                split=cfg.data.eval_split,
                default_split="test",
                config=cfg.data.config if cfg.data.eval == cfg.data.train else None,
            )
        self.train_rows, self.eval_rows = train_rows, eval_rows or []

        # rewards, resolved before the model loads: a bad reward fails in a second
        if reward_functions is None:
            reward_functions = resolve_reward_specs(cfg.rewards)  # problems name their rewards[i] entry
        if self.algo.batch.overlong_shaping:
            shaping = resolve_reward(
                "overlong_penalty",
                max_len=cfg.rollout.max_new_tokens,
                buffer_len=self.algo.batch.overlong_buffer,
            )
            reward_functions = [*reward_functions, ("overlong_penalty", shaping, 1.0)]
        # named by function in metrics and plots: "my_rewards.py:brevity" logs reward/brevity/mean
        given_names = [name for name, _, _ in reward_functions]
        renamed = dict(zip(given_names, reward_metric_names(given_names)))
        reward_functions = [(renamed[name], fn, weight) for name, fn, weight in reward_functions]
        self.reward_names = [name for name, _, _ in reward_functions]
        self.rewards = RewardRunner(reward_functions, timeout_s=cfg.train.reward_timeout_s)
        accuracy = cfg.train.accuracy_reward
        self.accuracy_name = renamed.get(accuracy, accuracy) if accuracy else self.reward_names[0]
        if self.accuracy_name not in self.reward_names:
            raise ConfigError(
                f"train.accuracy_reward={self.accuracy_name!r} is not one of the rewards {self.reward_names}"
            )
        self.accuracy_fn = dict((n, f) for n, f, _ in reward_functions)[self.accuracy_name]

        # the model's config.json and the checkpoint to resume from, checked before either loads
        if model is None:
            check_positions(cfg, read_model_config(cfg.model), cfg.model.name_or_path)
        else:
            given_config = getattr(model, "config", None)
            check_positions(cfg, given_config.to_dict() if given_config else None, "the given model")
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
        check_tokenizer_fits(model, tokenizer, "the tokenizer")
        # a reference for a KL in the loss or in the reward (with LoRA: the base, adapter disabled)
        self.uses_reference = self.algo.uses_reference
        self.ref_model = frozen_reference(model, cfg.lora.enabled) if self.uses_reference else None
        self.eos_ids = self._eos_ids()

        # prompts are checked for length up front, so a bad row fails before any training
        self.encoded = self._encode_all(self.train_rows)
        self.stream = PromptStream(list(range(len(self.train_rows))), cfg.train.seed, cfg.data.shuffle)

        # optimisation
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = make_optimizer(params, self.precision, cfg.optim, self.device)
        self.scaler = make_grad_scaler(self.precision, self.device)  # float16 loss scaling, else None
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_factor)
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

    def _eos_ids(self) -> list[int]:
        ids = set()
        if self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        gen_cfg = getattr(self.model, "generation_config", None)
        eos = getattr(gen_cfg, "eos_token_id", None)
        for e in eos if isinstance(eos, list) else [eos]:
            if e is not None:
                ids.add(int(e))
        if not ids:
            raise ConfigError("the tokenizer has no eos token: completions could never end")
        return sorted(ids)

    def _encode_all(self, rows: list[dict]) -> list[list[int]]:
        return encode_prompts(
            [row[self.cfg.data.prompt_column] for row in rows],
            self.tokenizer,
            template=self.cfg.data.template,
            system_prompt=self.cfg.data.system_prompt,
            max_prompt_tokens=self.cfg.data.max_prompt_tokens,
            source=self.cfg.data.train or None,
        )

    def _lr_factor(self, step: int) -> float:
        warm = self.cfg.optim.warmup_steps
        if step < warm:
            return (step + 1) / (warm + 1)
        if self.cfg.optim.schedule == "cosine":
            span = max(1, self.cfg.train.steps - warm)
            return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warm) / span)))
        return 1.0

    # ----------------------------------------------------------------------------- the loop

    def train(self) -> dict[str, Any]:
        """Run cfg.train.steps steps; returns the summary also written to OUTPUT/summary.json.

        SIGINT/SIGTERM stop the run at the end of the current step with a checkpoint; the summary then
        holds ``stopped_by`` (the signal's name) and is not written (a second Ctrl-C stops at once)."""
        cfg = self.cfg
        summary: dict[str, Any] = {}
        self._start_run()
        with (
            RunLogger(
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
            if self.eval_rows and cfg.eval.enabled and self.step == 0:
                examples: list[dict] = []
                before = self.evaluate(examples)
                log.log_eval(0, before)
                if before.get("greedy_score", 1) == 0 and before.get(f"mean_at_{cfg.eval.num_samples}", 0) == 0:
                    ex = examples[0]
                    log.print(
                        f"WARNING evaluation before training: every held-out row scored 0 with "
                        f"'{self.accuracy_name}'. The verifier may not read this model's answer format "
                        "(math_accuracy reads \\boxed{...}, '#### 42' or 'the answer is 42'; a bare number "
                        f"scores 0), or the task is too hard. Sample: {str(ex['prompt'])[:200]!r} -> "
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
                self._run_callbacks(metrics)
                if stop.signal_name:
                    break  # the safe point: this step is done and logged
                if (
                    cfg.eval.every
                    and self.eval_rows
                    and self.step % cfg.eval.every == 0
                    and self.step < cfg.train.steps
                ):
                    log.log_eval(self.step, self.evaluate())
                if cfg.train.save_every and self.step % cfg.train.save_every == 0:
                    self.save()
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
                summary["eval_accuracy_after"] = after["accuracy"]
                summary["eval_after"] = after
            final = self.save()
            summary.update(steps=self.step, checkpoint=str(final), output_dir=str(self.out))
            summary.update(self._previous_summary(summary))
            (self.out / "summary.json").write_text(json.dumps(summary, indent=2))
            self._plot()
        return summary

    def train_step(self) -> dict[str, float]:
        """One rollout and its updates: sample -> score -> advantages -> update -> metrics."""
        t0 = time.perf_counter()
        batch, timing, sampling = self.sample_batch()
        self._check_reward_spread(batch)
        if self.stopped_early:
            return {}
        t_update = time.perf_counter()
        old_logprobs, ref_logprobs, timing["reference"] = self.rollout_logprobs(batch.rollout)  # (N, Lc) | None
        advantages = self.advantages(batch, old_logprobs, ref_logprobs)  # (N,) or (N, Lc)
        update_metrics, _ = self.update(batch, advantages, old_logprobs, ref_logprobs)
        timing["update"] = time.perf_counter() - t_update - timing["reference"]
        self.step += 1
        self.scheduler.step()
        metrics = self._step_metrics(batch, advantages, update_metrics, sampling)
        step_seconds = time.perf_counter() - t0
        metrics.update({f"time/{k}": v for k, v in timing.items()})
        metrics["time/step"] = step_seconds
        generated = float(batch.rollout.completion_mask.sum())
        metrics["tokens_per_s"] = generated / step_seconds
        metrics["peak_memory_mb"] = _peak_memory_mb(self.device)
        if self.cfg.train.samples_every and self.step % self.cfg.train.samples_every == 0:
            self._save_samples(batch)
        return metrics

    # ----------------------------------------------------------------------------- sampling

    def sample_batch(self) -> tuple[ScoredBatch, dict[str, float], dict[str, float]]:
        """P groups of G scored completions. With DAPO's dynamic sampling, groups whose rewards
        all match are dropped and more prompts are sampled until P groups remain."""
        P, G = self.cfg.rollout.prompts_per_step, self.cfg.rollout.group_size
        timing = {"generation": 0.0, "scoring": 0.0}
        kept: list[ScoredBatch] = []
        round_metrics: list[dict[str, float]] = []
        discarded_rewards: list[torch.Tensor] = []
        n_kept, rounds, zero_var_groups, total_groups = 0, 0, 0, 0
        while True:
            row_ids = self.stream.take(P)
            t = time.perf_counter()
            rollout = self.rollout([self.encoded[i] for i in row_ids], seed=self._seed(rounds))
            timing["generation"] += time.perf_counter() - t
            t = time.perf_counter()
            scored = self.score(rollout, [self.train_rows[i] for i in row_ids])
            timing["scoring"] += time.perf_counter() - t
            round_metrics.append(scored.reward_metrics)
            spread = scored.rewards.view(P, G)
            flat = (spread.max(dim=1).values - spread.min(dim=1).values) == 0  # (P,)
            zero_var_groups += int(flat.sum())
            total_groups += P
            if not self.algo.batch.dynamic_sampling:
                kept, n_kept = [scored], P
                break
            useful = [g for g in range(P) if not flat[g]][: P - n_kept]
            discarded_rewards += [spread[g] for g in range(P) if g not in useful]
            if useful:
                kept.append(scored.select_groups(useful, G))
                n_kept += len(useful)
            if n_kept == P:
                break
            rounds += 1
            if rounds > self.algo.batch.max_sampling_rounds:
                raise TrainingError(
                    f"dynamic sampling: after {rounds} sampling rounds only {n_kept} of {P} groups had "
                    "rewards that differ (all others were all-correct or all-wrong). Raise "
                    "algo.max_sampling_rounds, use harder/easier prompts, or set algo.dynamic_sampling=false."
                )
        batch = concat_batches(kept, self.tokenizer.pad_token_id)
        batch.reward_metrics = batch_reward_metrics(batch, round_metrics)
        sampling = {
            "zero_variance_frac": zero_var_groups / total_groups,
            "sampling_rounds": float(rounds + 1),
        }
        if self.algo.batch.dynamic_sampling:
            sampling["dynamic_sampling/discarded_groups"] = float(len(discarded_rewards))
            if discarded_rewards:
                sampling["dynamic_sampling/discarded_reward_mean"] = float(torch.cat(discarded_rewards).mean())
        return batch, timing, sampling

    def _check_reward_spread(self, batch: ScoredBatch) -> None:
        """Warn at the first step in which no group has any reward spread (every advantage is 0, so the
        step teaches nothing) and stop after train.stop_after_flat_steps of them in a row."""
        G = self.cfg.rollout.group_size
        grouped = batch.rewards.view(-1, G)  # (P, G)
        best_before = self.best_reward
        self.best_reward = max(self.best_reward, float(batch.rewards.max()))
        if bool(((grouped.max(1).values - grouped.min(1).values) > 0).any()):
            self.flat_steps = 0
            self.had_spread = True
            return
        self.flat_steps += 1
        limit = self.cfg.train.stop_after_flat_steps
        message = flat_rewards_message(batch, self.cfg.data.prompt_column, self.reward_names)
        rewards = batch.rewards
        solved = self.had_spread and bool((rewards == rewards[0]).all()) and float(rewards[0]) >= best_before
        if limit and self.flat_steps >= limit and solved:
            # learnt, not stuck: every completion now earns the best reward the run has seen
            self.stopped_early = (
                f"stopped early at step {self.step + 1}: every completion scored {float(rewards[0]):g}, the "
                f"best reward of the run, for {self.flat_steps} steps in a row: the training prompts are "
                "solved and give no more signal (use harder prompts to go on; "
                "train.stop_after_flat_steps=0 trains on regardless)."
            )
        elif limit and self.flat_steps >= limit:
            raise FlatRewardsError(
                f"stopped at step {self.step + 1}: no group had any reward spread for {self.flat_steps} "
                f"steps in a row, so every advantage was 0 and nothing was learnt. {message} "
                "(train.stop_after_flat_steps=0 trains on regardless.)"
            )
        if self.flat_steps == 1:
            warning = (
                f"WARNING step {self.step + 1}: no group has any reward spread; every advantage is 0. "
                f"{message} "
                + (f"The run stops if this lasts {limit} steps (train.stop_after_flat_steps)." if limit else "")
            )
            self.log.print(warning) if self.log else print(warning, file=sys.stderr)

    def _seed(self, round_: int) -> int:
        # a pure function of (seed, step, round): resuming reproduces the same samples
        return (self.cfg.train.seed * 1_000_003 + self.step * 101 + round_) % 2**31

    @torch.no_grad()
    def rollout(
        self,
        prompt_ids: list[list[int]],
        *,
        seed: int,
        group_size: int | None = None,
        temperature=None,
        max_new_tokens=None,
    ) -> Rollout:
        r = self.cfg.rollout
        self.model.eval()
        out = self.generator.generate(
            self.model,
            prompt_ids,
            group_size=group_size or r.group_size,
            max_new_tokens=max_new_tokens or r.max_new_tokens,
            temperature=r.temperature if temperature is None else temperature,
            top_p=r.top_p,
            top_k=r.top_k,
            eos_token_ids=self.eos_ids,
            pad_token_id=self.tokenizer.pad_token_id,
            seed=seed,
        )
        return out

    def score(self, rollout: Rollout, rows: list[dict]) -> ScoredBatch:
        """Run the reward functions on each completion; the group's prompt row gives the columns."""
        G = rollout.completion_ids.shape[0] // len(rows)
        per_completion_rows = [row for row in rows for _ in range(G)]
        texts = rollout.decode(self.tokenizer)
        columns = reward_columns(per_completion_rows, self.cfg.data.prompt_column)
        columns["completion_ids"] = rollout.completion_token_ids()
        P = self.cfg.rollout.prompts_per_step
        columns["trainer_state"] = TrainerState(
            global_step=self.step,
            max_steps=self.cfg.train.steps,
            epoch=self.step * P / max(len(self.train_rows), 1),
        )
        prompts = [row[self.cfg.data.prompt_column] for row in per_completion_rows]
        completions = as_completions(prompts, texts)  # TRL's shapes: messages for chat prompts, else text
        result = self.rewards(prompts, completions, columns)
        problem = result.failure(self.cfg.train.max_reward_failure_frac, prompts, completions)
        if problem:
            raise TrainingError(
                f"step {self.step + 1}: {problem}\nFix the reward function (or the data it reads). "
                f"train.max_reward_failure_frac={self.cfg.train.max_reward_failure_frac:g} is the share of "
                "a step's completions a function may fail on and still count 0 there."
            )
        return ScoredBatch(
            rollout=rollout,
            rows=per_completion_rows,
            texts=texts,
            rewards=torch.tensor(result.total, dtype=torch.float32),
            per_function=result.per_function,
            reward_metrics=result.metrics(),
            # log_extra columns with one value per completion (others cannot be lined up with rows)
            extra={k: v for k, v in result.extra.items() if len(v) == len(texts)},
        )

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
        self, batch: ScoredBatch, old_logprobs: torch.Tensor | None, ref_logprobs: torch.Tensor | None
    ) -> torch.Tensor:
        """(N,) or (N, Lc) advantages from the preset's estimator. With a KL in the reward (kl_reward_coef
        > 0) the estimator also gets k1 = old - ref per token, the sampling policy's KL to the reference."""
        kl_coef = self.algo.kl.reward_coef
        kl = None
        if kl_coef > 0:
            kl = kl_estimate(old_logprobs, ref_logprobs, "k1").to(self.device)  # (N, Lc)
        d = self.device
        return compute_advantages(
            batch.rewards.to(d),
            self.cfg.rollout.group_size,
            self.algo,
            completion_mask=batch.rollout.completion_mask.to(d),
            kl=kl,
            kl_coef=kl_coef,
            old_logprobs=old_logprobs.to(d) if old_logprobs is not None else None,
            ref_logprobs=ref_logprobs.to(d) if ref_logprobs is not None else None,
        )

    def update(
        self,
        batch: ScoredBatch,
        advantages: torch.Tensor,
        old_logprobs: torch.Tensor | None = None,
        ref_logprobs: torch.Tensor | None = None,
    ) -> tuple[dict[str, float], float]:
        """mu passes over the batch, each split into mini-batches (one optimizer step each),
        each split into micro-batches whose gradients accumulate. The loss normaliser is the
        whole mini-batch's (num_sequences / num_tokens), so the split never changes the objective.
        advantages: (N,) or (N, Lc). old/ref log-probs as from `rollout_logprobs` (computed here when
        both are None). Returns the metrics and the seconds spent on the reference here."""
        cfg, algo = self.cfg, self.algo
        r = batch.rollout
        N = r.completion_ids.shape[0]
        loss_mask = r.completion_mask.clone()  # (N, Lc)
        if algo.batch.mask_truncated:
            loss_mask[r.truncated] = 0  # DAPO overlong filtering
        ref_seconds = 0.0
        if old_logprobs is None and ref_logprobs is None:
            old_logprobs, ref_logprobs, ref_seconds = self.rollout_logprobs(r)
        if not self._several_passes():
            old_logprobs = None  # one pass: the ratio's denominator is logprobs.detach(), ratio exactly 1

        stats = UpdateStats()  # what the update reports, kept out of the gradient loop
        lengths = r.prompt_mask.sum(-1) + r.completion_mask.sum(-1)  # (N,) real tokens per row
        mini = N // cfg.optim.mini_batches
        order_gen = torch.Generator().manual_seed(self._seed(0))
        self.model.train()
        for epoch in range(cfg.optim.epochs):
            order = (
                torch.randperm(N, generator=order_gen)
                if (cfg.optim.epochs > 1 or cfg.optim.mini_batches > 1)
                else torch.arange(N)
            )
            for m in range(cfg.optim.mini_batches):
                mb = order[m * mini : (m + 1) * mini]  # (M,)
                part, finite = self._with_micro_retry(
                    lambda rows, mb=mb, first=(epoch == 0 and m == 0): self._mini_batch_gradients(
                        r, mb, rows, advantages, loss_mask, lengths, old_logprobs, ref_logprobs, first
                    ),
                    lengths[mb],
                )
                stats.merge(part)
                stats.add_step(self._clip_and_step(finite))

        metrics = stats.metrics(n_updates=cfg.optim.epochs * cfg.optim.mini_batches)
        metrics["lr"] = self.scheduler.get_last_lr()[0]
        if self.scaler is not None:
            metrics["loss_scale"] = float(self.scaler.get_scale())
        metrics["micro_batch_size"] = float(self.last_micro_rows)  # rows per micro-batch in the update
        return metrics, ref_seconds

    def _mini_batch_gradients(
        self, r, mb, rows, advantages, loss_mask, lengths, old_logprobs, ref_logprobs, first
    ) -> tuple[UpdateStats, bool]:
        """Accumulate the gradient of mini-batch ``mb`` (M,) over micro-batches of ``rows`` rows, sorted by
        length. Returns its UpdateStats (loss metrics; sampler-vs-trainer log-prob differences and entropy
        on the first mini-batch) and whether every loss was finite (a NaN/inf loss stops the accumulation).
        Nothing outside changes but the parameters' .grad."""
        cfg, algo = self.cfg, self.algo
        loss_fn = get_loss(algo.loss.name)
        num_tokens = loss_mask[mb].sum().clamp(min=1).to(self.device)
        stats = UpdateStats()
        for micro in length_sorted(mb, lengths).split(rows):
            tensors = self._micro_tensors(r, micro, loss_mask)
            with self.precision.autocast(self.device):
                logprobs, entropy = completion_logprobs(
                    self.model,
                    tensors["prompt_ids"],
                    tensors["prompt_mask"],
                    tensors["completion_ids"],
                    tensors["completion_mask"],
                    temperature=cfg.rollout.temperature,
                    chunk_size=cfg.optim.logprob_chunk_size,
                    with_entropy=first,
                )  # (n, L), float32
            mask = tensors["loss_mask"]
            width = logprobs.shape[1]
            old = old_logprobs[micro][:, :width].to(self.device) if old_logprobs is not None else logprobs.detach()
            ref = ref_logprobs[micro][:, :width].to(self.device) if ref_logprobs is not None else None
            adv = advantages[micro.to(self.device)]  # (n,) or (n, Lc)
            adv = adv[:, :width] if adv.dim() == 2 else adv  # (n,) or (n, L)
            loss, loss_stats = loss_fn(
                logprobs,
                old,
                adv,
                mask,
                ref_logprobs=ref,
                **algo.loss_kwargs(),
                num_sequences=len(mb),
                num_tokens=num_tokens,
            )
            if not torch.isfinite(loss):
                return stats, False
            (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
            stats.add_loss(loss, loss_stats, float(mask.sum()))
            if first:
                generated = tensors["completion_mask"].bool()  # (n, L)
                stats.add_sampler_diff(logprobs, tensors["sample_logprobs"], generated)
                stats.add_entropy(entropy, generated)
        return stats, True

    def _micro_rows(self, lengths: torch.Tensor) -> int:
        """Rows per micro-batch for rows of ``lengths`` (real tokens each). A number in
        optim.micro_batch_size is used as given. auto: on CUDA every row at once until an out-of-memory
        error halves it (remembered for the rest of the run); elsewhere as many rows as fit
        AUTO_MICRO_TOKENS tokens (a CPU process cannot survive running out of memory to learn from it)."""
        setting = self.cfg.optim.micro_batch_size
        n = max(1, len(lengths))
        if setting != "auto":
            return int(setting)
        if self.device.type == "cuda":
            return min(n, self.auto_micro_rows or n)
        longest = int(lengths.max()) if len(lengths) else 1
        return max(1, min(n, AUTO_MICRO_TOKENS // max(1, longest)))

    def _with_micro_retry(self, fn, lengths: torch.Tensor):
        """``fn(rows)`` with rows = _micro_rows(lengths); under micro_batch_size=auto an out-of-memory
        error drops the partial gradient and retries with half the rows. The loss normaliser is the
        mini-batch's, so the retried gradient is the one the first try would have given."""
        while True:
            rows = self._micro_rows(lengths)
            try:
                result = fn(rows)
                self.last_micro_rows = rows
                return result
            except torch.cuda.OutOfMemoryError as e:
                self.optimizer.zero_grad(set_to_none=True)
                if self.cfg.optim.micro_batch_size != "auto" or rows == 1:
                    raise TrainingError(
                        f"out of GPU memory with {rows} completions per micro-batch: lower "
                        "optim.micro_batch_size, set it to auto, or turn on model.gradient_checkpointing"
                    ) from e
                torch.cuda.empty_cache()
                self.auto_micro_rows = rows // 2
                message = f"out of GPU memory at {rows} rows per micro-batch: retrying with {rows // 2} (auto)"
                self.log.print(message) if self.log else print(message, file=sys.stderr)

    def _clip_and_step(self, finite: bool) -> float | None:
        """Unscale (float16), clip, check, step. A NaN/inf loss or gradient skips the update instead of
        corrupting the weights; under loss scaling it also lowers the scale (GradScaler's own rule)."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        scaler = self.scaler
        if finite:
            if scaler is not None:
                scaler.unscale_(self.optimizer)
            max_norm = self.cfg.optim.max_grad_norm if self.cfg.optim.max_grad_norm > 0 else float("inf")
            norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
            finite = bool(torch.isfinite(norm))
            if scaler is not None:
                if finite:
                    scaler.step(self.optimizer)
                scaler.update()  # halves the scale after an overflow, grows it after a quiet stretch
        if not finite:
            self.optimizer.zero_grad(set_to_none=True)
            if scaler is None:  # under loss scaling an overflow is routine: counted, not printed
                message = f"step {self.step + 1}: non-finite loss or gradient, update skipped"
                self.log.print(message) if self.log else print(message)
            return None
        if scaler is None:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    def _micro_tensors(
        self, r: Rollout, idx: torch.Tensor, loss_mask: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """Rows ``idx`` of the batch, trimmed to their own longest prompt/completion, on device."""
        pm = r.prompt_mask[idx]
        cm = r.completion_mask[idx]
        p_start = int((pm.sum(0) > 0).nonzero().min()) if pm.any() else 0
        c_len = max(1, int((cm.sum(0) > 0).nonzero().max()) + 1) if cm.any() else 1
        d = self.device
        return {
            "prompt_ids": r.prompt_ids[idx][:, p_start:].to(d),
            "prompt_mask": pm[:, p_start:].to(d),
            "completion_ids": r.completion_ids[idx][:, :c_len].to(d),
            "completion_mask": cm[:, :c_len].to(d),
            "loss_mask": loss_mask[idx][:, :c_len].to(d),
            "sample_logprobs": r.logprobs[idx][:, :c_len].to(d),
        }

    @torch.no_grad()
    def _logprobs_no_grad(self, model, r: Rollout, reference: bool = False) -> torch.Tensor:
        """(N, Lc) log-probs of the batch's completions under ``model`` (the reference when asked:
        with LoRA that is the base model with the adapter disabled)."""
        N, Lc = r.completion_ids.shape
        out = torch.zeros(N, Lc)
        if reference and model is None:
            ctx = self.model.disable_adapter()
            model = self.model
        else:
            ctx = contextlib.nullcontext()
        was_training = self.model.training
        model.eval()
        def run(rows: int) -> None:
            for micro in length_sorted(torch.arange(N), lengths).split(rows):
                t = self._micro_tensors(r, micro, r.completion_mask)
                with self.precision.autocast(self.device):  # the same numerics as the update
                    lp, _ = completion_logprobs(
                        model,
                        t["prompt_ids"],
                        t["prompt_mask"],
                        t["completion_ids"],
                        t["completion_mask"],
                        temperature=self.cfg.rollout.temperature,
                        chunk_size=self.cfg.optim.logprob_chunk_size,
                    )
                out[micro, : lp.shape[1]] = lp.float().cpu()

        lengths = r.prompt_mask.sum(-1) + r.completion_mask.sum(-1)  # (N,)
        with ctx:
            self._with_micro_retry(run, lengths)
        self.model.train(was_training)
        return out

    # ----------------------------------------------------------------------------- metrics, eval, io

    def _step_metrics(self, batch: ScoredBatch, advantages, update_metrics, sampling) -> dict[str, float]:
        r = batch.rollout
        lengths = r.completion_mask.sum(1).float()  # (N,)
        acc_values = batch.per_function[self.accuracy_name]
        correct = torch.tensor([v is not None and v >= 1.0 - 1e-6 for v in acc_values])
        metrics: dict[str, float] = dict(batch.reward_metrics)
        metrics["accuracy"] = float(correct.float().mean())
        metrics["completion_len/mean"] = float(lengths.mean())
        metrics["completion_len/min"] = float(lengths.min())
        metrics["completion_len/max"] = float(lengths.max())
        metrics["completion_len/correct"] = float(lengths[correct].mean()) if correct.any() else float("nan")
        metrics["completion_len/incorrect"] = (
            float(lengths[~correct].mean()) if (~correct).any() else float("nan")
        )
        metrics["truncated_frac"] = float(r.truncated.float().mean())
        if advantages.dim() == 2:  # per token: the mean over generated tokens
            gen = r.completion_mask.to(advantages.device).bool()  # (N, Lc)
            metrics["advantage/abs_mean"] = float(advantages[gen].abs().mean()) if gen.any() else 0.0
        else:
            metrics["advantage/abs_mean"] = float(advantages.abs().mean())
        metrics.update(sampling)
        metrics.update(update_metrics)
        if "kl_mean" in metrics:
            metrics["kl"] = metrics.pop("kl_mean")
        return metrics

    def evaluate(self, examples: list[dict] | None = None) -> dict[str, float]:
        was = self.model.training
        result = evaluate(
            self.model,
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
        )
        self.model.train(was)
        return result

    def trainer_state(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "precision": self.precision.name,
            "stream": self.stream.state(),
            "config": dataclasses.asdict(self.cfg),
        }

    def save(self) -> Path:
        """Checkpoint this step (once: a second call at the same step returns the same folder), then prune
        every step_N folder but the newest train.keep_checkpoints complete ones up to this step."""
        if self._saved is not None and self._saved[0] == self.step:
            return self._saved[1]
        root = self.out / "checkpoints"
        path = save_checkpoint(
            root / f"step_{self.step:06d}", self.model, self.tokenizer, self.trainer_state()
        )
        self._saved = (self.step, path)
        prune_checkpoints(root, self.cfg.train.keep_checkpoints, current_step=self.step)
        return path

    def _start_run(self) -> None:
        """The run starts: only now is the output folder touched. A run being replaced (overwrite) is
        deleted, checkpoints left half-written by a kill are removed, the resolved config is saved."""
        if self.overwrite:
            clear_run(self.out)
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
        load_weights_into(self.model, latest)
        state = load_trainer_state(latest)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.stream.load_state(state["stream"])
        set_rng_state(state["rng"])
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

    def _save_samples(self, batch: ScoredBatch) -> None:
        rows = []
        G = self.cfg.rollout.group_size
        for i in range(0, len(batch.texts), G):  # first completion of each group, up to 8 groups
            if len(rows) >= 8:
                break
            rows.append(
                {
                    "prompt": batch.rows[i][self.cfg.data.prompt_column],
                    "completion": batch.texts[i],
                    "reward": float(batch.rewards[i]),
                    **{f"reward/{k}": v[i] for k, v in batch.per_function.items()},
                    **{k: v[i] for k, v in batch.extra.items()},  # reward functions' log_extra columns
                }
            )
        self.log.log_samples(self.step, rows)

    def _plot(self) -> None:
        from grpokit.plots import plot_training_curves

        eval_path = self.out / "eval.jsonl"
        plot_training_curves(
            self.out / "metrics.jsonl",
            self.out / "curves.png",
            eval_path=eval_path if eval_path.is_file() else None,
        )
