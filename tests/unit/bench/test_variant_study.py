"""scripts/variant_study.py's reading of the runs (issue 35, item 7): the mean curve over seeds and the accuracy
at equal training seconds, by hand."""

import importlib.util

import pytest
from paths import REPO

_spec = importlib.util.spec_from_file_location("variant_study", REPO / "scripts" / "variant_study.py")
study = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(study)


def test_mean_curve_averages_seconds_and_accuracy_over_the_steps_every_seed_has():
    runs = [
        {"curve": [(0, 0.0, 0.1), (5, 2.0, 0.3), (10, 4.0, 0.5)]},
        {"curve": [(0, 0.0, 0.2), (5, 4.0, 0.5)]},  # stopped early: step 10 is not shared
    ]
    assert study.mean_curve(runs) == [(0, 0.0, pytest.approx(0.15)), (5, 3.0, pytest.approx(0.4))]


def test_accuracy_at_is_linear_between_evaluations_and_the_last_past_the_end():
    curve = [(0, 0.0, 0.1), (5, 2.0, 0.3), (10, 6.0, 0.7)]
    assert study.accuracy_at(curve, 1.0) == pytest.approx(0.2)  # half way from 0.1 to 0.3
    assert study.accuracy_at(curve, 5.0) == pytest.approx(0.6)  # 3/4 of the way from 0.3 to 0.7
    assert study.accuracy_at(curve, 9.0) == pytest.approx(0.7)


def test_every_variant_names_a_preset():
    from grpokit.algos import PRESETS

    for name, overrides in study.VARIANTS.items():
        presets = [o.split("=", 1)[1] for o in overrides if o.startswith("algo.preset=")]
        assert len(presets) == 1 and presets[0] in PRESETS, name
