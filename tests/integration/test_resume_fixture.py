"""A checkpoint written by an older grpokit still resumes: tests/fixtures/checkpoint_v1/step_000002 was saved
by main before the trainer was split into parts (issue 23) by a 2-step PPO run (tiny Qwen2 policy and critic,
float32, CPU; tests/fixtures/make_checkpoint_v1.py). Resuming it must restore exactly what it holds (both
models' weights, both optimizers, the schedulers, the prompt stream, the step) and train on; and the same
settings run from scratch by today's code must reach the very weights it holds (no number changed)."""

import shutil

import torch
from paths import FIXTURES
from safetensors.torch import load_file
from tiny_model import make_tiny_model

from grpokit.config.schema import load_config
from grpokit.trainers.grpo import GRPOTrainer

FIXTURE = FIXTURES / "checkpoint_v1" / "step_000002"
ROWS = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(5) for b in range(5)]
SETTINGS = [
    "algo.preset=ppo",
    "train.steps=2",
    "train.save_every=2",
    "train.samples_every=0",
    "train.tensorboard=false",
    "rollout.group_size=4",
    "rollout.prompts_per_step=2",
    "rollout.max_new_tokens=4",
    "optim.lr=3e-3",
    "optim.mini_batches=2",
    "data.template=plain",
    "model.device=cpu",
    "eval.enabled=false",
]


def has_seven(prompts, completions, **kw):
    """1 when the completion contains a 7: rewards that differ within a group for a random tiny model."""
    return [float("7" in c) for c in completions]


def make_trainer(out, *extra, **kwargs):
    model, tok = make_tiny_model("qwen2", seed=0)
    cfg = load_config(None, [*SETTINGS, f"train.output_dir={out}", *extra])
    reward = [("has_seven", has_seven, 1.0)]
    return GRPOTrainer(cfg, model=model, tokenizer=tok, train_rows=ROWS, reward_functions=reward, **kwargs)


def _assert_weights(model: torch.nn.Module, saved: dict[str, torch.Tensor], atol: float = 0.0) -> None:
    params = dict(model.named_parameters())
    assert saved.keys() <= params.keys() and len(saved) > 10
    for name, value in saved.items():
        torch.testing.assert_close(params[name].detach(), value, rtol=0, atol=atol, msg=name)


def test_checkpoint_of_the_old_trainer_resumes_exactly_and_trains_on(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run / "checkpoints" / FIXTURE.name)
    trainer = make_trainer(run, "train.steps=3", resume=True)
    assert trainer.run.resume_from.name == "step_000002" and trainer.step == 2
    _assert_weights(trainer.model, load_file(FIXTURE / "model.safetensors"))
    _assert_weights(trainer.critic.model, load_file(FIXTURE / "critic" / "model.safetensors"))
    state = torch.load(FIXTURE / "trainer_state.pt", weights_only=False)
    optimizers = (
        (trainer.learner.optimizer, state["optimizer"]),
        (trainer.critic.learner.optimizer, state["critic"]["optimizer"]),
    )
    for optimizer, saved in optimizers:
        loaded = optimizer.state_dict()["state"]
        assert loaded.keys() == saved["state"].keys() and len(loaded) > 10
        for k, moments in saved["state"].items():
            for name, value in moments.items():
                torch.testing.assert_close(loaded[k][name], value, rtol=0, atol=0)
    assert trainer.sampler.stream.state() == state["stream"]
    summary = trainer.train()
    assert summary["steps"] == 3 and (run / "checkpoints" / "step_000003").is_dir()


def test_todays_code_reaches_the_weights_the_old_code_saved(tmp_path):
    """Fails when a change alters the numbers of a PPO step (sampling, advantages, either update): if that
    was meant, say so in the commit; the fixture itself stays as the old code wrote it.

    Tolerance 3e-5: the same code on another CPU (AVX-512 against AVX2 matmul kernels, seen 2026-11-25)
    lands up to 9e-6 away; the smallest real change tried, optim.max_grad_norm 1.0 -> 0.9, moves a weight
    by 9e-5, and algo.lam 0.95 -> 0.9 by 2e-2."""
    make_trainer(tmp_path / "run").train()
    fresh = tmp_path / "run" / "checkpoints" / "step_000002"
    for name in ("model.safetensors", "critic/model.safetensors"):
        now, then = load_file(fresh / name), load_file(FIXTURE / name)
        assert now.keys() == then.keys()
        for key, value in then.items():
            torch.testing.assert_close(now[key], value, rtol=0, atol=3e-5, msg=f"{name}: {key}")


GRPO_FIXTURE = FIXTURES / "checkpoint_v2" / "step_000002"
GRPO = ["algo.preset=grpo", "algo.entropy_coef=0.01", "algo.adaptive_entropy=true"]  # make_checkpoint_v2.py's


def test_a_grpo_checkpoint_of_37165e5_resumes_to_the_weights_of_todays_uninterrupted_run(tmp_path):
    """tests/fixtures/checkpoint_v2 was written by 37165e5, before the sampling side moved to grpokit/collect and the
    trainer was built from its parts (issue 54) and before every part's state went through one path (issue 48): it
    resumes, with the adaptive entropy coefficient it saved, and its third step lands on the weights today's code
    reaches in three steps straight (the same machine: both are today's numbers from the same saved state)."""
    run = tmp_path / "run"
    shutil.copytree(GRPO_FIXTURE, run / "checkpoints" / GRPO_FIXTURE.name)
    resumed = make_trainer(run, *GRPO, "train.steps=3", resume=True)
    assert resumed.step == 2
    saved = torch.load(GRPO_FIXTURE / "trainer_state.pt", weights_only=False)
    assert resumed.updater.entropy_state() == saved["entropy_control"]
    _assert_weights(resumed.model, load_file(GRPO_FIXTURE / "model.safetensors"))
    resumed.train()
    straight = make_trainer(tmp_path / "straight", *GRPO, "train.steps=3")
    straight.train()
    for (name, p), q in zip(straight.model.named_parameters(), resumed.model.parameters()):
        torch.testing.assert_close(q, p, rtol=0, atol=3e-5, msg=name)  # the tolerance above: other CPUs' kernels
