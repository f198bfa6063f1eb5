"""UpdateStats: the update's reported numbers, by hand."""

import copy
import math

import pytest
import torch

from grpokit.train.update_stats import UpdateStats


def test_token_weighted_means_merge_and_steps():
    a, b = UpdateStats(), UpdateStats()
    # micro-batch 1: 3 loss tokens, clip_frac 0.5; micro-batch 2: 1 token, clip_frac 1.0 -> (1.5 + 1) / 4
    a.add_loss(torch.tensor(0.2), {"clip_frac": torch.tensor(0.5), "num_tokens": torch.tensor(3.0)}, 3.0)
    b.add_loss(torch.tensor(0.4), {"clip_frac": torch.tensor(1.0)}, 1.0)
    mask = torch.tensor([[True, True, False]])
    b.add_sampler_diff(torch.tensor([[-1.0, -2.0, 0.0]]), torch.tensor([[-1.5, -2.0, 9.0]]), mask)  # 0.5, 0
    b.add_entropy(torch.tensor([[1.0, 3.0, 99.0]]), mask)  # mean 2
    a.merge(b)
    a.add_step(2.0)
    a.add_step(None)
    m = a.metrics(n_updates=2)
    assert m["clip_frac"] == 2.5 / 4 and "num_tokens" not in m
    assert m["loss"] == pytest.approx((0.2 + 0.4) / 2)  # losses summed, then averaged over steps
    assert (m["grad_norm"], m["skipped_updates"]) == (2.0, 1.0)
    assert (m["sampler_logprob_diff/mean"], m["sampler_logprob_diff/max"], m["entropy"]) == (0.25, 0.5, 2.0)
    assert math.isnan(UpdateStats().metrics(1)["entropy"])


def test_extremes_are_the_smallest_and_largest_over_micro_batches_and_ranks():
    """ratio_min over two micro-batches (10 tokens at 0.9, 2 at 0.5) is 0.5, not their token-weighted 0.833;
    ratio_max 1.4; a micro-batch without loss tokens (whose minimum is a placeholder 0) takes no part; the
    per-sequence clip extremes the same way."""
    a, b, empty = UpdateStats(), UpdateStats(), UpdateStats()
    a.add_loss(torch.tensor(0.0), {"ratio_min": torch.tensor(0.9), "ratio_max": torch.tensor(1.1),
                                   "clip_frac_low/seq_min": torch.tensor(0.25)}, 10.0)  # fmt: skip
    b.add_loss(torch.tensor(0.0), {"ratio_min": torch.tensor(0.5), "ratio_max": torch.tensor(1.4),
                                   "clip_frac_low/seq_min": torch.tensor(0.5)}, 2.0)  # fmt: skip
    empty.add_loss(torch.tensor(0.0), {"ratio_min": torch.tensor(0.0), "ratio_max": torch.tensor(0.0)}, 0.0)
    a.merge(b)
    a.merge(empty)
    m = a.metrics(n_updates=1)
    assert (m["ratio_min"], m["ratio_max"], m["clip_frac_low/seq_min"]) == (0.5, pytest.approx(1.4), 0.25)

    class TwoRanks:  # what Distributed.gather returns: every rank's part, this rank's first
        active = True

        @staticmethod
        def gather(part):
            other = copy.deepcopy(part)
            if len(part) == 4:  # the sums' gather: (weighted, extremes of the sampler, sums, the loss's extremes)
                other[3]["ratio_min"] = 0.3
            return [part, other]

    a.over_ranks(TwoRanks())
    assert a.metrics(n_updates=1)["ratio_min"] == 0.3
