"""grpokit bench --mode sft: grpokit's SFT steps on the same rows and batch as TRL's SFTTrainer (tiny, CPU)."""

from __future__ import annotations

import pytest

from grpokit.bench.model import build_random_model
from grpokit.bench.sft import SFT_SHAPES, compare_sft, run_sft_bench, run_trl_sft, sft_rows


@pytest.mark.slow
def test_rows_are_exactly_the_shape_and_grpokit_trains_on_the_completion(tmp_path):
    model_dir = build_random_model("tiny", tmp_path)
    rows = sft_rows(3, SFT_SHAPES["tiny"], 1000, seed=1)
    assert all(len(r["prompt"].split()) == 16 and len(r["completion"].split()) == 47 for r in rows)
    result = run_sft_bench(model_dir, "tiny", steps=2)  # checks 64 tokens per row, 48 of them trained
    assert len(result["step_s"]) == 2 and result["tokens_per_s"] == pytest.approx(8 * 64 / result["median_step_s"])
    assert result["precision"] == "fp32" and result["peak_memory_gib"] > 0


@pytest.mark.slow
def test_trl_does_the_same_work(tmp_path):
    pytest.importorskip("trl")
    model_dir = build_random_model("tiny", tmp_path)
    trl = run_trl_sft(model_dir, "tiny", steps=2)  # refuses rows not tokenized to 64 tokens with 48 trained
    assert trl["row_lengths"] == [64] and trl["trained_tokens_row0"] == 48 and len(trl["step_s"]) == 2
    ours = {"median_step_s": 1.0, "tokens_per_s": 512.0, "peak_memory_gib": 0.5}
    ratios = compare_sft(ours, {**trl, "median_step_s": 2.0, "tokens_per_s": 256.0, "peak_memory_gib": 1.0})
    assert ratios["speedup"] == 2.0 and ratios["tokens_per_s_ratio"] == 2.0 and ratios["peak_memory_ratio"] == 0.5
