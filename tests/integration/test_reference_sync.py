"""The reference that moves toward the policy (algo.ref_sync_every, algo.ref_sync_alpha; TRL's sync_ref_model):
the mix by hand and against TRL's own SyncRefModelCallback, the reference a run keeps and checkpoints (a mix of the
policies it passed through, by the formula), the KL it measures against it, the refusals, and TRL's fields.
(A resume keeps the moved reference: tests/integration/test_resume_matrix.py, cases ref_sync and ref_sync_async.)"""

from __future__ import annotations

import copy

import pytest
import torch
from grpo_runs import ROWS, has_seven
from tiny_model import make_tiny_model

from grpokit.config.schema import load_config
from grpokit.config.trl import from_trl
from grpokit.core.errors import ConfigError
from grpokit.model.checkpoint import load_weights_into
from grpokit.run.log import read_metrics
from grpokit.train.reference import REFERENCE_DIR, mix_toward
from grpokit.trainers.grpo import GRPOTrainer

RUN = [
    "train.samples_every=0", "train.tensorboard=false", "rollout.group_size=4", "rollout.prompts_per_step=2",
    "rollout.max_new_tokens=5", "optim.lr=3e-2", "data.template=plain", "model.device=cpu", "eval.enabled=false",
    "algo.beta=0.04",
]  # fmt: skip


def trainer(out, *extra):
    model, tok = make_tiny_model("qwen2", seed=0)
    cfg = load_config(None, [*RUN, f"train.output_dir={out}", *extra])
    return GRPOTrainer(cfg, model=model, tokenizer=tok, train_rows=ROWS, reward_functions=[("has_seven", has_seven, 1.0)])


def weights(model) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def test_the_mix_by_hand_and_its_refusals():
    """0.25 * 3 + 0.75 * 1 = 1.5 in every entry; alpha 1 makes the reference the policy; a model that is no copy of
    the policy, or an alpha outside (0, 1], is refused."""
    reference, policy = torch.nn.Linear(2, 3), torch.nn.Linear(2, 3)
    with torch.no_grad():
        for p in reference.parameters():
            p.fill_(1.0)
        for p in policy.parameters():
            p.fill_(3.0)
    mix_toward(reference, policy, 0.25)
    assert all(torch.equal(p, torch.full_like(p, 1.5)) for p in reference.parameters())
    mix_toward(reference, policy, 1.0)
    assert all(torch.equal(p, torch.full_like(p, 3.0)) for p in reference.parameters())
    assert all(torch.equal(p, torch.full_like(p, 3.0)) for p in policy.parameters())  # the policy is not touched
    with pytest.raises(ValueError, match="shape"):
        mix_toward(torch.nn.Linear(2, 4), policy, 0.5)
    with pytest.raises(ValueError, match="not a copy"):
        mix_toward(torch.nn.Linear(2, 3, bias=False), policy, 0.5)
    with pytest.raises(ValueError, match="alpha"):
        mix_toward(reference, policy, 0.0)


def test_a_runs_reference_is_the_mix_of_the_policies_it_passed_and_trls_callback_makes_the_same(tmp_path):
    """ref_sync_every=2, alpha=0.5 over 4 steps: the reference is 0.5 theta_4 + 0.5 (0.5 theta_2 + 0.5 theta_0), in
    the trainer and in step 4's checkpoint (reference/), and TRL's SyncRefModelCallback applied to theta_0 at the same
    steps gives it bit for bit; the policy moved, so a frozen reference would fail the comparison."""
    trl_callbacks = pytest.importorskip("trl.trainer.callbacks")
    run = trainer(tmp_path / "run", "train.steps=4", "train.save_every=2", "train.keep_checkpoints=2",
                  "algo.ref_sync_every=2", "algo.ref_sync_alpha=0.5")  # fmt: skip
    initial = weights(run.model)
    run.train()
    policy_at_2 = make_tiny_model("qwen2", seed=0)[0]
    load_weights_into(policy_at_2, tmp_path / "run" / "checkpoints" / "step_000002")
    final = weights(run.model)
    theirs = make_tiny_model("qwen2", seed=0)[0]  # theta_0, moved as TRL's callback moves its ref_model
    trl_callbacks.SyncRefModelCallback._sync_target_model(policy_at_2, theirs, 0.5)
    trl_callbacks.SyncRefModelCallback._sync_target_model(run.model, theirs, 0.5)
    saved = make_tiny_model("qwen2", seed=0)[0]
    load_weights_into(saved, tmp_path / "run" / "checkpoints" / "step_000004" / REFERENCE_DIR)
    at_2 = dict(policy_at_2.named_parameters())
    for name, p in run.ref_model.named_parameters():
        want = 0.5 * final[name] + 0.5 * (0.5 * at_2[name].detach() + 0.5 * initial[name])
        torch.testing.assert_close(p, want, rtol=0, atol=1e-6)
        assert torch.equal(p, dict(theirs.named_parameters())[name]), name
        assert torch.equal(p, dict(saved.named_parameters())[name]), name
    moved = max(float((final[n] - initial[n]).abs().max()) for n in final)
    assert moved > 1e-2  # the policy moved: the reference's mix is not the initial weights by accident
    assert (tmp_path / "run" / "checkpoints" / "step_000002" / REFERENCE_DIR / "model.safetensors").is_file()


def test_with_alpha_1_after_every_step_the_kl_is_to_the_policy_that_sampled(tmp_path):
    """alpha = 1 after every step: the reference is the policy that samples the next step, so that step's KL (the
    update's one pass, before it moves) is 0; a frozen reference's KL grows instead."""
    synced = trainer(tmp_path / "synced", "train.steps=4", "algo.ref_sync_every=1", "algo.ref_sync_alpha=1.0")
    initial = weights(synced.model)
    synced.train()
    frozen = trainer(tmp_path / "frozen", "train.steps=4")
    frozen.train()
    kl_synced = [m["kl"] for m in read_metrics(tmp_path / "synced" / "metrics.jsonl")]
    kl_frozen = [m["kl"] for m in read_metrics(tmp_path / "frozen" / "metrics.jsonl")]
    assert kl_synced[0] == kl_frozen[0] == 0.0  # step 1: both references are the initial policy
    assert max(kl_synced) < 1e-7 and max(kl_frozen) > 1e-3, (kl_synced, kl_frozen)
    assert max(float((p - initial[n]).abs().max()) for n, p in synced.model.named_parameters()) > 1e-2


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["lora.enabled=true"], "with LoRA the reference is the base model"),
        (["algo.beta=0"], "no reference to move"),
        (["algo.ref_sync_every=0", "algo.ref_sync_alpha=0.5"], "only a reference sync reads it"),
        (["algo.ref_sync_alpha=0"], "ref_sync_alpha"),
    ],
)
def test_what_cannot_take_effect_is_refused_by_name(extra, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [*RUN, "algo.ref_sync_every=4", *extra])


def test_trls_sync_ref_model_maps_in_grpokit_steps_and_is_refused_where_trl_refuses_it():
    """ref_model_sync_steps counts TRL's optimizer steps: 8 of them with k = 2 per grpokit step are 4 steps;
    beta 0 is refused as TRL refuses it; ref_model_* without sync_ref_model are said to do nothing."""
    values, notes = from_trl({"sync_ref_model": True, "beta": 0.04, "ref_model_sync_steps": 8,
                              "ref_model_mixup_alpha": 0.9, "num_iterations": 2})  # fmt: skip
    assert (values["algo"]["ref_sync_every"], values["algo"]["ref_sync_alpha"]) == (4, 0.9)
    assert any("sync_ref_model: algo.ref_sync_every=4" in n for n in notes)
    defaults, _ = from_trl({"sync_ref_model": True, "beta": 0.04})
    assert (defaults["algo"]["ref_sync_every"], defaults["algo"]["ref_sync_alpha"]) == (512, 0.6)  # TRL's defaults
    with pytest.raises(ConfigError, match="beta=0.0: there is no reference model"):
        from_trl({"sync_ref_model": True})
    with pytest.raises(ConfigError, match="ref_model_sync_steps=3 .* use a multiple of 2"):
        from_trl({"sync_ref_model": True, "beta": 0.04, "ref_model_sync_steps": 3, "num_iterations": 2})
    off, notes = from_trl({"ref_model_sync_steps": 8})
    assert "ref_sync_every" not in off["algo"] and any("no effect without sync_ref_model" in n for n in notes)


def test_trls_defaults_table_holds_trls_reference_sync_defaults():
    trl = pytest.importorskip("trl")
    from grpokit.config.trl import TRL_DEFAULTS

    fields = {f.name: f.default for f in __import__("dataclasses").fields(trl.GRPOConfig)}
    for key in ("sync_ref_model", "ref_model_mixup_alpha", "ref_model_sync_steps"):
        assert TRL_DEFAULTS[key] == fields[key], key


def test_an_asynchronous_runs_sampler_process_leaves_a_moving_reference_to_the_trainer():
    """The sampler process computes a frozen reference's log-probs itself; a moving one stays the trainer's (it
    changes in place, and a batch sampled before a move is trained after it)."""
    from grpokit.collect.reference import sampler_reference
    from grpokit.config.schema import resolve_algo
    from grpokit.train.distributed import Distributed

    for every, expected_none in ((0, False), (4, True)):
        cfg = load_config(None, [*RUN, "rollout.max_staleness=1", f"algo.ref_sync_every={every}"])
        algo = resolve_algo(cfg)
        model = copy.deepcopy(make_tiny_model("qwen2", seed=0)[0])
        made = sampler_reference(cfg, algo, Distributed(), torch.device("cpu"), model, None, asynchronous=True)
        assert (made is None) == expected_none, every
