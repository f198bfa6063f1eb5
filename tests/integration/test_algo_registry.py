"""Advantage estimators and losses of your own: registered in Python, or named in YAML as module:function."""

import sys
import textwrap

import pytest
import torch
from grpo_runs import ROWS, has_seven
from tiny_model import make_tiny_model

from grpokit.algos import ADVANTAGES, compute_advantages, register_advantage
from grpokit.config.schema import ConfigError, load_config
from grpokit.trainers.grpo import GRPOTrainer

USER_MODULE = '''
import torch

CALLS = {"advantage": 0, "loss": 0}


def centred_per_token(inputs):
    """r - mean_g on every generated token: a token-level estimator of one's own. (N, L)"""
    CALLS["advantage"] += 1
    r = inputs.rewards.reshape(-1, inputs.group_size)  # (P, G)
    a = (r - r.mean(1, keepdim=True)).reshape(-1)  # (N,)
    return a[:, None] * inputs.completion_mask.to(a.dtype)  # (N, L)


def plain_pg(logprobs, old_logprobs, advantages, completion_mask, *, num_tokens, **settings):
    """REINFORCE without a ratio: -A * logp, token-mean over the mini-batch."""
    CALLS["loss"] += 1
    mask = completion_mask.bool()
    adv = advantages if advantages.dim() == 2 else advantages[:, None].expand_as(logprobs)
    per_token = torch.where(mask, -adv * logprobs, 0)  # (B, T)
    return per_token.sum() / num_tokens, {"user_loss_calls": torch.tensor(float(CALLS["loss"]))}
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "grpokit_user_algo.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    sys.modules.pop("grpokit_user_algo", None)


def test_user_advantage_and_loss_train_end_to_end_from_yaml(tmp_path, user_module):
    yaml_path = tmp_path / "run.yaml"
    yaml_path.write_text(
        textwrap.dedent(
            f"""
            algo:
              preset: grpo
              beta: 0.0
              advantage: grpokit_user_algo:centred_per_token
              loss: grpokit_user_algo:plain_pg
            train: {{output_dir: {tmp_path / "run"}, steps: 1, samples_every: 0}}
            rollout: {{group_size: 4, prompts_per_step: 4, max_new_tokens: 6}}
            optim: {{lr: 3.0e-3, micro_batch_size: 6}}
            data: {{template: plain}}
            model: {{device: cpu}}
            """
        )
    )
    cfg = load_config(yaml_path, [])
    model, tok = make_tiny_model("qwen2", seed=0)
    trainer = GRPOTrainer(
        cfg, model=model, tokenizer=tok, train_rows=ROWS, reward_functions=[("has_seven", has_seven, 1.0)]
    )
    before = [p.detach().clone() for p in trainer.model.parameters()]
    metrics = trainer.train_step()
    user = sys.modules["grpokit_user_algo"]
    assert user.CALLS["advantage"] == 1 and user.CALLS["loss"] >= 3  # 16 rows in micro-batches of 6
    assert metrics["user_loss_calls"] > 0  # the loss's own metric is logged
    assert metrics["reward/total/mean"] > 0 and metrics["grad_norm"] > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))


def test_a_bad_module_function_name_is_a_config_error(user_module):
    with pytest.raises(ConfigError, match="no_such_module_xyz"):
        from grpokit.config.schema import resolve_algo

        resolve_algo(load_config(None, ["algo.advantage=no_such_module_xyz:f"]))
    with pytest.raises(ConfigError, match=r"algo.loss='cliped'.*Did you mean 'clipped'"):
        load_config(None, ["algo.loss=cliped"])


def test_register_advantage_by_name():
    def doubled_group_centre(inputs):
        """2 (r - mean_g)"""
        r = inputs.rewards.reshape(-1, inputs.group_size)
        return 2 * (r - r.mean(1, keepdim=True)).reshape(-1)

    register_advantage("doubled_group_centre", doubled_group_centre)
    try:
        r = torch.tensor([1.0, 0.0, 3.0, 1.0])  # means 0.5 and 2 -> [1, -1, 2, -2]
        got = compute_advantages(r, 2, "doubled_group_centre")
        torch.testing.assert_close(got, torch.tensor([1.0, -1.0, 2.0, -2.0]), rtol=0, atol=0)
        assert (
            load_config(None, ["algo.advantage=doubled_group_centre"]).algo.advantage
            == "doubled_group_centre"
        )
        with pytest.raises(ValueError, match=r"returned \(3,\)"):
            register_advantage("wrong_shape", lambda inputs: inputs.rewards[:3])
            compute_advantages(r, 2, "wrong_shape")
    finally:
        ADVANTAGES.pop("doubled_group_centre", None)
        ADVANTAGES.pop("wrong_shape", None)


def test_a_registered_loss_gets_the_runs_settings_as_keywords_and_options(tmp_path):
    # a loss written before LossOptions declared its settings as keywords: it still gets the run's values (a
    # keyword it declares with a default is not left at that default silently), and options= beside them
    from grpokit.algos import LOSSES, policy_loss, register_loss

    seen = []

    def old_style(logprobs, old_logprobs, advantages, completion_mask, *, eps_low=0.2, beta=0.0, **kw):
        seen.append({"eps_low": eps_low, "beta": beta, "options": kw.get("options")})
        return policy_loss(logprobs, old_logprobs, advantages, completion_mask, eps_low=eps_low, beta=beta, **kw)

    register_loss("old_style", old_style)
    try:
        cfg = load_config(
            None,
            ["algo.loss=old_style", "algo.eps_low=0.3", "algo.beta=0.02", "train.steps=1", "train.samples_every=0",
             "rollout.group_size=4", "rollout.prompts_per_step=2", "rollout.max_new_tokens=4", "data.template=plain",
             "model.device=cpu", "eval.enabled=false", f"train.output_dir={tmp_path / 'run'}"],
        )  # fmt: skip
        model, tok = make_tiny_model("qwen2", seed=0)
        trainer = GRPOTrainer(
            cfg, model=model, tokenizer=tok, train_rows=ROWS, reward_functions=[("has_seven", has_seven, 1.0)]
        )
        trainer.train_step()
        assert seen and all(s["eps_low"] == 0.3 and s["beta"] == 0.02 for s in seen)
        assert seen[0]["options"].eps_low == 0.3
    finally:
        LOSSES.pop("old_style", None)
