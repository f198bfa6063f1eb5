"""How a step gets its batch, kept apart from the update that trains on it: the trainer asks a ``BatchSource`` for
the next batch and says when the policy trained; it never learns how the batch was made.

    source.py         BatchSource (the interface), Collected (a batch as handed over), SyncSource (this process)
    asynchronous.py   AsyncSource: batches from a sampler process beside the update (rollout.max_staleness >= 1)
    factory.py        plan_source / make_source: which source a run gets (the one reader of rollout.max_staleness)
    sampler.py        Sampler: P prompts -> G completions each (the run's engine) -> rewards -> ScoredBatch
    async_sampler.py  AsyncSampler: the Sampler in a process, its queue, heartbeat and weight pushes
    async_ranks.py    torchrun: one sampler process per rank, and what the ranks agree on
    reference.py      where the reference's log-probs of a batch are made (the trainer, or the sampler process)
"""
