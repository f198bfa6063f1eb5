"""On-policy distillation's dense advantage (grpokit.algos.distill) by hand, alone and added to a group estimator's."""

import pytest
import torch

from grpokit.algos import AlgoSettings, compute_advantages
from grpokit.algos.distill import teacher_advantages, teacher_kl

STUDENT = torch.tensor([[-0.1, -2.0, -0.5], [-1.0, -1.0, 9.0]])  # (2, 3); 9.0 at a padding position
TEACHER = torch.tensor([[-0.3, -0.2, -0.5], [-0.5, -3.0, float("inf")]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])


def test_the_dense_advantage_by_hand():
    # w (log pi_T - log pi_s): row 0 [-0.2, +1.8, 0] (the docstring's), row 1 [+0.5, -2.0] and 0 at padding
    got = teacher_advantages(STUDENT, TEACHER, MASK, coef=1.0)
    torch.testing.assert_close(got, torch.tensor([[-0.2, 1.8, 0.0], [0.5, -2.0, 0.0]]), rtol=0, atol=1e-6)
    torch.testing.assert_close(teacher_advantages(STUDENT, TEACHER, MASK, coef=0.5), got / 2, rtol=0, atol=0)
    # the reverse KL's k1 over the 5 tokens: (0.2 - 1.8 + 0 - 0.5 + 2.0) / 5 = -0.02
    assert teacher_kl(STUDENT, TEACHER, MASK).item() == pytest.approx(-0.02, abs=1e-7)
    with pytest.raises(ValueError, match=r"must have one shape"):
        teacher_advantages(STUDENT, TEACHER[:, :2], MASK)


def test_alone_and_added_to_the_group_advantage():
    kw = {"completion_mask": MASK, "old_logprobs": STUDENT, "teacher_logprobs": TEACHER}
    rewards = torch.tensor([1.0, 0.0])
    # alone (algo.advantage=none): exactly the teacher's term
    alone = compute_advantages(rewards, 2, AlgoSettings.of(advantage="none", teacher_kl_coef=1.0), **kw)
    torch.testing.assert_close(alone, teacher_advantages(STUDENT, TEACHER, MASK), rtol=0, atol=0)
    # beside group_centre's [0.5, -0.5], weight 2: the group's advantage on every token plus 2x the teacher's
    both = compute_advantages(
        rewards, 2, AlgoSettings.of(advantage="group_centre", teacher_kl_coef=2.0), **kw
    )
    want = torch.tensor([[0.5 - 0.4, 0.5 + 3.6, 0.5], [-0.5 + 1.0, -0.5 - 4.0, 0.0]])
    torch.testing.assert_close(both * MASK, want, rtol=0, atol=1e-6)
    # a row no reward scored keeps the teacher's term (the teacher needs no reward); its group part is 0
    scored = compute_advantages(
        rewards, 2, AlgoSettings.of(advantage="group_centre", teacher_kl_coef=1.0), scored=torch.tensor([True, False]),
        **kw,
    )  # fmt: skip
    torch.testing.assert_close(scored[1, :2], torch.tensor([0.5, -2.0]), rtol=0, atol=1e-6)
    # without a teacher nothing changes: (N,) as before
    assert compute_advantages(rewards, 2, AlgoSettings.of(advantage="group_centre"), **kw).shape == (2,)
    with pytest.raises(ValueError, match=r"algo.teacher_kl_coef=1 needs teacher_logprobs"):
        compute_advantages(
            rewards, 2, AlgoSettings.of(advantage="none", teacher_kl_coef=1.0), completion_mask=MASK
        )


def test_advantage_none_without_a_teacher_is_refused():
    lines = AlgoSettings.of(advantage="none").ineffective({"advantage"})
    assert lines and "set algo.teacher_kl_coef > 0" in lines[0]
    assert (
        AlgoSettings.of(advantage="none", teacher_kl_coef=0.5).ineffective({"advantage", "teacher_kl_coef"})
        == []
    )
