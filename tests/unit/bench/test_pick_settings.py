"""scripts/pick_settings.py: which measured settings `gpu_session.sh tune` hands to the runs beside TRL."""

import importlib.util
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location("pick_settings", REPO / "scripts" / "pick_settings.py")
pick_settings = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pick_settings)


def _result(generation, reference, update, peak):
    median = {"generation_s": generation, "reference_s": reference, "update_s": update}
    return {"median": median, "peak_memory_gib": peak}


def test_each_setting_is_kept_where_its_phases_were_faster():
    results = {
        "tune-default": _result(1.28, 0.80, 2.0, 10.0),
        "tune-padded": _result(1.28, 0.50, 1.9, 9.0),  # the padded forward: faster passes
        "tune-compiled": _result(0.90, 0.45, 1.8, 9.5),  # compiled: faster generation and passes
    }
    everything = ["--set", "optim.shared_prefix=false", "--set", "rollout.compile=true", "--set", "model.compile=true"]
    assert pick_settings.pick(results) == everything
    results["tune-compiled"]["median"]["update_s"] = 2.5  # model.compile slower: not kept; the compiled decode is
    assert pick_settings.pick(results) == everything[:4]
    results["tune-compiled"]["median"]["generation_s"] = 1.3
    results["tune-padded"]["median"]["reference_s"] = 0.95  # the shared prefix was faster: kept on
    assert pick_settings.pick(results) == []


def test_a_failed_run_or_one_over_the_memory_cap_keeps_nothing():
    results = {
        "tune-default": _result(1.28, 0.80, 2.0, 10.0),
        "tune-padded": _result(1.28, 0.50, 1.9, 12.5),  # faster, but 1.25x the default's memory
        "tune-compiled": _result(0.90, 0.45, 1.8, 9.5),
    }
    assert pick_settings.pick(results) == []  # and without tune-padded, nothing to set compile against
    results["tune-padded"]["peak_memory_gib"] = 9.0
    del results["tune-compiled"]  # failed (no result)
    assert pick_settings.pick(results) == ["--set", "optim.shared_prefix=false"]
    assert pick_settings.pick({"tune-padded": results["tune-padded"]}) == []  # no baseline: the defaults


def test_main_reads_the_results_file(tmp_path, capsys):
    rows = [{"label": "tune-default", "result": _result(1.0, 0.5, 2.0, 10.0)},
            {"label": "tune-padded", "result": _result(1.0, 0.4, 1.5, 11.0)},
            {"label": "tune-compiled", "exit": 124}]  # fmt: skip
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    pick_settings.main(str(path))
    out = capsys.readouterr()
    assert out.out.split() == ["--set", "optim.shared_prefix=false"]
    assert "chosen: --set optim.shared_prefix=false" in out.err and "tune-padded: generation 1.000 s" in out.err
