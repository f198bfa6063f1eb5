"""grpokit: GRPO and its family for fine-tuning language models with verifiable rewards."""

__version__ = "0.1.0"
