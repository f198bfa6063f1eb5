"""The small GRPO runs several test modules share: 36 addition prompts, a reward a tiny model can learn
(has_seven), a 3-step config and trainer on the tiny Qwen2, and parts that record what each stage of a
step was given (``spies``)."""

from tiny_model import make_tiny_model

from grpokit.collect.sampler import Sampler
from grpokit.config.schema import load_config
from grpokit.train.critic import Critic
from grpokit.train.update import PolicyUpdate
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


def make_trainer(tmp_path, *extra, seed=0, resume=False, eos_ids=None, **parts):
    """The small run's trainer. eos_ids: more token ids that end a completion (the model's
    generation_config), e.g. [1, *range(30, 40)] for completions of many lengths. parts: GRPOTrainer's
    sampler=, updater=, critic= (e.g. ``spies``)."""
    model, tok = make_tiny_model("qwen2", seed=seed)
    if eos_ids is not None:
        model.generation_config.eos_token_id = list(eos_ids)
    return GRPOTrainer(
        make_cfg(tmp_path, *extra),
        model=model,
        tokenizer=tok,
        train_rows=ROWS,
        eval_rows=ROWS[:8],
        reward_functions=[("has_seven", has_seven, 1.0)],
        resume=resume,
        **parts,
    )


def recording_trainer(out, *extra) -> GRPOTrainer:
    """A 2-step run into ``out`` whose step 2 saves its rollouts (samples_every=2), two mini-batches, no
    evaluation: the run of the tests on what saved rollouts hold. ``extra``: more overrides (algo.loss=a spy)."""
    overrides = [
        f"train.output_dir={out}",
        "train.steps=2",
        "train.samples_every=2",
        "train.tensorboard=false",
        "rollout.group_size=4",
        "rollout.prompts_per_step=4",
        "rollout.max_new_tokens=6",
        "optim.lr=3e-2",
        "optim.mini_batches=2",
        "data.template=plain",
        "model.device=cpu",
        "algo.preset=grpo",
        "eval.enabled=false",
    ]
    model, tok = make_tiny_model("qwen2", seed=0)
    return GRPOTrainer(
        load_config(None, [*overrides, *extra]),
        model=model,
        tokenizer=tok,
        train_rows=ROWS,
        reward_functions=[("has_seven", has_seven, 1.0)],
    )


def spies(seen: dict) -> dict[str, type]:
    """GRPOTrainer's part classes (sampler=, updater=, critic=) that keep in ``seen`` what the last step's
    stages were given: "batch" (the sampled ScoredBatch), the policy update's "advantages", "old" and "ref"
    log-probs, the critic update's "values" (a copy) and its "critic_old" / "critic_ref" log-probs."""

    class SeenSampler(Sampler):
        def sample_batch(self, step, log_history=()):
            out = super().sample_batch(step, log_history)
            seen["batch"] = out[0]
            return out

    class SeenUpdate(PolicyUpdate):
        def update(self, r, advantages, old_logprobs=None, ref_logprobs=None, **kwargs):
            seen.update(advantages=advantages, old=old_logprobs, ref=ref_logprobs)
            return super().update(r, advantages, old_logprobs, ref_logprobs, **kwargs)

    class SeenCritic(Critic):
        def update(self, batch, values, old_logprobs, ref_logprobs, *, step):
            seen.update(values=values.clone(), critic_old=old_logprobs, critic_ref=ref_logprobs)
            return super().update(batch, values, old_logprobs, ref_logprobs, step=step)

    return {"sampler": SeenSampler, "updater": SeenUpdate, "critic": SeenCritic}
