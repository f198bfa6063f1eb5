"""Importance-sampling correction and mismatch sums (grpokit.algos.mismatch), by hand."""

from __future__ import annotations

import math

import pytest
import torch

from grpokit.algos.mismatch import IS_MODES, is_weights, mismatch_sums

LN3, LNH = math.log(3.0), math.log(0.5)


def two_rows():
    """Row 0: delta = (ln 3, ln 0.5, padding); row 1: delta = (ln 0.5, 0, 0)."""
    sampler = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, -0.7, -0.9]])
    delta = torch.tensor([[LN3, LNH, 123.0], [LNH, 0.0, 0.0]])  # 123 sits in padding: ignored
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    return sampler + delta, sampler, mask


def test_token_truncate_caps_each_token_at_the_cap():
    old, sampler, mask = two_rows()
    w = is_weights(old, sampler, mask, "token_truncate", cap=2.0)
    # rho = (3, 0.5 | 0.5, 1, 1); 3 -> 2
    torch.testing.assert_close(w, torch.tensor([[2.0, 0.5, 0.0], [0.5, 1.0, 1.0]]))


def test_token_mask_zeroes_the_tokens_outside_the_bounds():
    old, sampler, mask = two_rows()
    w = is_weights(old, sampler, mask, "token_mask", cap=2.0, floor=0.6)
    # 3 > cap, 0.5 < floor: both 0; the 1s are kept
    torch.testing.assert_close(w, torch.tensor([[0.0, 0.0, 0.0], [0.0, 1.0, 1.0]]))


def test_token_truncate_with_a_floor_raises_the_small_ones():
    old, sampler, mask = two_rows()
    w = is_weights(old, sampler, mask, "token_truncate", cap=2.0, floor=0.6)
    torch.testing.assert_close(w, torch.tensor([[2.0, 0.6, 0.0], [0.6, 1.0, 1.0]]))


def test_sequence_modes_use_the_product_of_the_token_ratios():
    old, sampler, mask = two_rows()
    # row 0: 3 * 0.5 = 1.5 (the padding's 123 is not in it); row 1: 0.5 * 1 * 1 = 0.5
    w = is_weights(old, sampler, mask, "sequence_truncate", cap=2.0)
    torch.testing.assert_close(w, torch.tensor([[1.5, 1.5, 0.0], [0.5, 0.5, 0.5]]))
    w = is_weights(old, sampler, mask, "sequence_truncate", cap=1.2)
    torch.testing.assert_close(w, torch.tensor([[1.2, 1.2, 0.0], [0.5, 0.5, 0.5]]))
    w = is_weights(old, sampler, mask, "sequence_mask", cap=1.2)
    torch.testing.assert_close(w, torch.tensor([[0.0, 0.0, 0.0], [0.5, 0.5, 0.5]]))


def test_none_is_the_mask_and_no_cap_leaves_the_ratio():
    old, sampler, mask = two_rows()
    assert torch.equal(is_weights(old, sampler, mask, "none"), mask.float())
    w = is_weights(old, sampler, mask, "token_truncate", cap=None)
    torch.testing.assert_close(w, torch.tensor([[3.0, 0.5, 0.0], [0.5, 1.0, 1.0]]))


def test_equal_log_probs_give_weight_one_in_every_mode():
    lp = torch.randn(3, 5)
    mask = torch.ones(3, 5)
    for mode in IS_MODES:
        assert torch.equal(is_weights(lp, lp.clone(), mask, mode, cap=2.0), torch.ones(3, 5)), mode


def test_weights_carry_no_gradient():
    old = torch.zeros(1, 2, requires_grad=True)
    w = is_weights(old, torch.zeros(1, 2), torch.ones(1, 2), "token_truncate")
    assert not w.requires_grad


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"mode": "token"}, "unknown importance-sampling mode 'token'"),
        ({"mode": "token_mask", "cap": 0.0}, "cap must be > 0"),
        ({"mode": "token_mask", "floor": -1.0}, "floor must be >= 0"),
        ({"mode": "token_mask", "cap": 1.0, "floor": 2.0}, "floor 2.0 is above the cap 1.0"),
    ],
)
def test_bad_settings_are_refused_by_name(kwargs, match):
    old, sampler, mask = two_rows()
    with pytest.raises(ValueError, match=match):
        is_weights(old, sampler, mask, **kwargs)


def test_mismatch_sums_by_hand():
    sampler = torch.tensor([[-1.0, -2.0, -5.0]])
    old = sampler + torch.tensor([[math.log(2.0), 0.0, 9.0]])  # 9 sits in padding
    sums = mismatch_sums(old, sampler, torch.tensor([[1, 1, 0]]))
    assert sums["tokens"] == 2
    assert sums["abs_diff"] == pytest.approx(math.log(2.0))
    assert sums["max_abs_diff"] == pytest.approx(math.log(2.0))
    assert sums["kl_k1"] == pytest.approx(-math.log(2.0))
    assert sums["kl_k3"] == pytest.approx(2 - 1 - math.log(2.0))  # 0.3069; the 0-delta token adds 0


def test_mismatch_sums_of_nothing_are_zero():
    z = torch.zeros(1, 2)
    assert mismatch_sums(z, z, torch.zeros(1, 2))["tokens"] == 0.0


def test_k3_of_tiny_gaps_is_their_half_square_not_float32_rounding():
    """A float32 engine and trainer differ by ~1e-6 nats: k3 = exp(d) - 1 - d ~ d^2 / 2 = 5e-13 there, which
    float32's exp(d) - 1 - d rounds to anything within ~1e-7 (before: sampler_kl 1.9e-8 on equal weights)."""
    sampler = torch.full((1, 4), -2.0)
    old = sampler + torch.tensor([[1e-6, -1e-6, 2e-6, 0.0]])
    sums = mismatch_sums(old, sampler, torch.ones(1, 4))
    delta = (old.double() - sampler.double())[0]  # the float32 inputs' own differences
    assert sums["kl_k3"] == pytest.approx(float((delta**2 / 2).sum()), rel=1e-3)
