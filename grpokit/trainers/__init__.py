"""The trainers: GRPO (and its family), SFT, and rejection sampling (grpokit sample)."""
