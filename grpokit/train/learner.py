"""The Learner: one model being trained, and everything that steps it. Any trainer composes one (GRPO's
policy, PPO's critic, supervised fine-tuning); it knows nothing of rollouts, rewards or which loss.

Owns: the model (loaded by ``load_model``: weights in the precision mode's dtype), its ``precision`` mode,
``optimizer``, learning-rate ``scheduler`` (grpokit.train.schedules: warm-up, then constant, cosine or linear;
``lr_factor(step)`` is its factor), float16 loss ``scaler``
(else None), and ``micro`` (rows per micro-batch: a fixed number, or auto, halved after a CUDA
out-of-memory error; under optim.packing a token budget per padding-free micro-batch instead; one
``MicroBatchSize`` may be shared by several learners, as the policy and the critic share it). Reads: ``dist`` (grpokit.train.distributed) for gradient averaging and the global norm.

    learner = Learner(model, precision, device, cfg.optim, dist, total_steps=cfg.train.steps)
    grad_norm, stats = learner.step(lengths, split, loss_fn, normaliser)   # one optimizer step, any loss
        lengths (B,)           real tokens per row of the batch (sizes the micro-batches under auto)
        split(rows)            the batch's micro-batches of at most ``rows`` rows each (re-split after an OOM;
                               packed: ``rows`` is a token budget, learner.micro.split cuts by it)
        loss_fn(model, micro)  (loss_sum, stats): the micro-batch's summed loss (0-d, with grad), a dict
        normaliser             the whole batch's divisor (e.g. its token count; under torchrun all ranks')
    The gradient is that of  sum_micro loss_sum / normaliser , so how the batch is split never changes it.
    grad_norm is None when a NaN/inf loss or gradient skipped the step.

Lower level, for losses that normalise themselves (the policy-gradient update, grpokit.train.update):
``learner.run_micro(fn, lengths)`` (``fn(rows)`` retried with fewer rows after an OOM), ``learner.backward(loss)``, ``learner.clip_and_step(finite,
step)``; for checkpoints ``learner.state()`` / ``learner.load_state(state, weights_from)``.
"""

from __future__ import annotations

import functools
import resource
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from grpokit.config.schema import Config, OptimConfig
from grpokit.core.errors import ConfigError, TrainingError
from grpokit.core.notices import Notices
from grpokit.data.packing import cut_to_count, token_budget_batches
from grpokit.model.checkpoint import load_weights_into
from grpokit.model.loading import load_policy, pick_device, prepare_policy
from grpokit.model.logprobs import attention_implementation, base_model, check_packed_attention
from grpokit.model.offload import activations_on_cpu
from grpokit.model.precision import Precision, make_grad_scaler, make_optimizer, resolve_precision
from grpokit.model.shared_prefix import shared_prefix_on
from grpokit.train.distributed import Distributed
from grpokit.train.schedules import lr_factor, warmup_steps

AUTO_MICRO_TOKENS = 4096
"""optim.micro_batch_size=auto off CUDA: rows per micro-batch x longest row <= this many tokens."""


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory of the run so far in MiB: allocated on the GPU, or the process's resident set."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def load_model(cfg: Config, model=None, tokenizer=None) -> tuple[Any, Any, Precision, torch.device]:
    """(model, tokenizer, precision, device): cfg.model loaded (or the given model prepared) with its
    parameters in the dtype the precision mode keeps weights in (grpokit.model.precision), LoRA applied."""
    if model is None:
        precision = resolve_precision(cfg.optim.precision, cfg.model.dtype, pick_device(cfg.model.device))
        model, tokenizer, device = load_policy(cfg.model, cfg.lora, precision.weight_dtype)
        return without_dropout(model, cfg.model.disable_dropout), tokenizer, precision, device
    device = next(model.parameters()).device
    # with model.dtype and optim.precision both auto, the given model's dtype decides
    given = str(next(model.parameters()).dtype).removeprefix("torch.")
    auto = cfg.model.dtype == "auto" and cfg.optim.precision == "auto"
    precision = resolve_precision(cfg.optim.precision, given if auto else cfg.model.dtype, device)
    for p in model.parameters():  # parameters only: buffers such as RoPE's inv_freq stay float32
        if p.is_floating_point():
            p.data = p.data.to(precision.weight_dtype)
    model = prepare_policy(model, cfg.model, cfg.lora)
    return without_dropout(model, cfg.model.disable_dropout), tokenizer, precision, device


def without_dropout(model: torch.nn.Module, disable: bool) -> torch.nn.Module:
    """``model`` with every dropout at 0 when ``disable`` (model.disable_dropout); as it is otherwise. TRL's
    disable_dropout_in_model sets each torch.nn.Dropout's p (the LoRA adapter's too); the attention's dropout of
    Qwen2, Llama and their kin is a float the attention module passes to its kernel (``attention_dropout``), which
    that leaves on: it is zeroed here too."""
    if disable:
        for module in model.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
            if isinstance(getattr(module, "attention_dropout", None), float):
                module.attention_dropout = 0.0
    return model


def _lr_factor(step: int, *, schedule: str, warmup: int, total: int) -> float:
    """grpokit.train.schedules.lr_factor as LambdaLR calls it (the step alone)."""
    return lr_factor(step, schedule, warmup, total)


class MicroBatchSize:
    """How a batch is cut into micro-batches, and the retry after an out-of-memory error.

    Padded (``tokens`` None): micro-batches of rows, ``setting`` = optim.micro_batch_size (a number, used as
    given, or "auto"). Packed (``tokens`` = optim.micro_batch_tokens, a number or "auto"): padding-free
    micro-batches of at most that many real tokens (grpokit.data.packing.token_budget_batches); auto learns
    the budget as the padded auto learns rows. ``limit(lengths)`` is the rows, or the token budget, of the
    next pass; ``split(order, lengths, limit)`` its micro-batches. ``cap``: under auto on CUDA, the limit
    that last fitted (None until an OOM); ``last``: the most rows a micro-batch of the last successful pass
    held (the micro_batch_size metric). Under torchrun every rank runs as many micro-batches (DDP and FSDP
    communicate in each forward and backward): padded, the rows come from the longest row over ranks; packed,
    the ranks agree on the largest count (an all-reduce max) and a rank that packed fewer cuts its fullest
    micro-batches in two (grpokit.data.packing.cut_to_count), so no budget is exceeded and no pass is empty."""

    def __init__(
        self,
        setting: int | str,
        device: torch.device,
        dist: Distributed,
        say: Notices | None = None,
        make_room: Callable[[], bool] | None = None,
        *,
        tokens: int | str | None = None,
    ):
        self.setting, self.device, self.dist = setting, device, dist
        self.tokens = tokens
        self.say = say or Notices()
        self.make_room = make_room  # frees device memory held elsewhere (the sampler's KV cache); True if any
        self.room_first = False  # once room had to be made, it is made before every pass (the sampler rebuilds it)
        self.cap: int | None = None
        self.last = 0
        self._most_rows = 0  # packed: the most rows of a micro-batch split in the current pass

    @property
    def packed(self) -> bool:
        """Padding-free micro-batches sized in tokens (optim.packing)."""
        return self.tokens is not None

    def limit(self, lengths: torch.Tensor) -> int:
        """Rows per micro-batch (padded, see ``rows``), or packed its token budget: optim.micro_batch_tokens
        as given; under auto on CUDA every row at once until an out-of-memory error halves it, elsewhere
        AUTO_MICRO_TOKENS."""
        if not self.packed:
            return self.rows(lengths)
        if self.tokens != "auto":
            return int(self.tokens)
        if self.device.type == "cuda":
            total = max(1, int(lengths.sum()))
            return min(total, self.cap or total)
        return AUTO_MICRO_TOKENS

    def split(self, order: torch.Tensor, lengths: torch.Tensor, limit: int) -> list[torch.Tensor]:
        """``order`` (M,) row indices in micro-batches: of ``limit`` rows (padded), or of at most ``limit``
        tokens, a row costing ``lengths[row]`` (packed; under torchrun as many on every rank, see the class)."""
        if not self.packed:
            micros = list(order.split(limit))
        else:
            micros = token_budget_batches(order, lengths, limit)
            if self.dist.active:  # every rank must run the same collectives: the largest count on all
                micros = cut_to_count(micros, lengths, self.dist.max_int(len(micros)))
        self._most_rows = max([self._most_rows, *(len(m) for m in micros)])
        return micros

    def rows(self, lengths: torch.Tensor) -> int:
        """Rows per micro-batch for rows of ``lengths`` (real tokens each). auto: on CUDA every row at once
        until an out-of-memory error halves it (remembered for the rest of the run); elsewhere as many rows
        as fit AUTO_MICRO_TOKENS tokens (a CPU process cannot survive running out of memory to learn from it)."""
        n = max(1, len(lengths))
        if self.setting != "auto":
            return int(self.setting)
        if self.device.type == "cuda":
            return min(n, self.cap or n)
        longest = self.dist.max_int(int(lengths.max()) if len(lengths) else 1)  # equal micro counts on ranks
        return max(1, min(n, AUTO_MICRO_TOKENS // max(1, longest)))

    def run(self, fn: Callable[[int], Any], lengths: torch.Tensor, on_oom: Callable[[], None]) -> Any:
        """``fn(rows)`` with rows = rows(lengths). After an out-of-memory error ``on_oom`` drops the partial
        gradient; then, first, ``make_room`` frees what the sampler holds on the device and the same rows are
        tried again, and from then on room is made before every pass (the next rollout rebuilds the cache:
        waiting for it to fail again would cost a failed try a pass); after that, under auto, half the rows.
        With a batch-wide loss normaliser the retried gradient is the one the first try would have given."""
        if self.room_first and self.make_room():
            torch.cuda.empty_cache()
        while True:
            rows = self.limit(lengths)  # packed: a token budget
            self._most_rows = 0
            try:
                result = fn(rows)
                self.last = self._most_rows if self.packed else rows
                return result
            except torch.cuda.OutOfMemoryError as e:
                message = str(e).split(". ")[0]
            # Outside the except block: the failed try's frames (its activations) are freed by now.
            on_oom()
            if self.dist.active:  # torchrun: a retry on this rank alone would run collectives the others do not
                what = "tokens" if self.packed else "completions"
                raise TrainingError(
                    f"out of GPU memory on rank {self.dist.rank} with micro-batches of {rows} {what} ({message}); "
                    "under torchrun one rank cannot retry alone (the others are inside the same collectives): lower "
                    f"{'optim.micro_batch_tokens' if self.packed else 'optim.micro_batch_size'}, or turn on "
                    "model.gradient_checkpointing, optim.offload_activations or optim.offload_optimizer"
                )
            if self.make_room is not None and self.make_room():
                torch.cuda.empty_cache()
                self.room_first = True
                self.say(f"out of GPU memory at {rows} rows per micro-batch: freed the sampler's KV cache, retrying")
                continue
            if self.packed:
                longest = int(lengths.max()) if len(lengths) else 1
                if self.tokens != "auto" or rows <= longest:
                    raise TrainingError(
                        f"out of GPU memory with micro-batches of {rows} tokens ({message}): lower "
                        "optim.micro_batch_tokens, set it to auto, turn on model.gradient_checkpointing or "
                        "optim.offload_activations"
                    )
                torch.cuda.empty_cache()
                self.cap = max(longest, rows // 2)
                self.say(f"out of GPU memory at {rows} tokens per micro-batch: retrying with {self.cap} (auto)")
                continue
            if self.setting != "auto" or rows == 1:
                raise TrainingError(
                    f"out of GPU memory with {rows} completions per micro-batch ({message}): lower "
                    "optim.micro_batch_size, set it to auto, or turn on model.gradient_checkpointing"
                )
            torch.cuda.empty_cache()
            self.cap = rows // 2
            self.say(f"out of GPU memory at {rows} rows per micro-batch: retrying with {rows // 2} (auto)")


class Learner:
    """A model with its optimizer, schedule, loss scaler and micro-batching (see the module docstring)."""

    def __init__(
        self,
        model: torch.nn.Module,
        precision: Precision,
        device: torch.device,
        optim: OptimConfig,
        dist: Distributed | None = None,
        *,
        total_steps: int,
        micro: MicroBatchSize | None = None,
        say: Notices | None = None,
        make_room: Callable[[], bool] | None = None,
        packing: bool | None = None,
    ):
        self.model, self.precision, self.device = model, precision, device
        self.dist = dist or Distributed()
        self.max_grad_norm = optim.max_grad_norm
        self.say = say or Notices()
        self.offload_activations = optim.offload_activations
        packing = optim.packing if packing is None else packing
        if micro is None:
            tokens = optim.micro_batch_tokens if packing else None
            micro = MicroBatchSize(optim.micro_batch_size, device, self.dist, self.say, make_room, tokens=tokens)
            # a forward of the model's own: under fsdp on the whole copy wrap() kept (the shards need their root)
            if packing and not check_packed_attention(self.dist.unsharded(model), device):
                raise ConfigError(
                    f"packing (optim.packing / sft.packing): {type(base_model(model)).__name__} with "
                    f"attn_implementation {attention_implementation(model)!r} lets packed rows attend to each "
                    "other (its attention does not read packed position_ids), so packing would change the loss; "
                    "use model.attn_implementation sdpa, eager, flex_attention or flash_attention_2, or set "
                    "optim.packing=false and sft.packing=false"
                )
        self.micro = micro
        # optim.shared_prefix: each prompt once in the log-prob forwards (one process: the FSDP/DDP root is bypassed)
        self.shared_prefix = (
            shared_prefix_on(optim.shared_prefix, self.device) and not self.dist.active and not self.micro.packed
        )
        self.fused_logprobs = optim.fused_logprobs  # grpokit.model.fused_logprobs in every log-prob forward
        if optim.offload_optimizer and self.dist.active:
            raise ConfigError(
                "optim.offload_optimizer is not supported under torchrun yet (FSDP shards the states already); "
                "set it to false"
            )
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = make_optimizer(params, precision, optim, device)
        self.scaler = make_grad_scaler(precision, device)  # float16 loss scaling, else None
        warmup = warmup_steps(total_steps, optim.warmup_steps, optim.warmup_ratio)
        # step -> the learning rate's factor (grpokit.train.schedules), what the scheduler applies
        self.lr_factor = functools.partial(
            _lr_factor, schedule=optim.schedule, warmup=warmup, total=total_steps
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self.lr_factor)

    # ----------------------------------------------------------------------------- one optimizer step

    def step(
        self,
        lengths: torch.Tensor,
        split: Callable[[int], Iterable[Any]],
        loss_fn: Callable[[torch.nn.Module, Any], tuple[torch.Tensor, dict]],
        normaliser: float | torch.Tensor,
        *,
        step: int = 0,
    ) -> tuple[float | None, list[dict]]:
        """One optimizer step on a batch: the gradient of sum_micro loss_sum / normaliser, accumulated over
        ``split(rows)`` under the precision's autocast (retried with fewer rows after an OOM under auto),
        then clipped and applied. Returns (grad norm or None when skipped, each micro-batch's stats)."""
        self.model.train()

        def accumulate(rows: int) -> tuple[list[dict], bool]:
            self.optimizer.zero_grad(set_to_none=True)  # a retry starts afresh
            stats: list[dict] = []
            for micro in split(rows):
                with self.precision.autocast(self.device), self.activations_offloaded():
                    loss_sum, micro_stats = loss_fn(self.model, micro)
                loss = loss_sum / normaliser
                if not torch.isfinite(loss) and not self.dist.active:  # ranks: the global norm is NaN
                    return stats, False
                self.backward(loss)
                stats.append(micro_stats)
            return stats, True

        stats, finite = self.run_micro(accumulate, lengths)
        return self.clip_and_step(finite, step), stats

    def activations_offloaded(self):
        """Context of a training forward: what it saves for the backward pass kept in CPU memory under
        optim.offload_activations (grpokit.model.offload.activations_on_cpu), else a no-op."""
        return activations_on_cpu(self.offload_activations, self.device)

    def run_micro(self, fn: Callable[[int], Any], lengths: torch.Tensor) -> Any:
        """``fn(rows)`` sized by ``micro``; after an OOM this learner's partial gradient is dropped first."""
        return self.micro.run(fn, lengths, on_oom=lambda: self.optimizer.zero_grad(set_to_none=True))

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of ``loss`` (already divided by the batch-wide normaliser). DDP/FSDP average gradients
        over ranks, so it is multiplied by the world size first (N * mean = the sum); float16 scales it."""
        scaled = loss * self.dist.world
        (self.scaler.scale(scaled) if self.scaler is not None else scaled).backward()

    def clip_and_step(self, finite: bool, step: int = 0, label: str = "update") -> float | None:
        """Unscale (float16), clip to optim.max_grad_norm, check, step. A NaN/inf loss or gradient skips the
        update instead of corrupting the weights; under loss scaling it also lowers the scale (GradScaler's
        own rule). Returns the gradient norm, or None when skipped. ``step``: the run's step (messages)."""
        optimizer, scaler = self.optimizer, self.scaler
        params = [p for p in self.model.parameters() if p.requires_grad]
        if finite:
            if scaler is not None:
                scaler.unscale_(optimizer)
            max_norm = self.max_grad_norm if self.max_grad_norm > 0 else float("inf")
            norm = torch.nn.utils.clip_grad_norm_(params, max_norm)  # FSDP2: a DTensor, the global norm
            norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
            finite = bool(torch.isfinite(norm))
            if scaler is not None:
                if finite:
                    scaler.step(optimizer)
                scaler.update()  # halves the scale after an overflow, grows it after a quiet stretch
        if not finite:
            optimizer.zero_grad(set_to_none=True)
            if scaler is None:  # under loss scaling an overflow is routine: counted, not printed
                self.say(f"step {step + 1}: non-finite loss or gradient, {label} skipped")
            return None
        if scaler is None:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(norm)

    def metrics(self) -> dict[str, float]:
        """lr, loss_scale (float16 only) and micro_batch_size (rows per micro-batch of the last pass)."""
        out = {"lr": self.scheduler.get_last_lr()[0]}
        if self.scaler is not None:
            out["loss_scale"] = float(self.scaler.get_scale())
        out["micro_batch_size"] = float(self.micro.last)
        return out

    # ----------------------------------------------------------------------------- checkpoints

    def state(self) -> dict[str, Any]:
        """optimizer (consolidated on rank 0 under torchrun), scheduler, scaler and precision states."""
        return {
            "optimizer": self.dist.optimizer_state(self.model, self.optimizer),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "precision": self.precision.name,
            "micro": {"cap": self.micro.cap, "room_first": self.micro.room_first},
        }

    def load_state(self, state: dict[str, Any], weights_from: Path | None = None) -> None:
        """Restore ``state()`` (and the weights saved in ``weights_from``, a checkpoint folder, when given),
        weights first: an optimizer that keeps copies of them (optim.offload_optimizer) takes them anew."""
        if weights_from is not None:
            load_weights_into(self.model, weights_from)
        self.dist.load_optimizer(self.model, self.optimizer, state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        micro = state.get("micro") or {}
        self.micro.cap = micro.get("cap", self.micro.cap)
        self.micro.room_first = micro.get("room_first", self.micro.room_first)
