"""Sampling completions: the generators and decode engines, multi-turn episodes with tools and environments, scored batches, evaluation, and the record of a sampled step."""
