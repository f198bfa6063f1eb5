"""What a run spends after its train_seconds clock stops (issue 52, item 6): the evaluation after the steps, the final
checkpoint and curves.png are counted in summary.json's seconds_after_steps; train.plots=false leaves the plot out."""

from __future__ import annotations

import json

import pytest
from tiny_model import small_trainer


@pytest.mark.parametrize("plots", [True, False])
def test_seconds_after_steps_are_in_the_summary_and_the_plot_is_optional(tmp_path, plots):
    out = tmp_path / "run"
    summary = small_trainer(out, 1, f"train.plots={str(plots).lower()}").train()
    written = json.loads((out / "summary.json").read_text())
    assert written == summary  # the file has the plot's seconds too (it is written again after the plot)
    assert 0 < summary["seconds_after_steps"] < 600 and summary["train_seconds"] > 0
    assert (out / "curves.png").is_file() is plots
