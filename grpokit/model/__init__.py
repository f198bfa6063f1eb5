"""The model: loading and its checks, per-token log-probs, precision modes, checkpoints."""
