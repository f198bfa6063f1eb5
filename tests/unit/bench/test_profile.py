"""grpokit.bench.profile, the phases of scripts/profile_step.py: busy time, gaps and top kernels of a made-up
timeline by hand, and the script on the tiny model and shape on the CPU (operators for kernels)."""

import importlib.util
import json

import pytest
from paths import REPO

from grpokit.bench.profile import MARKS, Span, merged, phase_report


def test_merged_is_the_union():
    assert merged([(5, 7), (0, 2), (1, 3), (7, 8)]) == [(0, 3), (5, 8)]


def test_a_phase_by_hand():
    """Phase 'update' from 0 to 100 us; kernels a 10-30, b 25-40 (overlapping a), c 70-90; d at 120 is outside.
    Busy: 10-40 and 70-90, 50 us; gaps: 0-10 (start, a), 40-70 (b, c), 90-100 (c, end): 50 us in 3 gaps."""
    level = [Span("a", 10, 30, 20), Span("b", 25, 40, 15), Span("c", 70, 90, 20), Span("d", 120, 130, 10)]
    timed = [*level, Span("a", 80, 85, 4)]  # a second call of a, counted in a's total
    r = phase_report({"update": [(0, 100)]}, level, timed, top=2)["update"]
    assert (r["wall_s"], r["busy_s"], r["gap_s"], r["gaps"]) == (100e-6, 50e-6, 50e-6, 3)
    assert r["largest_gaps"][0] == {"s": 30e-6, "after": "b", "before": "c"}
    assert sorted(g["s"] for g in r["largest_gaps"]) == [10e-6, 10e-6, 30e-6]
    assert r["top"] == [{"name": "a", "s": 24e-6, "calls": 2}, {"name": "c", "s": 20e-6, "calls": 1}]


def test_a_phase_of_two_ranges_counts_both():
    level = [Span("k", 1, 2, 1), Span("k", 11, 13, 2)]
    r = phase_report({"generation": [(0, 4), (10, 14)]}, level, level)["generation"]
    assert (r["wall_s"], r["busy_s"], r["gaps"]) == (8e-6, 3e-6, 4)  # 0-1, 2-4, 10-11, 13-14
    assert r["top"] == [{"name": "k", "s": 3e-6, "calls": 2}]


@pytest.mark.slow
def test_the_script_names_each_phases_operators_and_gaps_on_the_cpu(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPOKIT_CACHE", str(tmp_path / "cache"))
    spec = importlib.util.spec_from_file_location("profile_step", REPO / "scripts" / "profile_step.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    result = script.main(["--model-size", "tiny", "--shape", "tiny", "--warmup", "0", "--rows", "5",
                          "--out", str(tmp_path / "p.txt"), "--json", str(tmp_path / "p.json")])  # fmt: skip
    assert json.loads((tmp_path / "p.json").read_text()) == json.loads(json.dumps(result))
    assert sorted(result["phases"]) == sorted(MARKS)  # beta 0.04: a reference pass
    for phase in result["phases"].values():
        assert 0 < phase["busy_s"] <= phase["wall_s"] < result["step_wall_s"]
        assert phase["gap_s"] == pytest.approx(phase["wall_s"] - phase["busy_s"]) and phase["gaps"] >= 1
        assert any(t["name"].startswith("aten::") for t in phase["top"])  # operators, not the phase ranges
        assert not any(t["name"].startswith("phase: ") for t in phase["top"])
    # a matrix multiply among the update's top operators: aten::mm / addmm, or the autograd node that runs it (a cold
    # first step can rank the backward's MmBackward0 above the forward's aten::mm, behind the gradients' fill_)
    matmuls = ("aten::mm", "aten::addmm", "MmBackward0", "AddmmBackward0")
    assert any(t["name"] in matmuls for t in result["phases"]["update"]["top"])
    text = (tmp_path / "p.txt").read_text()
    assert "update:" in text and "top operators by time" in text and "gap " in text


@pytest.mark.slow
def test_a_skipped_phase_runs_but_is_not_recorded(tmp_path, monkeypatch):
    """--skip generation: the step still generates (its completions reach the update), but no generation range and
    none of its operators are in the profile."""
    monkeypatch.setenv("GRPOKIT_CACHE", str(tmp_path / "cache"))
    spec = importlib.util.spec_from_file_location("profile_step", REPO / "scripts" / "profile_step.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    result = script.main(["--model-size", "tiny", "--shape", "tiny", "--warmup", "0", "--rows", "5", "--skip",
                          "generation", "--out", str(tmp_path / "p.txt")])  # fmt: skip
    assert sorted(result["phases"]) == ["reference", "update"]
    assert "not recorded: generation" in (tmp_path / "p.txt").read_text()
    for phase in result["phases"].values():
        assert 0 < phase["busy_s"] <= phase["wall_s"]
