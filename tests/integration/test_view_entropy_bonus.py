"""The run explorer's loss is the one the trainer minimised, entropy bonus included (the last session's known
defect: the page's total and each group's loss left -alpha * H-bar out). A tiny GRPO run with the bonus saves its
rollouts; the loss `grpokit view` recomputes from the saved tokens must be metrics.jsonl's, and the entropy the
bonus acted on its logged entropy/bonus. One mini-batch a step: the bonus is a token mean per mini-batch."""

import json

import pyarrow.parquet as pq
import pytest
from grpo_runs import recording_trainer

from grpokit.rollout.record import read_rollouts, rollout_files
from grpokit.view.data import step_view

CASES = {
    "constant": ["algo.entropy_coef=0.05"],
    # the coefficient moves each optimizer step (+0.01: the entropy is below the target 100); the high-entropy
    # token mask chooses the tokens the bonus acts on; token-mean aggregation
    "adaptive+entropy_mask": [
        "algo.adaptive_entropy=true",
        "algo.entropy_coef=0.02",
        "algo.entropy_target=100",
        "algo.entropy_coef_delta=0.01",
        "algo.top_entropy_quantile=0.5",
        "algo.agg=token-mean",
    ],
}


@pytest.fixture(scope="module", params=list(CASES))
def run(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp("bonus") / "run"
    recording_trainer(folder, *CASES[request.param], "optim.mini_batches=1").train()
    logged = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()][-1]
    return folder, logged


@pytest.mark.slow  # one 2-step tiny GRPO run per case, about 5 s each
def test_the_explorer_gives_back_the_logged_loss_with_the_entropy_bonus(run):
    folder, logged = run
    path = rollout_files(folder)[0]
    view = step_view(path, {})
    totals = view["totals"]
    assert logged["step"] == view["step"] == 2
    assert totals["loss"] == pytest.approx(logged["loss"], rel=1e-5, abs=1e-7)
    assert totals["entropy_bonus"] == pytest.approx(logged["entropy/bonus"], rel=1e-5)
    # the bonus is no rounding: alpha * H-bar moves the loss by far more than the tolerance above
    assert logged["entropy_coef"] * logged["entropy/bonus"] > 1e-3
    table, _ = read_rollouts(path)
    alphas = table.column("entropy_coef").to_pylist()
    assert alphas == pytest.approx([logged["entropy_coef"]] * 16, rel=1e-6)  # one optimizer step: one alpha
    for g in view["groups"]:  # each group's line: alpha and its own H-bar, subtracted from its aggregate
        assert g["bonus"] == pytest.approx(g["bonus_coef"][0] * g["bonus_entropy"], rel=1e-5)


@pytest.mark.slow
def test_a_file_written_before_alpha_was_recorded(run, tmp_path):
    """A rollouts file without the entropy_coef column: a constant alpha is the run's algo.entropy_coef, so the
    loss is the logged one still; an adaptive one is not known, and the page says it left the bonus out."""
    folder, logged = run
    table, meta = read_rollouts(rollout_files(folder)[0])
    old = table.drop_columns(["entropy_coef"])
    path = tmp_path / "step_000002.parquet"
    pq.write_table(old.replace_schema_metadata(table.schema.metadata), path)
    view = step_view(path, {})
    if meta["algo"]["adaptive_entropy"]:
        assert view["bonus_unknown"] and view["totals"]["entropy_bonus"] is None
        assert all(g["bonus"] is None for g in view["groups"])
    else:
        assert not view["bonus_unknown"]
        assert view["totals"]["loss"] == pytest.approx(logged["loss"], rel=1e-5, abs=1e-7)


def test_a_run_without_the_bonus_shows_none():
    """No bonus: no bonus line, the loss as before (the run of tests/unit/view's fixture covers its value)."""
    from grpokit.view.data import _bonus_coefs

    assert _bonus_coefs({"entropy_coef": [None, None]}, {"entropy_coef": 0.0}, 2) is None
    assert _bonus_coefs({}, {"entropy_coef": 0.0, "adaptive_entropy": False}, 2) is None
    assert _bonus_coefs({}, {"entropy_coef": 0.1, "adaptive_entropy": False}, 2).tolist() == pytest.approx(
        [0.1, 0.1]
    )
    assert _bonus_coefs({}, {"entropy_coef": 0.1, "adaptive_entropy": True}, 2) is None
