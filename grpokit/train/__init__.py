"""The parts of a training step: the Learner, the policy update, the Sampler, the critic, data-parallel ranks, schedules."""
