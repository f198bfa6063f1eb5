"""TRL's GRPOConfig in grpokit's terms (filled in below)."""

SCALE_REWARDS = {"group": "group_std", "batch": "group_centre_reward_std", "none": "group_centre"}
"""TRL's scale_rewards -> algo.advantage (batch: std of the batch's rewards, not of the centred ones)."""
