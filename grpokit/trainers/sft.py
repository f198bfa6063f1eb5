"""Supervised fine-tuning (``grpokit sft``), in the order the data flows:

    SFT rows -> token ids + loss mask (grpokit.data.sft) -> a step's examples -> micro-batches (padded or
    packed) -> summed NLL of the trained tokens / the step's token count (grpokit.algos.sft) -> one
    optimizer step (grpokit.train.learner.Learner) -> metrics -> held-out loss and accuracy -> checkpoint

Everything around the loss is the RL trainer's: the model is loaded and stepped by a ``Learner`` (precision
modes, LoRA, micro-batching with the OOM retry, clipping), torchrun by ``Distributed``, the run (its log,
signals, callbacks, evaluation and checkpoint cadence, summary) by grpokit.run.loop, the output folder
(checkpoints with exact resume, metrics.jsonl, trackers) by grpokit.run.state / checkpoint / log,
held-out accuracy by grpokit.rollout.evaluate. A step takes ``sft.batch_size`` examples from a seeded
stream reshuffled each pass; the data position is part of every checkpoint.
"""

from __future__ import annotations

import copy
import math
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from grpokit.algos.sft import nll_sum
from grpokit.compat.trl.after_train import (
    TrainResult,
    check_resume_request,
    epoch_of,
    log_metrics,
    refuse_push_to_hub,
    save_hf_model,
    save_metrics,
    save_state,
    trainer_state,
    trl_evaluation,
)
from grpokit.compat.trl.api import ProcessView
from grpokit.compat.trl.names import tokens_so_far
from grpokit.config.epochs import resolve_epochs
from grpokit.config.run_file import given_in_code
from grpokit.config.schema import ConfigError
from grpokit.config.sft import SFTConfig, prompt_data_config, validated_sft
from grpokit.data.prompts import DataError
from grpokit.data.sft import collate, detect_format, encode_examples, load_sft_rows, prompt_rows
from grpokit.model.loading import (
    check_tokenizer_fits,
    eos_token_ids,
    load_tokenizer_checked,
    read_model_config,
)
from grpokit.model.logprobs import attention_implementation, check_packed_attention, token_logprobs
from grpokit.rollout.batch import PromptStream, length_sorted
from grpokit.run.log import RunLogger
from grpokit.run.loop import run_training
from grpokit.run.preflight import model_positions
from grpokit.run.setup import open_run
from grpokit.train.costs import step_costs
from grpokit.train.learner import Learner, load_model

SUMMED = ("nll_sum", "top1", "entropy_sum")
"""A micro-batch's sums over its trained tokens (``_loss_sum``'s stats), divided by the token count for the metrics:
the NLL (loss), the top-1 hits (mean_token_accuracy) and the entropy (entropy)."""


class SFTTrainer:
    """Fine-tunes ``cfg.model`` on the SFT rows of ``cfg.data`` (grpokit.config.sft for every key).

    model/tokenizer/train_rows/eval_rows/reward_functions may be passed in (tests, notebooks), as to
    GRPOTrainer; resume (True: the newest complete checkpoint, or a path), overwrite and
    allow_changed_config mean what they mean there, and so do callbacks ``fn(step, metrics, trainer)`` and
    ``trainer.stop(reason)``.
    Data, rewards, the output folder and the checkpoint to resume from are checked before the model loads;
    every row is tokenized and checked before the first step."""

    def __init__(
        self,
        cfg: SFTConfig | None = None,
        *,
        model=None,
        tokenizer=None,
        train_rows: list[dict] | None = None,
        eval_rows: list[dict] | None = None,
        reward_functions: list[tuple[str, Any, float]] | None = None,
        resume: bool | str | Path = False,
        overwrite: bool = False,
        allow_changed_config: bool = False,
        callbacks: Sequence[Callable[[int, dict[str, float], SFTTrainer], Any]] = (),
        args=None,
        processing_class=None,
        train_dataset=None,
        eval_dataset=None,
        peft_config=None,
        formatting_func: Callable[[dict], str] | None = None,
        **unexpected,
    ):
        # TRL's call and argument forms (grpokit.compat.trl.sft_call): a TRL SFTConfig as args=, the model first,
        # processing_class, datasets, peft_config, TrainerCallbacks, formatting_func; the rest refused by name
        from grpokit.compat.trl.api import trl_arguments
        from grpokit.compat.trl.sft_call import formatted, refuse_unsupported, sft_config_from_args

        refuse_unsupported(unexpected)
        given = trl_arguments(
            cfg, args=args, model=model, tokenizer=tokenizer, processing_class=processing_class,
            reward_functions=reward_functions, callbacks=callbacks, peft_config=peft_config, train_rows=train_rows,
            eval_rows=eval_rows, train_dataset=train_dataset, eval_dataset=eval_dataset,
            config_from=sft_config_from_args, trainer="SFTTrainer",
        )  # fmt: skip
        cfg, model, tokenizer, reward_functions = given.cfg, given.model, given.tokenizer, given.reward_functions
        callbacks = given.callbacks
        self.formatting_func = formatting_func  # evaluate(eval_dataset=...) formats its rows the same way
        train_rows = formatted(given.train_rows, formatting_func, "train_dataset")
        eval_rows = formatted(given.eval_rows, formatting_func, "eval_dataset")
        validated_sft(cfg)  # the CLI's checks, for a config built in code too
        self.cfg = cfg
        self.callbacks = list(callbacks)
        self.log_history: list[dict[str, float]] = []  # every step's metrics, as TRL's state.log_history
        recorded = given_in_code(cfg, model=model, tokenizer=tokenizer, train_rows=train_rows, eval_rows=eval_rows,
                                 reward_functions=reward_functions)  # for config.yaml; placeholders given again
        # the first step GRPOTrainer takes too (grpokit.run.setup): settings of parts that are off, the tracker's
        # login, the seed, torchrun's ranks, the output folder (no curves.png: its panels are GRPO's)
        self.dist, self.run = open_run(
            cfg, resume=resume, overwrite=overwrite, batch_size=cfg.sft.batch_size, given=recorded, curves=False
        )

        # data and rewards, checked before the model loads
        self.train_rows, self.eval_rows = load_sft_rows(cfg.data, train_rows, eval_rows)
        self.sources = (cfg.data.train or "train_rows", cfg.data.eval or "eval_rows")
        detect_format(self.train_rows, cfg.data, self.sources[0])
        self.accuracy_name, self.accuracy_fn = self._accuracy_reward(reward_functions)
        self.eval_prompts = (
            prompt_rows(self.eval_rows, cfg.data, self.sources[1]) if self.accuracy_fn and self.eval_rows else []
        )
        if model is None:
            read_model_config(cfg.model)  # a missing folder or an unreachable hub fails here, in seconds
        if model is None and tokenizer is None:
            # every training row tokenized with the model's tokenizer before the weights load: a row that
            # cannot be used (too long, no completion) fails in seconds, not after minutes of loading
            early = load_tokenizer_checked(cfg.model)
            encode_examples(self.train_rows, early, cfg.data, cfg.sft.loss_on, self.sources[0])
        resume_from = self.run.pick_checkpoint(resume, allow_changed_config)  # None without resume

        # the model, and every row tokenized (a bad row fails here, before any step)
        model, tokenizer, precision, device = load_model(cfg, model, tokenizer)
        check_tokenizer_fits(model, tokenizer, "the tokenizer")
        self.model, self.tokenizer, self.device = model, tokenizer, device
        self.examples = encode_examples(self.train_rows, tokenizer, cfg.data, cfg.sft.loss_on, self.sources[0])
        resolve_epochs(cfg, len(self.examples), cfg.sft.batch_size)  # TRL's epochs: passes over the rows
        self.eval_examples = encode_examples(self.eval_rows, tokenizer, cfg.data, cfg.sft.loss_on, self.sources[1])
        self._check_positions(model.config.to_dict())
        self.packing = cfg.sft.packing or cfg.optim.packing
        if self.packing:
            check_packing(model, device)
        self.dist.wrap(model, None, resume_from, forward=token_logprobs)  # torchrun: FSDP2 / DDP
        self.learner = Learner(
            model, precision, device, cfg.optim, self.dist, total_steps=cfg.train.steps, packing=self.packing
        )
        self.stream = PromptStream(list(range(len(self.examples))), cfg.train.seed, cfg.data.shuffle)
        self.step = 0
        self.stopped_early: str | None = None  # why the run ended before train.steps (stop), or None
        if resume_from is not None:  # every part built: each takes its piece (the mirror of save())
            state = self.run.load_resume_state()  # RNG and clock restored
            self.learner.load_state(state, weights_from=None if self.dist.active else resume_from)
            self.stream.load_state(state["stream"])
            self.step = state["step"]
            self.log_history = self.run.logged_history(self.step)  # callbacks' log_history: every leg's

    # ----------------------------------------------------------------------------- set-up helpers

    def _accuracy_reward(self, given) -> tuple[str | None, Any]:
        """(name, function) of the reward whose 1 means correct, for held-out accuracy, by grpokit train's
        rule (grpokit.rewards.which_accuracy); (None, None) without rewards (held-out loss only)."""
        from grpokit.rewards import resolve_reward_specs
        from grpokit.rewards.which_accuracy import choose_accuracy_reward

        functions = given if given is not None else (resolve_reward_specs(self.cfg.rewards) if self.cfg.rewards else [])
        if not functions:
            return None, None
        name = choose_accuracy_reward([n for n, _, _ in functions], self.cfg.train.accuracy_reward)
        return name, dict((n, f) for n, f, _ in functions).get(name)  # None: only format/length rewards

    def _check_positions(self, model_config: dict | None, sets: list[tuple[list, str]] | None = None) -> None:
        """No example may be longer than the model's positions (config.json's max_position_embeddings ...); ``sets``:
        (examples, source) pairs to check, by default the training and held-out ones."""
        found = model_positions(model_config)
        sets = sets or [(self.examples, self.sources[0]), (self.eval_examples, self.sources[1])]
        for examples, source in sets:
            for index, example in enumerate(examples):
                if found and len(example.input_ids) > found[1]:
                    raise DataError(
                        f"{source}, row index {index}: {len(example.input_ids)} tokens, beyond the model's "
                        f"{found[1]} positions ({found[0]}); drop or shorten the row, or set "
                        f"data.max_length={found[1]} with data.truncate=true."
                    )

    # ----------------------------------------------------------------------------- the run

    def train(self, resume_from_checkpoint: bool | str | Path | None = None) -> TrainResult:
        """Run cfg.train.steps steps (grpokit.run.loop); returns the summary also written to
        OUTPUT/summary.json (a dict, also read as transformers' TrainOutput). SIGINT/SIGTERM stop after the current
        step with a checkpoint (``stopped_by`` in the summary, none written). ``resume_from_checkpoint``: TRL's,
        checked against what the trainer was built from (resume=), as GRPOTrainer.train does."""
        check_resume_request(self, resume_from_checkpoint)
        return TrainResult(run_training(self), self.log_history, epoch_of(self))

    # TRL's after-train calls, as GRPOTrainer answers them (grpokit.compat.trl.after_train)
    @property
    def state(self):
        """transformers' TrainerState of the run (global_step, max_steps, epoch, log_history)."""
        return trainer_state(self)

    def save_model(self, output_dir: str | Path | None = None) -> Path | None:
        """TRL's ``save_model(output_dir)``: the model now (a LoRA run: its adapter) and its tokenizer, a Hugging Face
        folder (default train.output_dir); not a checkpoint (``save()``). after_train.save_hf_model."""
        return save_hf_model(self, output_dir)

    def log_metrics(self, split: str, metrics: dict[str, Any]) -> None:
        log_metrics(self, split, metrics)

    def save_metrics(self, split: str, metrics: dict[str, Any], combined: bool = True) -> Path | None:
        return save_metrics(self, split, metrics, combined)

    def save_state(self) -> Path | None:
        return save_state(self)

    def push_to_hub(self, *args: Any, **kwargs: Any) -> None:
        """Refused in one line with what to do, never a silent no-op (after_train.refuse_push_to_hub)."""
        refuse_push_to_hub(self)

    @property
    def accelerator(self) -> ProcessView:
        """print, is_main_process, wait_for_everyone, ... from grpokit's process group (ProcessView)."""
        return ProcessView(self.dist, self.device)

    def begin(self, log: RunLogger, stop=None) -> None:
        """The run's log is open (grpokit.run.loop): SFT has nothing of its own to say first."""

    def finish(self, summary: dict[str, Any], final: Path) -> None:
        """With LoRA the next stage loads a plain model folder, not an adapter: the summary's checkpoint is
        the merged model (OUTPUT/model), the adapter ``final`` its adapter_checkpoint."""
        if self.cfg.lora.enabled:
            summary.update(checkpoint=str(self.export_merged(self.run.out / "model")), adapter_checkpoint=str(final))

    def stop(self, reason: str) -> None:
        """End the run after the current step as a finished one (final evaluation, checkpoint, summary with
        ``stopped_early``): for callbacks."""
        self.stopped_early = reason

    def train_step(self) -> dict[str, float]:
        """One optimizer step on the next sft.batch_size examples (this rank's share under torchrun)."""
        t0 = time.perf_counter()
        picked = self.dist.my_share(self.stream.take(self.cfg.sft.batch_size))
        examples = [self.examples[i] for i in picked]
        lengths = torch.tensor([len(e.input_ids) for e in examples])  # (B,)
        trained = sum(e.num_loss_tokens for e in examples)
        num_tokens = self.dist.sum(torch.tensor(float(trained))).to(self.device)  # the step's normaliser
        order = length_sorted(torch.arange(len(examples)), lengths)  # similar lengths share a micro-batch

        def split(limit: int) -> list[dict[str, Any]]:  # rows, or packed a token budget (learner.micro)
            micros = self.learner.micro.split(order, lengths, limit)
            return [self._batch([examples[i] for i in chunk.tolist()]) for chunk in micros]

        grad_norm, parts = self.learner.step(lengths, split, self._loss_sum, num_tokens, step=self.step)
        used_lr = float(self.learner.optimizer.param_groups[0]["lr"])  # TRL's learning_rate: the step's own
        self.step += 1
        self.learner.scheduler.step()
        seconds = time.perf_counter() - t0
        # the step's sums over every rank, in one all-reduce
        nll, top1, entropy = self.dist.sum(torch.tensor([sum(float(p[k]) for p in parts) for k in SUMMED])).tolist()
        count = float(num_tokens.clamp(min=1))
        metrics = {
            "loss": float(nll) / count,
            # TRL SFTTrainer's: the share of trained tokens that are the logits' argmax, their mean entropy
            "mean_token_accuracy": float(top1) / count,
            "entropy": float(entropy) / count,
            "grad_norm": grad_norm if grad_norm is not None else float("nan"),
            "skipped_update": float(grad_norm is None),
            "tokens/trained": float(num_tokens),
            "tokens/input": float(self.dist.sum(lengths.sum().float())),
            "epoch": float(self.stream.epoch),
            **self.learner.metrics(),
            # time/step, tokens_per_s (summed over ranks under torchrun), peak_memory_mb (the largest)
            **step_costs(seconds, float(lengths.sum()), self.device, self.dist),
        }
        # lr: the one the step used, as grpokit train logs it (the learner's is already the next step's); TRL's
        # learning_rate the same, and num_tokens the input tokens so far (a resume reads its history back)
        metrics["lr"] = metrics["learning_rate"] = used_lr
        metrics["num_tokens"] = tokens_so_far(self.log_history, metrics["tokens/input"])
        return metrics

    def _batch(self, examples) -> dict[str, Any]:
        tensors = collate(examples, self.tokenizer.pad_token_id, self.packing)
        return {k: v.to(self.device) if v is not None else None for k, v in tensors.items()}

    def _loss_sum(self, model, batch: dict[str, Any]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(the micro-batch's summed NLL of trained tokens, stats); the Learner divides by the step's count."""
        logprobs, top1, entropy = self.dist.logprobs_fn(model, token_logprobs)(
            batch["input_ids"],
            batch["loss_mask"],
            attention_mask=batch["attention_mask"],
            position_ids=batch["position_ids"],
            chunk_size=self.cfg.optim.logprob_chunk_size,
            with_stats=True,
        )  # (K,) each, the trained tokens only
        loss = nll_sum(logprobs)
        return loss, {"nll_sum": loss.detach(), "top1": top1.sum(), "entropy_sum": entropy.sum()}

    # ----------------------------------------------------------------------------- eval, io

    @torch.no_grad()
    def eval_loss(self, examples: list | None = None) -> dict[str, float]:
        """Mean NLL of the held-out examples' trained tokens (``loss``), their count and perplexity (``examples``:
        encoded rows other than the run's held-out ones). Under torchrun every rank scores all of them: FSDP needs
        the same forwards on every rank, and a held-out set is small beside training."""
        was = self.model.training
        self.model.eval()
        examples = self.eval_examples if examples is None else examples
        lengths = torch.tensor([len(e.input_ids) for e in examples])  # (E,)
        sums, count = dict.fromkeys(SUMMED, 0.0), 0
        micro = self.learner.micro
        for chunk in micro.split(length_sorted(torch.arange(len(examples)), lengths), lengths, micro.limit(lengths)):
            batch = self._batch([examples[i] for i in chunk.tolist()])
            with self.learner.precision.autocast(self.device):
                _, stats = self._loss_sum(self.model, batch)
            for key in SUMMED:
                sums[key] += float(stats[key])
            count += int(batch["loss_mask"].sum())
        self.model.train(was)
        mean, accuracy, entropy = (sums[key] / max(1, count) for key in SUMMED)
        return {
            "loss": mean,
            "perplexity": math.exp(min(mean, 700.0)),
            "tokens": float(count),
            "mean_token_accuracy": accuracy,
            "entropy": entropy,
        }

    def evaluate(
        self, eval_dataset: Any = None, ignore_keys: Any = None, metric_key_prefix: str = "eval"
    ) -> dict[str, Any]:
        """transformers' ``trainer.evaluate()``: ``held_out_metrics`` (of ``eval_dataset``'s rows when given, in
        TRL's forms, formatted by the trainer's formatting_func; else the run's held-out rows) under grpokit's
        names and again under transformers' (``eval_loss``, ``eval_perplexity``, ``eval_runtime``, ...:
        after_train.trl_evaluation). ``ignore_keys`` names model outputs to drop in transformers; grpokit's
        evaluation reads none, so it changes nothing."""
        from grpokit.compat.trl.call import rows_of
        from grpokit.compat.trl.sft_call import formatted

        started = time.perf_counter()
        if eval_dataset is None and not self.eval_examples:
            raise ConfigError(
                "evaluate(): there are no held-out rows; give eval_dataset (to the trainer or to evaluate) or data.eval"
            )
        if eval_dataset is None:
            examples, prompts = None, None
        else:
            rows = formatted(rows_of(eval_dataset, "eval_dataset"), self.formatting_func, "eval_dataset")
            if not rows:
                raise ConfigError("evaluate(eval_dataset=...): the dataset has no rows; give at least one")
            examples = encode_examples(rows, self.tokenizer, self.cfg.data, self.cfg.sft.loss_on, "eval_dataset")
            self._check_positions(self.model.config.to_dict(), [(examples, "eval_dataset")])
            prompts = prompt_rows(rows, self.cfg.data, "eval_dataset") if self.accuracy_fn else []
        result = self.held_out_metrics(examples, prompts)
        count = len(self.eval_examples if examples is None else examples)
        return trl_evaluation(self, result, rows=count, prefix=metric_key_prefix,
                              seconds=time.perf_counter() - started)  # fmt: skip

    def held_out_metrics(self, examples: list | None = None, prompts: list[dict] | None = None) -> dict[str, float]:
        """Held-out loss (``loss``, ``perplexity``, ``tokens``), and with a reward the accuracy grpokit eval reports
        (greedy pass@1, mean/pass/maj@k) of generations from the held-out prompts: what the run logs to eval.jsonl.
        ``examples``/``prompts``: encoded rows and prompt rows other than the run's held-out ones."""
        result = self.eval_loss(examples)
        prompts = self.eval_prompts if prompts is None else prompts
        if prompts:
            from grpokit.rollout.evaluate import evaluate
            from grpokit.rollout.generation import FastGenerator

            was = self.model.training
            result.update(
                evaluate(
                    self.dist.generation_model(self.model, self.step),
                    self.tokenizer,
                    prompts,
                    accuracy_fn=self.accuracy_fn,
                    generator=FastGenerator(),
                    data_cfg=prompt_data_config(self.cfg.data),
                    eos_token_ids=eos_token_ids(self.tokenizer, self.model),
                    num_samples=self.cfg.eval.num_samples,
                    temperature=self.cfg.eval.temperature,
                    max_new_tokens=self.cfg.eval.max_new_tokens or 256,
                    seed=self.cfg.train.seed,
                    split=self.dist if self.dist.active else None,
                )
            )
            self.model.train(was)
        return result

    def save(self) -> Path:
        """Checkpoint this step (OUTPUT/checkpoints/step_N: a Hugging Face folder plus the trainer state)."""
        return self.run.save(self.step, self.learner, self.tokenizer, {"stream": self.stream.state()})

    def export_merged(self, path: Path) -> Path:
        """LoRA: the adapter merged into a copy of the base model (W + B A * alpha / r), saved with the
        tokenizer as a plain Hugging Face folder at ``path`` (written aside, then renamed into place)."""
        if self.dist.is_main:
            merged = copy.deepcopy(self.model).merge_and_unload()  # the trained model itself stays wrapped
            tmp = path.with_name(path.name + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            merged.save_pretrained(tmp, safe_serialization=True)
            self.tokenizer.save_pretrained(tmp)
            shutil.rmtree(path, ignore_errors=True)
            tmp.rename(path)
        self.dist.barrier()
        return path

@torch.no_grad()
def check_packing(model, device: torch.device) -> None:
    """Refuse sft.packing for a model whose attention does not keep packed examples apart: two short
    examples scored packed (position_ids restarting) must give their log-probs scored one by one
    (grpokit.model.logprobs.check_packed_attention, the RL passes' check too)."""
    if not check_packed_attention(model, device):
        raise ConfigError(
            f"sft.packing=true: {type(model).__name__} with attn_implementation {attention_implementation(model)!r} "
            "lets packed examples attend to each other (its attention does not read packed position_ids), so "
            "packing would change the loss; use model.attn_implementation sdpa, eager, flex_attention or "
            "flash_attention_2, or set sft.packing=false."
        )
