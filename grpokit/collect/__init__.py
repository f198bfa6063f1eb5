"""How a step gets its batch, kept apart from the update that trains on it.

    sampler.py        Sampler: P prompts -> G completions each (the run's engine) -> rewards -> ScoredBatch
    async_sampler.py  AsyncSampler: the Sampler in a process beside the update (rollout.max_staleness >= 1)
    async_ranks.py    torchrun: one sampler process per rank, and what the ranks agree on
    reference.py      where the reference's log-probs of a batch are made (the trainer, or the sampler process)
"""
