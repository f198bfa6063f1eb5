"""The update's micro-batch machinery: a mini-batch's gradient accumulated over micro-batches sized to
fit memory (retried smaller after an out-of-memory error), the optimizer step, and no-grad log-probs.

``MicroBatchMixin`` holds these GRPOTrainer methods; ``GRPOTrainer.update`` drives them."""

from __future__ import annotations

import contextlib
import resource
import sys
from collections.abc import Callable, Iterator

import torch

from grpokit.algos import get_loss
from grpokit.batch import length_sorted
from grpokit.errors import TrainingError
from grpokit.generation import Rollout
from grpokit.update_stats import UpdateStats

AUTO_MICRO_TOKENS = 4096
"""optim.micro_batch_size=auto off CUDA: rows per micro-batch x longest row <= this many tokens."""


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory of the run so far in MiB: allocated on the GPU, or the process's resident set."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


class MicroBatchMixin:
    """GRPOTrainer's gradient accumulation, optimizer step and batched no-grad log-probs."""

    def _loss_mask(self, r: Rollout) -> torch.Tensor:
        """(N, Lc) the tokens the losses train on: the completion mask, with truncated completions left out
        under DAPO's overlong filtering (algo.mask_truncated)."""
        loss_mask = r.completion_mask.clone()  # (N, Lc)
        if self.algo.batch.mask_truncated:
            loss_mask[r.truncated] = 0
        return loss_mask

    def _mini_batch_order(self, n: int) -> Iterator[torch.Tensor]:
        """The update's mini-batches, each (M,) row indices: optim.epochs passes over the n rows, each split
        into optim.mini_batches. Several passes shuffle each pass with a generator seeded from the step, so
        the policy's update and the critic's (grpokit.critic) see the same rows in the same order."""
        mini = n // self.cfg.optim.mini_batches
        order_gen = torch.Generator().manual_seed(self._seed(0))
        for _ in range(self.cfg.optim.epochs):
            order = torch.randperm(n, generator=order_gen) if self._several_passes() else torch.arange(n)
            for m in range(self.cfg.optim.mini_batches):
                yield order[m * mini : (m + 1) * mini]  # (M,)

    def _mini_batch_gradients(
        self, r, mb, rows, advantages, loss_mask, lengths, old_logprobs, ref_logprobs, first, record=None
    ) -> tuple[UpdateStats, bool]:
        """Accumulate the gradient of mini-batch ``mb`` (M,) over micro-batches of ``rows`` rows, sorted by
        length. Returns its UpdateStats (loss metrics; sampler-vs-trainer log-prob differences and entropy
        on the first mini-batch) and whether every loss was finite (a NaN/inf loss stops the accumulation).
        Nothing outside changes but the parameters' .grad, and ``record`` (a rollout_record.TokenRecorder, at
        the steps whose rollouts are saved), which gets each micro-batch's per-token numbers as the loss saw them."""
        cfg, algo = self.cfg, self.algo
        loss_fn = get_loss(algo.loss.name)
        # the whole mini-batch's normaliser, over every rank under torchrun (grpokit.distributed)
        num_tokens = self.dist.sum(loss_mask[mb].sum()).clamp(min=1).to(self.device)
        stats = UpdateStats()
        for micro in length_sorted(mb, lengths).split(rows):
            tensors = self._micro_tensors(r, micro, loss_mask)
            with self.precision.autocast(self.device):
                logprobs, entropy = self.dist.logprobs_fn(self.model)(
                    tensors["prompt_ids"],
                    tensors["prompt_mask"],
                    tensors["completion_ids"],
                    tensors["completion_mask"],
                    temperature=cfg.rollout.temperature,
                    chunk_size=cfg.optim.logprob_chunk_size,
                    with_entropy=first or record is not None,
                    context_mask=tensors.get("context_mask"),
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
                num_sequences=len(mb) * self.dist.world,
                num_tokens=num_tokens,
            )
            if not torch.isfinite(loss) and not self.dist.active:  # ranks: the global norm is NaN, all skip
                return stats, False
            scaled = loss * self.dist.world  # DDP/FSDP average gradients over ranks: N * mean = the sum
            (self.scaler.scale(scaled) if self.scaler is not None else scaled).backward()
            stats.add_loss(loss, loss_stats, float(mask.sum()))
            if record is not None:
                record.add(micro, logprobs, old, ref, adv, mask, entropy)
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
        longest = self.dist.max_int(int(lengths.max()) if len(lengths) else 1)  # equal micro counts on ranks
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
                if self.cfg.optim.micro_batch_size != "auto" or rows == 1 or self.dist.active:
                    raise TrainingError(
                        f"out of GPU memory with {rows} completions per micro-batch: lower "
                        "optim.micro_batch_size, set it to auto, or turn on model.gradient_checkpointing"
                    ) from e
                torch.cuda.empty_cache()
                self.auto_micro_rows = rows // 2
                message = f"out of GPU memory at {rows} rows per micro-batch: retrying with {rows // 2} (auto)"
                self.log.print(message) if self.log else print(message, file=sys.stderr)

    def _clip_and_step(
        self, finite: bool, model=None, optimizer=None, scaler=None, label="update"
    ) -> float | None:
        """Unscale (float16), clip, check, step the policy (default) or the given model (PPO's critic, with
        its optimizer and scaler). A NaN/inf loss or gradient skips the update instead of corrupting the
        weights; under loss scaling it also lowers the scale (GradScaler's own rule). Returns the norm."""
        if model is None:
            model, optimizer, scaler = self.model, self.optimizer, self.scaler
        params = [p for p in model.parameters() if p.requires_grad]
        if finite:
            if scaler is not None:
                scaler.unscale_(optimizer)
            max_norm = self.cfg.optim.max_grad_norm if self.cfg.optim.max_grad_norm > 0 else float("inf")
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
                message = f"step {self.step + 1}: non-finite loss or gradient, {label} skipped"
                self.log.print(message) if self.log else print(message)
            return None
        if scaler is None:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(norm)

    def _micro_tensors(
        self, r: Rollout, idx: torch.Tensor, loss_mask: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """Rows ``idx`` of the batch, trimmed to their own longest prompt/completion, on device; with
        "context_mask" for multi-turn rollouts (the tool tokens attended to, see Rollout.context_mask)."""
        pm = r.prompt_mask[idx]
        cm = r.attention_mask[idx]
        p_start = int((pm.sum(0) > 0).nonzero().min()) if pm.any() else 0
        c_len = max(1, int((cm.sum(0) > 0).nonzero().max()) + 1) if cm.any() else 1
        d = self.device
        extra = {} if r.context_mask is None else {"context_mask": cm[:, :c_len].to(d)}
        return extra | {
            "prompt_ids": r.prompt_ids[idx][:, p_start:].to(d),
            "prompt_mask": pm[:, p_start:].to(d),
            "completion_ids": r.completion_ids[idx][:, :c_len].to(d),
            "completion_mask": r.completion_mask[idx][:, :c_len].to(d),
            "loss_mask": loss_mask[idx][:, :c_len].to(d),
            "sample_logprobs": r.logprobs[idx][:, :c_len].to(d),
        }

    @torch.no_grad()
    def _rows_no_grad(
        self, r: Rollout, forward: Callable[[dict[str, torch.Tensor]], torch.Tensor]
    ) -> torch.Tensor:
        """(N, Lc) on the CPU: ``forward(tensors)`` -> (n, L) over micro-batches of length-sorted rows (tensors
        as from _micro_tensors), under the update's autocast, sized and retried as the update's are."""
        N, Lc = r.completion_ids.shape
        out = torch.zeros(N, Lc)
        lengths = r.row_lengths  # (N,)

        def run(rows: int) -> None:
            for micro in length_sorted(torch.arange(N), lengths).split(rows):
                t = self._micro_tensors(r, micro, r.completion_mask)
                with self.precision.autocast(self.device):  # the same numerics as the update
                    values = forward(t)  # (n, L)
                out[micro, : values.shape[1]] = values.float().cpu()

        self._with_micro_retry(run, lengths)
        return out

    def _logprobs_no_grad(self, model, r: Rollout, reference: bool = False) -> torch.Tensor:
        """(N, Lc) log-probs of the batch's completions under ``model`` (the reference when asked:
        with LoRA that is the base model with the adapter disabled)."""
        if reference and model is None:
            ctx = self.model.disable_adapter()
            model = self.model
        else:
            ctx = contextlib.nullcontext()
        was_training = self.model.training
        model.eval()
        logprobs_fn = self.dist.logprobs_fn(model)  # torchrun: through FSDP/DDP's root module

        def forward(t: dict[str, torch.Tensor]) -> torch.Tensor:
            logprobs, _ = logprobs_fn(
                t["prompt_ids"],
                t["prompt_mask"],
                t["completion_ids"],
                t["completion_mask"],
                temperature=self.cfg.rollout.temperature,
                chunk_size=self.cfg.optim.logprob_chunk_size,
                context_mask=t.get("context_mask"),
            )
            return logprobs  # (n, L)

        with ctx:
            out = self._rows_no_grad(r, forward)
        self.model.train(was_training)
        return out
