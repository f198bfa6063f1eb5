"""optim.skip_flat_rows (grpokit.train.update): rows whose advantage is 0 are left out of the update's passes; the
gradient, the loss and the weights after each optimizer step are those of the update that runs every row, for
any micro-batch split, and an optimizer step whose rows are all flat (its shortest row runs, for the metrics) still
moves Adam's momentum."""

import pytest
import torch
from update_parts import fixed_rollout, grads_of_one_step, make_learner

from grpokit.config.schema import resolve_algo
from grpokit.rollout.record import TokenRecorder
from grpokit.train.update import PolicyUpdate

ADVANTAGES = torch.tensor([1.0, 0.0, -0.5, 0.0])  # rows 1 and 3 flat


def updater_of(*overrides: str) -> PolicyUpdate:
    learner, cfg = make_learner("algo.preset=grpo", "algo.beta=0", *overrides)
    return PolicyUpdate(learner, resolve_algo(cfg), cfg.optim, temperature=cfg.rollout.temperature, seed=0)


def one_update(updater: PolicyUpdate, advantages: torch.Tensor) -> tuple[dict, dict]:
    out = {}
    grads = grads_of_one_step(updater.learner, lambda: out.update(m=updater.update(fixed_rollout(), advantages)[0]))
    return grads, out["m"]


@pytest.mark.parametrize("split", [["optim.micro_batch_size=1"], ["optim.micro_batch_size=4"], ["optim.packing=true"]])
def test_the_gradient_and_loss_are_the_full_updates(split):
    skip, every = updater_of(*split), updater_of(*split, "optim.skip_flat_rows=false")
    (g_skip, m_skip), (g_every, m_every) = one_update(skip, ADVANTAGES), one_update(every, ADVANTAGES)
    assert m_skip["update/skipped_rows"] == 0.5 and "update/skipped_rows" not in m_every
    assert m_skip["loss"] == pytest.approx(m_every["loss"], rel=1e-6)
    assert set(g_skip) == set(g_every)
    for name, g in g_every.items():
        assert float(g.abs().max()) > 0, name  # a real gradient: the comparison below can fail
        assert float((g_skip[name] - g).abs().max()) <= 1e-6 * float(g.abs().max()) + 1e-9, name


def test_a_step_of_only_flat_rows_still_steps_adams_momentum():
    """Step 1 trains on an informative batch, step 2 on one whose advantages are all 0: Adam moves the weights by its
    momentum in step 2 whether every row ran (gradient 0) or only the shortest (gradient 0 too)."""
    weights = {}
    for name, extra in {"skip": [], "every": ["optim.skip_flat_rows=false"]}.items():
        updater = updater_of(*extra)
        updater.update(fixed_rollout(), ADVANTAGES)
        before = {n: p.detach().clone() for n, p in updater.learner.model.named_parameters()}
        metrics, _ = updater.update(fixed_rollout(), torch.zeros(4))
        after = dict(updater.learner.model.named_parameters())
        assert any(not torch.equal(before[n], after[n]) for n in before), name  # momentum moved them
        weights[name] = {n: p.detach().clone() for n, p in after.items()}
        if name == "skip":
            assert metrics["update/skipped_rows"] == 0.75 and metrics["pg_loss"] == 0.0  # one row of 4 ran
    for n, w in weights["every"].items():
        assert torch.allclose(weights["skip"][n], w, rtol=0, atol=1e-7), n


def test_every_row_runs_when_the_loss_acts_on_flat_rows_or_tokens_are_saved():
    for extra in (["algo.beta=0.04"], ["algo.entropy_coef=0.01"], ["optim.skip_flat_rows=false"]):
        updater = updater_of(*extra)
        if updater.uses_reference:
            updater.ref_model = None  # the test's learner has no reference: score it against itself
            updater.uses_reference = False
            updater.loss_options = updater.loss_options.replace(beta=0.04)
        assert updater.idle_rows(ADVANTAGES, None) is None, extra
    updater = updater_of()
    assert updater.idle_rows(ADVANTAGES, None).tolist() == [False, True, False, True]
    assert updater.idle_rows(ADVANTAGES, TokenRecorder.__new__(TokenRecorder)) is None  # the explorer shows all rows
    assert updater.idle_rows(torch.tensor([1.0, -1.0, 0.5, -0.5]), None) is None  # nothing flat: every row runs
