"""The small GRPO runs several test modules share: 36 addition prompts, a reward a tiny model can learn
(has_seven), and a 3-step config and trainer on the tiny Qwen2."""

from tiny_model import make_tiny_model

from grpokit.config.schema import load_config
from grpokit.trainers.grpo import GRPOTrainer

ROWS = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(6) for b in range(6)]


def has_seven(prompts, completions, **kw):
    """1 when the completion contains the character 7: a task a random tiny model can learn."""
    return [float("7" in c) for c in completions]


def make_cfg(tmp_path, *extra):
    return load_config(
        None,
        [
            f"train.output_dir={tmp_path / 'run'}",
            "train.steps=3",
            "train.samples_every=1",
            "rollout.group_size=4",
            "rollout.prompts_per_step=4",
            "rollout.max_new_tokens=6",
            "optim.lr=3e-3",
            "optim.micro_batch_size=6",
            "optim.mini_batches=2",
            "data.template=plain",
            "model.device=cpu",
            "algo.preset=grpo",
            "eval.num_samples=2",
            *extra,
        ],
    )


def make_trainer(tmp_path, *extra, seed=0, resume=False):
    model, tok = make_tiny_model("qwen2", seed=seed)
    return GRPOTrainer(
        make_cfg(tmp_path, *extra),
        model=model,
        tokenizer=tok,
        train_rows=ROWS,
        eval_rows=ROWS[:8],
        reward_functions=[("has_seven", has_seven, 1.0)],
        resume=resume,
    )
