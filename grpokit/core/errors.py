"""The errors a training run stops with; each message says why and what to change."""


class ConfigError(ValueError):
    """A configuration key or value is wrong; the message says which and what to do."""


class TrainingError(RuntimeError):
    """The run cannot go on; the message says why and what to change."""


class FlatRewardsError(TrainingError):
    """No group had any reward spread for train.stop_after_flat_steps steps: nothing can be learnt."""
