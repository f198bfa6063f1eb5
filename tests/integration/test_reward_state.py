"""Where a reward function's state lives (issue 52, item 3): by default a function runs in a worker forked from the
trainer, so a list it appends to stays in the worker (a TRL habit that records nothing here); marked
``in_process = True`` it runs in the trainer's process and its state is the trainer's. As the README and the Python
API guide say."""

from __future__ import annotations

from tiny_model import ADDITION_ROWS, SMALL_RUN, make_tiny_model

from grpokit import GRPOTrainer, load_config

SEEN_FORKED: list[str] = []
SEEN_HERE: list[str] = []


def forked(prompts, completions, **kwargs):
    SEEN_FORKED.extend(completions)
    return [float("7" in c) for c in completions]


def here(prompts, completions, **kwargs):
    SEEN_HERE.extend(completions)
    return [float("7" in c) for c in completions]


here.in_process = True


def test_a_rewards_state_is_the_trainers_only_in_process(tmp_path):
    model, tok = make_tiny_model("qwen2", seed=0)
    cfg = load_config(
        None,
        [f"train.output_dir={tmp_path / 'run'}", "train.steps=1", "train.accuracy_reward=here", *SMALL_RUN],
    )
    rewards = [("forked", forked, 1.0), ("here", here, 1.0)]
    trainer = GRPOTrainer(cfg, model=model, tokenizer=tok, train_rows=ADDITION_ROWS, reward_functions=rewards)
    trainer.train()
    assert SEEN_FORKED == []  # appended in the worker, never seen here
    assert len(SEEN_HERE) == 2 * 2  # 2 prompts x 2 completions, in this process
