"""The config trees of the commands (grpokit train, sft, sample), every setting declared once (declare) and
checked from its declaration (checks), read from YAML and key=value overrides, or from TRL's GRPOConfig;
the settings reference generated from the same declarations (reference)."""
