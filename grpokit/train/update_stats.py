"""What one rollout's update reports, summed as micro-batches go by and averaged at the end.

Kept apart from the gradient loop so that `PolicyUpdate.update` reads as the optimisation alone.
Each mini-batch fills its own UpdateStats (an out-of-memory retry throws a partial one away) and
`merge`s it into the rollout's after it finished.
"""

from __future__ import annotations

import math

import torch

from grpokit.algos.mismatch import mismatch_sums

EXTREMES = {"ratio_min": min, "ratio_max": max, "clip_frac_low/seq_min": min, "clip_frac_high/seq_max": max}
"""Loss metrics that are extremes, not means: kept as the smallest / largest over the micro-batches (and ranks) that
had loss tokens, where the others are averaged over tokens."""


class UpdateStats:
    """Sums over micro-batches; `metrics()` turns them into the logged means."""

    def __init__(self) -> None:
        self.extremes: dict[str, float] = {}  # EXTREMES' names -> the smallest / largest so far
        self.weighted: dict[str, float] = {}  # loss metric name -> sum of value * loss tokens
        self.weight = 0.0  # loss tokens seen
        self.loss_sum = 0.0  # sum of the micro-batch losses (each already globally normalised)
        self.grad_norms: list[float] = []
        self.skipped = 0
        self.sample_diff_sum = self.sample_diff_max = self.sample_tokens = 0.0
        self.sample_kl_sum = 0.0  # sum over the sampled tokens of k3(old, sampler) (grpokit.algos.mismatch)
        self.is_sum = self.is_bounded = self.is_tokens = 0.0  # the mismatch correction's weights
        self.is_sq_sum = 0.0  # their squares: the effective sample size
        self.is_min, self.is_max = math.inf, -math.inf
        self.entropy_sum = self.entropy_tokens = 0.0
        self.trained_entropy_sum = self.trained_tokens = 0.0  # the same over the tokens the loss trains on

    def add_loss(self, loss: torch.Tensor, stats: dict[str, torch.Tensor], tokens: float) -> None:
        """One micro-batch's loss and its metrics (token means over `tokens` loss tokens)."""
        self.weight += tokens
        self.loss_sum += float(loss.detach())
        for k, v in stats.items():
            if k in EXTREMES:
                value = float(v)
                if tokens and not math.isnan(value):  # a micro-batch without loss tokens has no extreme
                    self._extreme(k, value)
            elif k != "num_tokens":
                self.weighted[k] = self.weighted.get(k, 0.0) + float(v) * tokens

    def _extreme(self, key: str, value: float) -> None:
        self.extremes[key] = EXTREMES[key](self.extremes.get(key, value), value)

    def add_sampler_diff(
        self, logprobs: torch.Tensor, sample_logprobs: torch.Tensor, mask: torch.Tensor
    ) -> None:
        """|trainer log-prob - sampler log-prob| and the KL estimate k3 over the generated tokens `mask`, from
        the update's first mini-batch (where the trainer's log-probs are the old policy's). All (n, L)."""
        sums = mismatch_sums(logprobs, sample_logprobs, mask)
        if sums["tokens"]:
            self.sample_diff_sum += sums["abs_diff"]
            self.sample_diff_max = max(self.sample_diff_max, sums["max_abs_diff"])
            self.sample_kl_sum += sums["kl_k3"]
            self.sample_tokens += sums["tokens"]

    def add_is_weights(self, weights: torch.Tensor, raw_equal: torch.Tensor, mask: torch.Tensor) -> None:
        """The mismatch correction's weights (n, L) over the loss tokens `mask`; `raw_equal` (n, L) bool: where
        the weight is the unbounded ratio (elsewhere the cap or floor truncated or masked it)."""
        m = mask.bool()
        w = weights.detach()[m]
        if w.numel():
            self.is_sum += float(w.sum())
            self.is_sq_sum += float((w.double() * w.double()).sum())
            self.is_bounded += float((~raw_equal[m]).sum())
            self.is_tokens += w.numel()
            self.is_min, self.is_max = min(self.is_min, float(w.min())), max(self.is_max, float(w.max()))

    def add_entropy(
        self, entropy: torch.Tensor | None, mask: torch.Tensor, trained: torch.Tensor | None = None
    ) -> None:
        """Per-token entropy (n, L) over the generated tokens `mask` (n, L), and over the tokens the loss trains
        on, `trained` (n, L) bool (the loss mask, less what algo.top_entropy_quantile left out)."""
        if entropy is not None:
            self.entropy_sum += float(entropy[mask].sum())
            self.entropy_tokens += float(mask.sum())
            if trained is not None:
                self.trained_entropy_sum += float(entropy[trained].sum())
                self.trained_tokens += float(trained.sum())

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
        for k, v in other.extremes.items():
            self._extreme(k, v)
        self.weight += other.weight
        self.loss_sum += other.loss_sum
        self.sample_diff_sum += other.sample_diff_sum
        self.sample_diff_max = max(self.sample_diff_max, other.sample_diff_max)
        self.sample_tokens += other.sample_tokens
        self.sample_kl_sum += other.sample_kl_sum
        self.is_sum += other.is_sum
        self.is_sq_sum += other.is_sq_sum
        self.is_bounded += other.is_bounded
        self.is_tokens += other.is_tokens
        self.is_min, self.is_max = min(self.is_min, other.is_min), max(self.is_max, other.is_max)
        self.entropy_sum += other.entropy_sum
        self.entropy_tokens += other.entropy_tokens
        self.trained_entropy_sum += other.trained_entropy_sum
        self.trained_tokens += other.trained_tokens

    def over_ranks(self, ranks) -> None:
        """Sum the sums over ranks, the largest sampler difference (in place), so that metrics() are the
        global batch's. ``ranks``: grpokit.train.distributed.Distributed; alone, nothing changes."""
        if not ranks.active:
            return
        trained = ranks.gather((self.trained_entropy_sum, self.trained_tokens))
        self.trained_entropy_sum, self.trained_tokens = sum(p[0] for p in trained), sum(p[1] for p in trained)
        fields = (
            "weight", "loss_sum", "sample_diff_sum", "sample_tokens", "entropy_sum", "entropy_tokens",
            "sample_kl_sum", "is_sum", "is_bounded", "is_tokens", "is_sq_sum",
        )  # fmt: skip
        extremes = (self.sample_diff_max, self.is_min, self.is_max)
        parts = ranks.gather((self.weighted, extremes, [getattr(self, f) for f in fields], self.extremes))
        for part in parts:  # every rank's smallest / largest of each extreme
            for k, v in part[3].items():
                self._extreme(k, v)
        self.weighted = {k: sum(p[0].get(k, 0.0) for p in parts) for k in self.weighted}
        self.sample_diff_max = max(p[1][0] for p in parts)
        self.is_min, self.is_max = min(p[1][1] for p in parts), max(p[1][2] for p in parts)
        for i, field in enumerate(fields):
            setattr(self, field, sum(p[2][i] for p in parts))

    def metrics(self, n_updates: int) -> dict[str, float]:
        """Loss metrics averaged over loss tokens, loss averaged over optimizer steps, and the rest."""
        nan = math.nan
        out = {k: v / max(self.weight, 1.0) for k, v in self.weighted.items()}
        out.update(self.extremes)
        out["loss"] = self.loss_sum / n_updates
        out["grad_norm"] = sum(self.grad_norms) / len(self.grad_norms) if self.grad_norms else nan
        out["skipped_updates"] = float(self.skipped)
        out["entropy"] = self.entropy_sum / self.entropy_tokens if self.entropy_tokens else nan
        out["entropy/trained"] = self.trained_entropy_sum / self.trained_tokens if self.trained_tokens else nan
        out["sampler_logprob_diff/mean"] = (
            self.sample_diff_sum / self.sample_tokens if self.sample_tokens else nan
        )
        out["sampler_logprob_diff/max"] = self.sample_diff_max
        out["sampler_kl"] = self.sample_kl_sum / self.sample_tokens if self.sample_tokens else nan
        if self.is_tokens:  # rollout.mismatch_correction is on
            out["mismatch/weight_mean"] = self.is_sum / self.is_tokens
            out["mismatch/weight_min"] = self.is_min
            out["mismatch/weight_max"] = self.is_max
            out["mismatch/bounded_frac"] = self.is_bounded / self.is_tokens
            # Kish's effective sample size over the tokens, as a share: (sum w)^2 / (n sum w^2), 1 = all equal
            out["mismatch/ess"] = self.is_sum**2 / (self.is_tokens * self.is_sq_sum) if self.is_sq_sum else nan
        return out
