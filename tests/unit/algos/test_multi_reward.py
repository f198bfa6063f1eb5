"""GDPO's normalise-then-sum of several rewards (grpokit.algos.multi_reward), with numbers worked by hand."""

from __future__ import annotations

import math

import pytest
import torch

from grpokit.algos.multi_reward import normalize_then_sum


def test_each_reward_is_normalised_within_its_group_before_the_sum():
    # one group of 2: accuracy [1, 0] -> mean 0.5, std 0.70711 -> +-0.5 / 0.70721 = +-0.70701;
    # length [10, 30] -> mean 20, std 14.1421 -> -+10 / 14.1422 = -+0.70710; sums -+0.000095: a tie, where the plain
    # sum [11, 30] lets the length decide
    got = normalize_then_sum(torch.tensor([[1.0, 10.0], [0.0, 30.0]]), torch.tensor([1.0, 1.0]), 2)
    assert got.tolist() == pytest.approx([-0.0000950, 0.0000950], abs=2e-7)
    # weights scale each normalised reward: accuracy x 2 -> 2 * 0.707007 - 0.707102 = 0.706912
    got = normalize_then_sum(torch.tensor([[1.0, 10.0], [0.0, 30.0]]), torch.tensor([2.0, 1.0]), 2)
    assert got.tolist() == pytest.approx([0.706912, -0.706912], abs=1e-6)


def test_groups_are_separate_and_a_missing_value_stays_out():
    # two groups of 3, one reward. Group 1 [1, 0, None]: mean 0.5, std 0.70711 over the two -> +-0.70701, None -> 0.
    # Group 2 [2, 2, 2]: std 0 -> (x - 2) / 1e-4 = 0 for all
    x = torch.tensor([[1.0], [0.0], [math.nan], [2.0], [2.0], [2.0]])
    got = normalize_then_sum(x, torch.tensor([1.0]), 3)
    assert got.tolist() == pytest.approx([0.70701, -0.70701, 0.0, 0.0, 0.0, 0.0], abs=1e-5)
    # a reward with a single value in its group has no std: it adds nothing (TRL: NaN, then nansum)
    one = normalize_then_sum(torch.tensor([[1.0, 3.0], [0.0, math.nan]]), torch.tensor([1.0, 1.0]), 2)
    assert one.tolist() == pytest.approx([0.70701, -0.70701], abs=1e-5)
    with pytest.raises(ValueError, match="group_size"):
        normalize_then_sum(torch.zeros(5, 1), torch.ones(1), 2)
