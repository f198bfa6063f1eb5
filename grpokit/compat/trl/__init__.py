"""TRL's habits: the reward-function and trainer argument forms of a TRL script, and TRL's metric names."""
