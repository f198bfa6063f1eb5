"""GRPO process supervision (DeepSeekMath sec. 4.1.3): hand numbers, conventions and bad input."""

import math

import pytest
import torch

from grpokit.algos import PRESETS, compute_advantages
from grpokit.algos.process import process_group_advantages

S3 = 1 / math.sqrt(3)  # 0.5774


def mask_of(lengths, width):
    return (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).float()  # (N, L)


def test_hand_numbers_steps_of_unequal_count():
    # G = 2. Completion 0: 5 tokens, steps ending at tokens 1 and 3 scored 1 and 0; completion 1: 4 tokens,
    # one step ending at token 2 scored 1. R = [1, 0, 1]: mean 2/3, std (ddof 1) sqrt((1/9 + 4/9 + 1/9) / 2)
    # = sqrt(1/3) = 0.5774, so r~ = [1/3, -2/3, 1/3] / 0.5774 = [0.5774, -1.1547, 0.5774].
    # A_0 = [0.5774 - 1.1547, same, -1.1547, -1.1547, 0 (after the last step)], A_1 = [0.5774] * 3 + [0].
    steps = [[(1, 1.0), (3, 0.0)], [(2, 1.0)]]
    mask = mask_of([5, 4], 6)
    adv = process_group_advantages(steps, 2, mask, eps=0.0)
    want = torch.tensor([[S3 - 2 * S3, S3 - 2 * S3, -2 * S3, -2 * S3, 0.0, 0.0], [S3, S3, S3, 0.0, 0.0, 0.0]])
    torch.testing.assert_close(adv, want, rtol=0, atol=1e-6)
    # the preset goes through the same estimator (eps 1e-6 moves the 4th decimal place at most)
    via_preset = compute_advantages(
        torch.zeros(2), 2, "grpo_process", completion_mask=mask, step_rewards=steps
    )
    torch.testing.assert_close(via_preset, want, rtol=0, atol=1e-5)
    # ddof 0: std sqrt(2/9) = 0.4714, r~ = [0.7071, -1.4142, 0.7071]
    pop = process_group_advantages(steps, 2, mask, std_ddof=0, eps=0.0)
    r = 1 / math.sqrt(2)
    torch.testing.assert_close(
        pop[0, :4], torch.tensor([r - 2 * r, r - 2 * r, -2 * r, -2 * r]), rtol=0, atol=1e-6
    )


def test_a_group_of_equal_step_rewards_gets_exactly_zero_and_groups_are_independent():
    # group 0: every step scores 0.7 (three steps, unequal counts) -> exactly 0, not 0/eps noise.
    # group 1: one step each, scores 2 and 0: mean 1, std sqrt(2) = 1.4142, r~ = +-0.7071 on every token up
    # to the step's end.
    steps = [[(0, 0.7), (2, 0.7)], [(1, 0.7)], [(3, 2.0)], [(1, 0.0)]]
    mask = mask_of([3, 2, 4, 3], 4)
    adv = process_group_advantages(steps, 2, mask, eps=0.0)
    assert torch.equal(adv[:2], torch.zeros(2, 4))
    r = 1 / math.sqrt(2)
    torch.testing.assert_close(adv[2:], torch.tensor([[r, r, r, r], [-r, -r, 0, 0]]), rtol=0, atol=1e-6)
    # a completion with no steps adds nothing: the group's other completion alone has one score -> 0
    alone = process_group_advantages([[], [(1, 5.0)]], 2, mask_of([2, 2], 2))
    assert torch.equal(alone, torch.zeros(2, 2))


def test_steps_ending_in_the_same_token_both_count():
    # Steps 0 and 1 of completion 0 end in token 1 (a token holding two step ends). R = [1, 1, 0, 0]:
    # mean 0.5, std (ddof 1) sqrt(4 * 0.25 / 3) = 0.5774, r~ = +-0.8660. A_0 = [1.7321, 1.7321, 0].
    steps = [[(1, 1.0), (1, 1.0)], [(0, 0.0), (2, 0.0)]]
    adv = process_group_advantages(steps, 2, mask_of([3, 3], 3), eps=0.0)
    c = 0.5 / S3
    torch.testing.assert_close(adv, torch.tensor([[2 * c, 2 * c, 0], [-2 * c, -c, -c]]), rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    "steps, match",
    [
        ([[(5, 1.0)], [(0, 0.0)]], r"completion 0, step 0: t_end=5 is not a token index .*0\.\.2"),
        ([[(2, 1.0), (1, 0.0)], [(0, 0.0)]], "completion 0, step 1: t_end=1 comes before"),
        ([[(0, float("nan"))], [(0, 0.0)]], "not a finite number"),
        ([[(0, 1.0)]], "1 entries for 2 completions"),
    ],
)
def test_step_rewards_that_do_not_fit_the_completions_are_refused(steps, match):
    with pytest.raises(ValueError, match=match):
        process_group_advantages(steps, 2, mask_of([3, 3], 3))


def test_the_process_preset_without_step_rewards_says_what_to_configure():
    assert (
        PRESETS["grpo_process"].kl.beta == 0.04
        and PRESETS["grpo_process"].advantage.estimator == "process_group"
    )
    with pytest.raises(ValueError, match="needs step rewards.*process_reward_model"):
        compute_advantages(torch.tensor([1.0, 0.0]), 2, "grpo_process", completion_mask=torch.ones(2, 3))
