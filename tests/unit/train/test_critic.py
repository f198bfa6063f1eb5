"""PPO with a critic through the trainer (tiny real Qwen2 policy and critic): the critic's targets and value
loss against hand numbers, explained variance, warm-up, micro-batch invariance of the critic's gradient."""

import math

import pytest
import torch
from grpo_runs import make_trainer, spies

from grpokit.algos import whiten_tokens
from grpokit.algos.advantages import gae_targets, whitened_gae
from grpokit.algos.ppo import explained_variance


def _constant_critic(trainer, c):
    """V(s) = c for every state: zero head weight, bias c."""
    with torch.no_grad():
        trainer.critic.model.score.weight.zero_()
        trainer.critic.model.score.bias.fill_(c)


def test_gae_targets_hand_numbers():
    from grpokit.algos import AdvantageInputs

    # the docstring's example: one completion of 2 tokens, score 1, V = [0.5, 0.8], gamma 1, lam 0.5:
    # delta = [0.3, 0.2], A = [0.3 + 0.5 * 0.2, 0.2] = [0.4, 0.2], R = A + V = [0.9, 1.0]
    a = AdvantageInputs(
        rewards=torch.tensor([1.0]),
        group_size=1,
        completion_mask=torch.tensor([[1, 1, 0]]),
        values=torch.tensor([[0.5, 0.8, 7.0]]),  # 7 at padding: ignored
        gamma=1.0,
        lam=0.5,
    )
    adv, ret = gae_targets(a)
    torch.testing.assert_close(adv, torch.tensor([[0.4, 0.2, 0.0]]), rtol=0, atol=1e-6)
    torch.testing.assert_close(ret, torch.tensor([[0.9, 1.0, 0.0]]), rtol=0, atol=1e-6)
    # whitened over the 2 tokens: mean 0.3, population std 0.1 -> [+1, -1]
    torch.testing.assert_close(whitened_gae(a), torch.tensor([[1.0, -1.0, 0.0]]), rtol=0, atol=1e-4)
    with pytest.raises(ValueError, match="needs a critic's values"):
        gae_targets(AdvantageInputs(rewards=torch.tensor([1.0]), group_size=1, completion_mask=a.completion_mask))


def test_explained_variance_hand_numbers():
    mask = torch.ones(1, 4)
    R = torch.tensor([[1.0, 0.0, 1.0, 0.0]])
    # Var(R) = 0.25; V = 0.5: R - V = +-0.5, Var 0.25 -> 0; V = [.9, .1, .9, .1]: Var(R - V) = 0.01 -> 0.96
    assert float(explained_variance(torch.full((1, 4), 0.5), R, mask)) == pytest.approx(0.0, abs=1e-12)
    V = torch.tensor([[0.9, 0.1, 0.9, 0.1]])
    assert float(explained_variance(V, R, mask)) == pytest.approx(0.96, abs=1e-7)  # float32 0.9, 0.1
    # masked: tokens 1-2 only, R = [1, 0], V = [.9, .1]: Var(R) = 0.25, Var(R - V) = Var([.1, -.1]) = 0.01
    assert float(explained_variance(V, R, torch.tensor([[1, 1, 0, 0]]))) == pytest.approx(0.96, abs=1e-7)
    # the first token only: Var(R) = 0 -> NaN
    assert math.isnan(float(explained_variance(V, R, torch.tensor([[1, 0, 0, 0]]))))


def test_critic_targets_and_value_loss_through_the_trainer(tmp_path):
    """Known critic V = 0.25, no KL in the reward, gamma 1, lambda 0.5: with a score s at the last of T
    tokens, delta_t = 0 before it and s - 0.25 there, so A_t = 0.5^(T-1-t) (s - 0.25), R_t = 0.25 + A_t.
    The first (only) critic step's loss is 0.5 * mean over all tokens of A_t^2 (V = V_old: no clipping)."""
    seen = {}  # what the sampler returned and the updates were given (grpo_runs.spies)
    trainer = make_trainer(
        tmp_path,
        "algo.preset=ppo",
        "algo.kl_reward_coef=0",
        "algo.lam=0.5",
        "optim.mini_batches=1",
        "train.samples_every=0",
        **spies(seen),
    )
    c = 0.25
    _constant_critic(trainer, c)
    metrics = trainer.train_step()
    batch = seen["batch"]
    mask = batch.rollout.completion_mask
    assert (seen["values"][mask.bool()] == c).all() and (seen["values"][~mask.bool()] == 0).all()
    returns, advantages, squares = [], torch.zeros(mask.shape), []
    for i, s in enumerate(batch.rewards.tolist()):
        T = int(mask[i].sum())
        for t in range(T):
            a_t = 0.5 ** (T - 1 - t) * (s - c)
            advantages[i, t] = a_t
            returns.append(c + a_t)
            squares.append(a_t**2)
    assert metrics["critic/values_mean"] == pytest.approx(c, abs=1e-7)
    assert metrics["critic/returns_mean"] == pytest.approx(sum(returns) / len(returns), rel=1e-6)
    assert metrics["critic/value_loss"] == pytest.approx(0.5 * sum(squares) / len(squares), rel=1e-5)
    assert metrics["critic/value_clipfrac"] == 0.0
    # V is constant, so R - V = A and Var(R - V) = Var(R): explained variance exactly 0
    assert metrics["critic/explained_variance"] == pytest.approx(0.0, abs=1e-9)
    # the policy got those advantages whitened over the batch's tokens
    want = whiten_tokens(advantages, mask)
    torch.testing.assert_close(seen["advantages"].cpu(), want, rtol=0, atol=1e-5)
    assert metrics["critic/lr"] == pytest.approx(1e-5)


def test_value_loss_and_explained_variance_match_a_naive_loop_with_kl(tmp_path):
    """After one update the critic's values vary by token; with PPO's KL in the reward (0.05 * k1) the
    targets, clipped value loss and explained variance equal a plain-Python recomputation."""
    seen = {}  # what the sampler returned and the critic's update was given (grpo_runs.spies)
    trainer = make_trainer(
        tmp_path, "algo.preset=ppo", "optim.mini_batches=1", "train.samples_every=0", "critic.lr=3e-2", **spies(seen)
    )
    with torch.no_grad():  # move the policy from its reference so that k1 != 0
        for p in trainer.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    trainer.train_step()
    metrics = trainer.train_step()  # seen: this second step's
    batch, V, old, ref = seen["batch"], seen["values"], seen["critic_old"], seen["critic_ref"]
    mask = batch.rollout.completion_mask
    assert V[mask.bool()].std() > 1e-4  # the critic now tells states apart
    gamma, lam, beta, clip = 1.0, 0.95, 0.05, 0.2
    R, tokens, losses = torch.zeros(mask.shape), 0, []
    for i, s in enumerate(batch.rewards.tolist()):
        T = int(mask[i].sum())
        rew = [-beta * float(old[i, t] - ref[i, t]) + (s if t == T - 1 else 0.0) for t in range(T)]
        a_next = 0.0
        for t in reversed(range(T)):
            v_next = float(V[i, t + 1]) if t + 1 < T else 0.0
            a_next = rew[t] + gamma * v_next - float(V[i, t]) + gamma * lam * a_next
            R[i, t] = a_next + float(V[i, t])
        # first critic step: V = V_old, the clipped term equals the plain one
        losses += [0.5 * (float(V[i, t]) - float(R[i, t])) ** 2 for t in range(T)]
        tokens += T
    m = mask.bool()
    assert metrics["critic/returns_mean"] == pytest.approx(float(R[m].mean()), rel=1e-5)
    assert metrics["critic/value_loss"] == pytest.approx(sum(losses) / tokens, rel=1e-4)
    var_r = float(R[m].double().var(correction=0))
    ev = 1 - float((R[m] - V[m]).double().var(correction=0)) / var_r
    assert metrics["critic/explained_variance"] == pytest.approx(ev, abs=1e-6)
    assert clip == trainer.cfg.critic.cliprange_value
    assert "kl" in metrics


def test_warmup_updates_only_the_critic(tmp_path):
    trainer = make_trainer(
        tmp_path, "algo.preset=ppo", "critic.warmup_steps=2", "train.samples_every=0", "critic.lr=1e-2"
    )
    policy0 = [p.detach().clone() for p in trainer.model.parameters()]
    critic0 = [p.detach().clone() for p in trainer.critic.model.parameters()]
    for step in (1, 2):
        metrics = trainer.train_step()
        assert metrics["critic/warmup"] == 1.0 and "loss" not in metrics and "lr" in metrics
        assert all(torch.equal(a, b) for a, b in zip(policy0, trainer.model.parameters())), step
    assert not all(torch.equal(a, b) for a, b in zip(critic0, trainer.critic.model.parameters()))
    metrics = trainer.train_step()  # step 3: the policy learns too
    assert metrics["critic/warmup"] == 0.0 and "loss" in metrics
    assert not all(torch.equal(a, b) for a, b in zip(policy0, trainer.model.parameters()))


@pytest.mark.slow
def test_micro_batch_split_leaves_the_critic_gradient_unchanged(tmp_path):
    results = {}
    for micro in (16, 3):
        trainer = make_trainer(
            tmp_path / f"micro{micro}",
            "algo.preset=ppo",
            f"optim.micro_batch_size={micro}",
            "optim.mini_batches=1",
            "rollout.max_new_tokens=10",
            "train.samples_every=0",
            eos_ids=[1, *range(30, 40)],  # frequent EOS ids: completions of many lengths
        )
        critic = trainer.critic.model
        with torch.no_grad():  # a head that is not zero, so the backbone gets a gradient too
            critic.score.weight.normal_(0.0, 0.5)
        grads = []
        trainer.critic.learner.optimizer.register_step_pre_hook(
            lambda *_, g=grads, m=critic: g.extend(p.grad.detach().clone() for p in m.parameters())
        )
        results[micro] = (grads, trainer.train_step())
    (g_one, m_one), (g_split, m_split) = results[16], results[3]
    assert m_one["completion_len/min"] < m_one["completion_len/max"]  # ragged masks
    assert len(g_one) == len(g_split) > 0
    assert any(float(g.abs().max()) > 0 for g in g_one[:-2])  # the backbone's gradient is not 0
    for a, b in zip(g_one, g_split):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)
    assert m_one["critic/value_loss"] == pytest.approx(m_split["critic/value_loss"], rel=1e-5)


@pytest.mark.slow
def test_ppo_raises_the_reward_on_a_tiny_task_and_the_critic_learns_it(tmp_path):
    """The cheap learning check (the demo's measurement is in docs/algorithms/ppo.md): 12 PPO steps on "contains a 7"."""
    trainer = make_trainer(
        tmp_path,
        "algo.preset=ppo",
        "rollout.prompts_per_step=8",
        "rollout.group_size=8",
        "optim.mini_batches=1",
        "optim.micro_batch_size=64",
        "optim.lr=1e-3",
        "critic.lr=1e-3",
        "train.samples_every=0",
        "train.stop_after_flat_steps=0",
    )
    lines = [trainer.train_step() for _ in range(12)]
    first = lines[0]["reward/total/mean"]  # sampled before any update: the random model's rate
    late = sum(m["reward/total/mean"] for m in lines[-5:]) / 5
    assert first < 0.5 and late > first + 0.3, (first, late)
    # the critic follows the returns: its values start at 0 (zero head) and rise towards the mean return
    # (measured: 0.33 against returns 0.84 at step 12)
    assert lines[0]["critic/values_mean"] == 0.0
    assert 0.15 < lines[-1]["critic/values_mean"] < lines[-1]["critic/returns_mean"] + 0.2
