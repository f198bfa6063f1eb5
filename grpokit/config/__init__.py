"""The config trees of a run (GRPO, SFT) and their checks, read from YAML and key=value overrides, or from TRL's GRPOConfig."""
