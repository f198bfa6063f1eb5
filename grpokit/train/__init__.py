"""The parts of a training step: the Learner, the policy update, the Sampler, the advantages, the critic, a step's costs, data-parallel ranks, schedules."""
