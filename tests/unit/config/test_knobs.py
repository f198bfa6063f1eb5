"""From the maths review (issue 23): a knob that cannot take effect is refused when the config is checked
(not ignored, not refused at the first step), and under algo.mask_truncated the per-token whitening takes
its statistics over the tokens the loss trains on."""

import pytest
import torch

from grpokit.algos import compute_advantages
from grpokit.config.schema import ConfigError, load_config


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["algo.gamma=0.9"], r"algo.gamma=0.9: only a critic-based estimator .* group_std ignores it"),
        (["algo.preset=rloo", "algo.lam=0.5"], r"algo.lam=0.5: .* leave_one_out ignores it"),
        (
            ["algo.preset=grpo_process", "algo.kl_reward_coef=0.1"],
            r"process_group .* takes no KL in the reward",
        ),
        (["algo.norm_len=100"], r"algo.norm_len=100: only algo.agg=seq-sum-norm divides by it"),
        (["algo.overlong_buffer=10"], r"algo.overlong_buffer=10: .* overlong shaping, which is off"),
    ],
)
def test_a_knob_that_cannot_take_effect_is_refused_at_config_check(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


@pytest.mark.parametrize(
    "overrides",
    [
        ["algo.preset=ppo", "algo.lam=0.5", "algo.gamma=0.99", "algo.std_eps=0.0001"],
        ["algo.preset=dapo", "algo.overlong_buffer=10"],
        ["algo.agg=seq-sum-norm", "algo.norm_len=100"],
        ["algo.preset=grpo", "algo.std_ddof=0"],
        ["algo.advantage=token_whiten", "algo.std_eps=0.0001"],
        ["algo.preset=dr_grpo", "algo.std_ddof=1", "algo.std_eps=0.0001"],  # TRL configs write them out
        ["algo.advantage=my_module:my_estimator", "algo.gamma=0.5"],  # your own may read anything
    ],
)
def test_knobs_that_take_effect_pass(overrides):
    load_config(None, overrides)


def test_token_whitening_under_mask_truncated_uses_the_trained_tokens():
    """REINFORCE++ (token_whiten), no KL, 4 rows of 2 tokens, rewards [1, 0, 0, 1], the last row truncated
    (not trained). Returns-to-go = the reward on each token. Over the 6 trained tokens [1,1,0,0,0,0]: mean
    1/3, population std sqrt(2/9) = 0.4714, so A = +1.4142 (row 0), -0.7071 (rows 1, 2), 0 (row 3, untrained).
    Over all 8 tokens it would be mean 0.5, std 0.5: A = +-1, and the trained tokens' mean would be -1/3."""
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    mask = torch.ones(4, 2)
    trained = mask.clone()
    trained[3] = 0
    a = compute_advantages(rewards, 2, "token_whiten", completion_mask=mask, trained_mask=trained)
    want = torch.tensor([[1.4142, 1.4142], [-0.7071, -0.7071], [-0.7071, -0.7071], [0.0, 0.0]])
    torch.testing.assert_close(a, want, rtol=0, atol=1e-4)
    assert abs(float(a[trained.bool()].mean())) < 1e-6  # whitened where the loss looks
    everything = compute_advantages(rewards, 2, "token_whiten", completion_mask=mask)
    torch.testing.assert_close(
        everything, torch.tensor([[1.0, 1.0], [-1.0, -1.0], [-1.0, -1.0], [1.0, 1.0]]), rtol=0, atol=1e-4
    )
