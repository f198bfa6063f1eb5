"""grpokit.algos.gradient_free_rows: which rows' loss terms are exactly 0 (the update leaves them out,
optim.skip_flat_rows), and that every built-in surrogate really gives such a row no gradient."""

import pytest
import torch

from grpokit.algos import LossOptions, gradient_free_rows, policy_loss
from grpokit.algos.objectives import BUILT_IN, SURROGATES, register_surrogate


def test_rows_whose_advantages_are_all_zero():
    assert gradient_free_rows(torch.tensor([0.0, 1.0, 0.0, -0.5]), LossOptions()).tolist() == [
        True, False, True, False,
    ]  # fmt: skip
    per_token = torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.3, 0.0], [0.0, 0.0, 0.0]])  # (B, T): a dense advantage
    assert gradient_free_rows(per_token, LossOptions()).tolist() == [True, False, True]


@pytest.mark.parametrize(
    "options",
    [
        LossOptions(beta=0.04),  # the KL term acts on every token
        LossOptions(entropy_coef=0.01),  # the entropy bonus too
        LossOptions(cov_penalty="kl_cov"),  # KL-Cov's |logp - old| term
    ],
)
def test_none_when_a_term_acts_without_the_advantage(options):
    assert gradient_free_rows(torch.zeros(3), options) is None


def test_none_for_a_surrogate_registered_later():
    def half_ratio(x, _):  # not a multiple of A: a zero-advantage row still has a gradient
        return -0.5 * x.ratio, {}

    register_surrogate("test_half_ratio", half_ratio)
    try:
        assert "test_half_ratio" not in BUILT_IN
        assert gradient_free_rows(torch.zeros(2), LossOptions(surrogate="test_half_ratio")) is None
    finally:
        SURROGATES.pop("test_half_ratio")


@pytest.mark.parametrize(
    ("name", "ratio_level"), [(name, "token") for name in sorted(BUILT_IN)] + [("clip", "sequence")]  # GSPO's
)
def test_every_built_in_surrogate_gives_a_zero_advantage_row_no_gradient(name, ratio_level):
    """Rows 1 and 3 have advantage 0 and ratios far from 1 (some clipped): their log-probs get a gradient of exactly
    0, and the loss of the other rows alone (the normalisers of all four) equals the whole batch's."""
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(4, 5, generator=g) * 3  # (4, 5)
    logp = (old + torch.randn(4, 5, generator=g) * 0.5).requires_grad_()
    adv = torch.tensor([1.3, 0.0, -0.7, 0.0])
    mask = torch.ones(4, 5)
    mask[2, 3:] = 0
    opts = LossOptions(surrogate=name, ratio_level=ratio_level)
    loss, _ = policy_loss(logp, old, adv, mask, options=opts, num_sequences=4, num_tokens=mask.sum())
    (grad,) = torch.autograd.grad(loss, logp)
    assert gradient_free_rows(adv, opts).tolist() == [False, True, False, True]
    assert torch.equal(grad[[1, 3]], torch.zeros(2, 5))
    assert grad[[0, 2]].abs().sum() > 0  # the test can fail: the other rows do get a gradient
    rest = [0, 2]
    part, _ = policy_loss(
        logp[rest], old[rest], adv[rest], mask[rest], options=opts, num_sequences=4, num_tokens=mask.sum()
    )
    assert float(part.detach()) == pytest.approx(float(loss.detach()), rel=1e-6, abs=1e-7)
