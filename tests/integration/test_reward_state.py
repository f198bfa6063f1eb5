"""Where a reward function's state lives (issue 52, item 3), through the reward runner the trainer scores with: by
default a function runs in a worker forked from the trainer, so a list it appends to stays in the worker (a TRL
habit that records nothing here); marked ``in_process = True`` it runs in the trainer's process and its state is the
trainer's. As the README and the Python API guide say."""

from __future__ import annotations

from grpokit.rewards import RewardRunner

SEEN_FORKED: list[str] = []
SEEN_HERE: list[str] = []


def forked(prompts, completions, **kwargs):
    SEEN_FORKED.extend(completions)
    return [float("7" in c) for c in completions]


def here(prompts, completions, **kwargs):
    SEEN_HERE.extend(completions)
    return [float("7" in c) for c in completions]


here.in_process = True


def test_a_rewards_state_is_the_trainers_only_in_process():
    runner = RewardRunner([("forked", forked, 1.0), ("here", here, 1.0)])  # the trainer's default: forked workers
    try:
        for _ in range(2):  # two steps' batches
            result = runner(["1+6=", "2+2="], ["7", "4"], {})
            assert result.total == [2.0, 0.0]  # both scored every completion
    finally:
        runner.close()
    assert SEEN_FORKED == []  # appended in the worker, never seen here
    assert SEEN_HERE == ["7", "4", "7", "4"]  # in this process
