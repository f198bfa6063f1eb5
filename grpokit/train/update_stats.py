"""What one rollout's update reports, summed as micro-batches go by and averaged at the end.

Kept apart from the gradient loop so that `PolicyUpdate.update` reads as the optimisation alone.
Each mini-batch fills its own UpdateStats (an out-of-memory retry throws a partial one away) and
`merge`s it into the rollout's after it finished.
"""

from __future__ import annotations

import math

import torch


class UpdateStats:
    """Sums over micro-batches; `metrics()` turns them into the logged means."""

    def __init__(self) -> None:
        self.weighted: dict[str, float] = {}  # loss metric name -> sum of value * loss tokens
        self.weight = 0.0  # loss tokens seen
        self.loss_sum = 0.0  # sum of the micro-batch losses (each already globally normalised)
        self.grad_norms: list[float] = []
        self.skipped = 0
        self.sample_diff_sum = self.sample_diff_max = self.sample_tokens = 0.0
        self.entropy_sum = self.entropy_tokens = 0.0

    def add_loss(self, loss: torch.Tensor, stats: dict[str, torch.Tensor], tokens: float) -> None:
        """One micro-batch's loss and its metrics (token means over `tokens` loss tokens)."""
        self.weight += tokens
        self.loss_sum += float(loss.detach())
        for k, v in stats.items():
            if k != "num_tokens":
                self.weighted[k] = self.weighted.get(k, 0.0) + float(v) * tokens

    def add_sampler_diff(
        self, logprobs: torch.Tensor, sample_logprobs: torch.Tensor, mask: torch.Tensor
    ) -> None:
        """|trainer log-prob - sampler log-prob| over the generated tokens `mask`. All (n, L)."""
        diff = (logprobs.detach() - sample_logprobs).abs()[mask]  # (tokens,)
        if diff.numel():
            self.sample_diff_sum += float(diff.sum())
            self.sample_diff_max = max(self.sample_diff_max, float(diff.max()))
            self.sample_tokens += diff.numel()

    def add_entropy(self, entropy: torch.Tensor | None, mask: torch.Tensor) -> None:
        """Per-token entropy (n, L) over the generated tokens `mask` (n, L)."""
        if entropy is not None:
            self.entropy_sum += float(entropy[mask].sum())
            self.entropy_tokens += float(mask.sum())

    def add_step(self, grad_norm: float | None) -> None:
        """One optimizer step's gradient norm, or None when it was skipped (non-finite)."""
        if grad_norm is None:
            self.skipped += 1
        else:
            self.grad_norms.append(grad_norm)

    def merge(self, other: UpdateStats) -> None:
        """Add a finished mini-batch's sums."""
        for k, v in other.weighted.items():
            self.weighted[k] = self.weighted.get(k, 0.0) + v
        self.weight += other.weight
        self.loss_sum += other.loss_sum
        self.sample_diff_sum += other.sample_diff_sum
        self.sample_diff_max = max(self.sample_diff_max, other.sample_diff_max)
        self.sample_tokens += other.sample_tokens
        self.entropy_sum += other.entropy_sum
        self.entropy_tokens += other.entropy_tokens

    def over_ranks(self, ranks) -> None:
        """Sum the sums over ranks, the largest sampler difference (in place), so that metrics() are the
        global batch's. ``ranks``: grpokit.train.distributed.Distributed; alone, nothing changes."""
        if not ranks.active:
            return
        fields = ("weight", "loss_sum", "sample_diff_sum", "sample_tokens", "entropy_sum", "entropy_tokens")
        parts = ranks.gather((self.weighted, self.sample_diff_max, [getattr(self, f) for f in fields]))
        self.weighted = {k: sum(p[0].get(k, 0.0) for p in parts) for k in self.weighted}
        self.sample_diff_max = max(p[1] for p in parts)
        for i, field in enumerate(fields):
            setattr(self, field, sum(p[2][i] for p in parts))

    def metrics(self, n_updates: int) -> dict[str, float]:
        """Loss metrics averaged over loss tokens, loss averaged over optimizer steps, and the rest."""
        nan = math.nan
        out = {k: v / max(self.weight, 1.0) for k, v in self.weighted.items()}
        out["loss"] = self.loss_sum / n_updates
        out["grad_norm"] = sum(self.grad_norms) / len(self.grad_norms) if self.grad_norms else nan
        out["skipped_updates"] = float(self.skipped)
        out["entropy"] = self.entropy_sum / self.entropy_tokens if self.entropy_tokens else nan
        out["sampler_logprob_diff/mean"] = (
            self.sample_diff_sum / self.sample_tokens if self.sample_tokens else nan
        )
        out["sampler_logprob_diff/max"] = self.sample_diff_max
        return out
