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


def test_a_candidate_is_kept_where_its_phases_beat_the_defaults():
    results = {
        "tune-default": _result(0.9, 0.45, 2.0, 9.0),
        "tune-fused-logprobs": _result(0.9, 0.35, 1.6, 9.5),  # faster passes: kept
        "tune-shared-prefix": _result(0.9, 0.60, 2.9, 8.8),  # slower: not kept
        "tune-chunk-2048": _result(0.9, 0.40, 1.7, 11.5),  # faster, but 1.28x the memory: not kept
    }
    assert pick_settings.pick(results) == ["--set", "optim.fused_logprobs=true"]
    results["tune-chunk-2048"]["peak_memory_gib"] = 10.5  # within the cap now
    assert pick_settings.pick(results) == ["--set", "optim.fused_logprobs=true", "--set", "optim.logprob_chunk_size=2048"]
    results["tune-fused-logprobs"]["median"]["update_s"] = 2.2  # slower passes in all
    assert pick_settings.pick(results) == ["--set", "optim.logprob_chunk_size=2048"]
    assert pick_settings.pick({"tune-chunk-2048": results["tune-chunk-2048"]}) == []  # no defaults' run: nothing


def test_main_reads_the_results_file_and_skips_a_failed_run(tmp_path, capsys):
    rows = [{"label": "tune-default", "result": _result(1.0, 0.5, 2.0, 10.0)},
            {"label": "tune-fused-logprobs", "exit": 124},
            {"label": "tune-shared-prefix", "result": _result(1.0, 0.4, 1.5, 11.0)}]  # fmt: skip
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    pick_settings.main(str(path))
    out = capsys.readouterr()
    assert out.out.split() == ["--set", "optim.shared_prefix=true"]
    assert "chosen: --set optim.shared_prefix=true" in out.err and "tune-shared-prefix: generation 1.000 s" in out.err
