"""The grpokit command line: train, sft, demo, eval, sample, pipeline, launch, config (bench and view have their own packages)."""
