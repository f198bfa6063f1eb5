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


def test_each_phase_takes_its_fastest_setting_within_the_memory_cap(tmp_path):
    rows = [
        {"label": "tune-default", "result": _result(1.28, 0.80, 2.0, 10.0)},
        {"label": "tune-compile-padded", "result": _result(0.90, 0.50, 1.9, 9.0)},  # faster generation and update
        {"label": "tune-nockpt-padded", "result": _result(1.28, 0.80, 1.2, 13.0)},  # faster, but over 1.2x memory
        {"label": "tune-other", "exit": 124},  # failed: not a candidate
    ]
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    results = {r["label"]: r["result"] for r in rows if "result" in r}
    assert pick_settings.pick(results) == ["--set", "rollout.compile=true", "--set", "optim.shared_prefix=false"]

    results["tune-nockpt-padded"]["peak_memory_gib"] = 11.9  # within the cap now: the fastest update
    nockpt = ["--no-gradient-checkpointing", "--set", "optim.shared_prefix=false"]
    assert pick_settings.pick(results) == ["--set", "rollout.compile=true", *nockpt]
    results["tune-compile-padded"]["median"]["generation_s"] = 1.3  # compiling did not pay: not kept
    assert pick_settings.pick(results) == nockpt
    assert pick_settings.pick({"tune-compile-padded": results["tune-compile-padded"]}) == []  # no baseline: defaults


def test_main_reads_the_results_file(tmp_path, capsys):
    rows = [{"label": "tune-default", "result": _result(1.0, 0.5, 2.0, 10.0)},
            {"label": "tune-nockpt-padded", "result": _result(1.0, 0.4, 1.5, 11.0)}]  # fmt: skip
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    pick_settings.main(str(path))
    out = capsys.readouterr()
    assert out.out.split() == ["--no-gradient-checkpointing", "--set", "optim.shared_prefix=false"]
    assert "chosen: generation default, update tune-nockpt-padded" in out.err
