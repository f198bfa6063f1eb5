"""PPO's critic on disk and in the config: checkpointed as a Hugging Face folder with its optimizer state and
resumed exactly, loaded with plain transformers, started from critic.path, LoRA'd; bad settings refused."""

import json

import pytest
import torch
from grpo_runs import make_trainer
from tiny_model import save_tiny_model
from transformers import AutoModelForTokenClassification

from grpokit.algos import compute_advantages
from grpokit.config.schema import ConfigError, load_config
from grpokit.model.checkpoint import verify_checkpoint
from grpokit.train.critic import completion_values

KEYS = [
    "loss",
    "kl",
    "grad_norm",
    "critic/value_loss",
    "critic/explained_variance",
    "critic/values_mean",
    "critic/returns_mean",
    "critic/value_clipfrac",
    "critic/grad_norm",
    "critic/lr",
    "reward/total/mean",
]
PPO = ["algo.preset=ppo", "critic.lr=1e-2", "optim.warmup_steps=1", "train.samples_every=0", "eval.enabled=false"]


def test_resume_with_the_critic_reproduces_the_uninterrupted_run(tmp_path):
    straight = make_trainer(tmp_path / "a", *PPO, "train.steps=3")
    want = [straight.train_step() for _ in range(3)][2]

    first = make_trainer(tmp_path / "b", *PPO, "train.steps=3")
    first.train_step(), first.train_step()
    checkpoint = first.save()  # step_000002 with critic/ and the critic's optimizer state
    second = make_trainer(tmp_path / "b", *PPO, "train.steps=3", resume=True)
    assert second.step == 2 and second.run.resume_from == checkpoint
    got = second.train_step()
    assert got["critic/value_loss"] > 0
    for k in KEYS:
        assert got[k] == pytest.approx(want[k], rel=1e-5, abs=1e-7), k
    for (name, a), b in zip(straight.critic.model.named_parameters(), second.critic.model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7, msg=name)
    # the critic's Adam state came back too: 3 steps x 2 mini-batches = 6 optimizer steps
    state = second.critic.learner.optimizer.state_dict()["state"]
    assert state and all(int(s["step"]) == 6 for s in state.values())


def test_the_critic_folder_loads_with_plain_transformers(tmp_path):
    trainer = make_trainer(tmp_path, *PPO, "train.steps=1")
    trainer.train_step()
    folder = trainer.save() / "critic"
    assert json.loads((folder / "config.json").read_text())["architectures"] == ["Qwen2ForTokenClassification"]
    loaded = AutoModelForTokenClassification.from_pretrained(folder)
    for (name, a), b in zip(trainer.critic.model.named_parameters(), loaded.parameters()):
        assert torch.equal(a, b), name
    # and it computes the same values as the trainer's critic on real ids
    ids = torch.tensor([[2, 11, 20, 12]])
    mask = torch.ones_like(ids)
    with torch.no_grad():
        v1 = completion_values(loaded.eval(), ids[:, :2], mask[:, :2], ids[:, 2:], mask[:, 2:])
        v2 = completion_values(trainer.critic.model.eval(), ids[:, :2], mask[:, :2], ids[:, 2:], mask[:, 2:])
    assert v1.shape == (1, 2) and torch.equal(v1, v2) and v1.abs().max() > 0


def test_critic_starts_as_the_policy_backbone_with_a_zero_head_or_from_critic_path(tmp_path):
    trainer = make_trainer(tmp_path / "a", *PPO)
    policy_backbone = dict(trainer.model.model.named_parameters())
    for name, p in trainer.critic.model.model.named_parameters():
        assert torch.equal(p, policy_backbone[name]), name
    assert trainer.critic.model.score.weight.abs().max() == 0 and trainer.critic.model.score.bias.abs().max() == 0
    assert trainer.critic.model.dropout.p == 0.0  # values at sampling and in the update must agree

    # critic.path = a causal LM folder: its backbone, a zero head
    lm = save_tiny_model(tmp_path / "lm", seed=3)
    other = make_trainer(tmp_path / "b", *PPO, f"critic.path={lm}")
    ref = AutoModelForTokenClassification.from_pretrained(lm, num_labels=1)
    for (name, p), q in zip(other.critic.model.model.named_parameters(), ref.model.parameters()):
        assert torch.equal(p, q), name
    assert other.critic.model.score.weight.abs().max() == 0
    # critic.path = a saved critic: taken as it is, head included
    with torch.no_grad():
        trainer.critic.model.score.weight.fill_(0.5)
    trainer.critic.model.save_pretrained(tmp_path / "critic")
    third = make_trainer(tmp_path / "c", *PPO, f"critic.path={tmp_path / 'critic'}")
    assert torch.equal(third.critic.model.score.weight, trainer.critic.model.score.weight)


def test_lora_gives_the_critic_its_own_adapter_and_it_resumes(tmp_path):
    lora = ["lora.enabled=true", "lora.r=4", "optim.mini_batches=1", "train.steps=1"]
    trainer = make_trainer(tmp_path, *PPO, *lora)
    trainable = [n for n, p in trainer.critic.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n or "score" in n for n in trainable)
    assert any("score" in n for n in trainable)  # the head is trained in full
    trainer.train_step()
    folder = trainer.save() / "critic"
    assert (folder / "adapter_model.safetensors").is_file()
    resumed = make_trainer(tmp_path, *PPO, *lora[:-1], "train.steps=2", resume=True)
    for (name, a), b in zip(trainer.critic.model.named_parameters(), resumed.critic.model.parameters()):
        assert torch.equal(a, b), name


def test_bad_critic_settings_are_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"critic.lr=0.001.*trains no critic.*algo.preset=ppo"):
        load_config(None, ["algo.preset=grpo", "critic.lr=1e-3"])
    with pytest.raises(ConfigError, match=r"critic.warmup_steps=2.*algo.preset=dapo"):
        load_config(None, ["algo.preset=dapo", "critic.warmup_steps=2"])
    load_config(None, ["algo.preset=grpo", "algo.advantage=gae", "critic.lr=1e-3"])  # gae brings a critic
    with pytest.raises(ConfigError, match=r"critic.lr=0.0 is out of range"):
        load_config(None, ["algo.preset=ppo", "critic.lr=0"])
    with pytest.raises(ConfigError, match=r"critic.cliprange_value=-0.1 is out of range"):
        load_config(None, ["algo.preset=ppo", "critic.cliprange_value=-0.1"])
    with pytest.raises(ConfigError, match=r"algo.lam=1.5 is out of range"):
        load_config(None, ["algo.preset=ppo", "algo.lam=1.5"])
    with pytest.raises(ConfigError, match=r"unknown config key 'critic.learning_rate'"):
        load_config(None, ["critic.learning_rate=1e-3"])
    with pytest.raises(ConfigError, match=r"critic.path='/no/such/dir': no such folder"):
        make_trainer(tmp_path, "algo.preset=ppo", "critic.path=/no/such/dir")
    # the estimator itself, called without a critic's values
    with pytest.raises(ValueError, match="'gae' needs a critic's values"):
        compute_advantages(torch.tensor([1.0, 0.0]), 2, "ppo", completion_mask=torch.ones(2, 3))


def test_a_damaged_critic_makes_resume_skip_that_checkpoint(tmp_path, capsys):
    trainer = make_trainer(tmp_path, *PPO, "train.steps=3", "optim.mini_batches=1")
    trainer.train_step()
    first = trainer.save()
    trainer.train_step()
    second = trainer.save()
    critic_file = second / "critic" / "model.safetensors"
    critic_file.write_bytes(critic_file.read_bytes()[:-100])  # truncated
    assert verify_checkpoint(first) is None
    assert verify_checkpoint(second).startswith("critic/model.safetensors: ")
    resumed = make_trainer(tmp_path, *PPO, "train.steps=3", "optim.mini_batches=1", resume=True)
    assert resumed.step == 1 and resumed.run.resume_from == first
    assert "step_000002 is damaged (critic/model.safetensors" in capsys.readouterr().err
