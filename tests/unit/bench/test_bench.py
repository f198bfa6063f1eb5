"""grpokit.bench on the CPU: the tiny random model and shape, the decode roofline, the CLI entry."""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
import textwrap

import pytest

from grpokit import bench


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("bench_models")


@pytest.fixture(scope="module")
def tiny_model(cache_dir):
    return bench.build_random_model("tiny", cache_dir)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="grpokit")
    bench.add_bench_parser(parser.add_subparsers(dest="command"))
    return parser


def _result_line(out: str) -> dict:
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert len(lines) == 1, out
    return json.loads(lines[0][len("RESULT ") :])


def test_build_random_model_is_cached_and_loads_word_level(tiny_model, cache_dir):
    from transformers import PreTrainedTokenizerFast

    from grpokit.model.loading import load_tokenizer

    stamp = (tiny_model / "COMPLETE").stat().st_mtime_ns
    assert bench.build_random_model("tiny", cache_dir) == tiny_model
    assert (tiny_model / "COMPLETE").stat().st_mtime_ns == stamp  # reused, not rebuilt
    config = json.loads((tiny_model / "config.json").read_text())
    assert config["model_type"] == "qwen2"
    assert (config["vocab_size"], config["hidden_size"], config["num_hidden_layers"]) == (1024, 64, 2)
    tok = load_tokenizer(str(tiny_model))
    assert type(tok) is PreTrainedTokenizerFast
    assert tok("w5 w17", add_special_tokens=False)["input_ids"] == [8, 20]  # word wk has id k + 3
    assert (tok.pad_token_id, tok.eos_token_id, tok.bos_token_id) == (0, 1, 2)
    with pytest.raises(ValueError, match="unknown model shape"):
        bench.build_random_model("7b", cache_dir)


def test_shapes_match_the_anchor():
    assert bench.BENCH_SHAPES["standard"] == bench.BenchShape(32, 8, 128, 256, 32)
    assert bench.BENCH_SHAPES["long"] == bench.BenchShape(16, 8, 128, 1024, 16)
    assert (
        bench.MODEL_SHAPES["0.5b"]["hidden_size"] == 896
        and bench.MODEL_SHAPES["1.5b"]["num_hidden_layers"] == 28
    )


@pytest.mark.slow
def test_run_bench_tiny(tiny_model, tmp_path):
    shape = bench.BENCH_SHAPES["tiny"]
    r = bench.run_bench(tiny_model, "tiny", steps=2, output_dir=tmp_path)
    on_gpu = r["device"].startswith("cuda")  # device auto: the same test checks a GPU run where there is one
    assert r["shape"] == "tiny" and r["steps"] == 2
    assert len(r["per_step"]) == 2
    for s in r["per_step"]:
        splits = [s[f"{k}_s"] for k in bench.TIME_KEYS]
        assert math.isfinite(s["step_s"]) and s["step_s"] > 0
        assert all(math.isfinite(v) and v >= 0 for v in splits)
        assert s["generation_s"] > 0 and s["update_s"] > 0 and s["reference_s"] > 0  # beta 0.04: a reference
        assert sum(splits) <= s["step_s"]
        assert s["other_s"] >= 0
        # every completion runs to the full length, none ends with EOS
        assert s["completion_len_mean"] == shape.completion_len
        assert s["truncated_frac"] == 1.0
        assert s["tokens_per_s"] > 0
    assert r["median_step_s"] == r["per_step"][1]["step_s"]  # median of steps 2..N
    assert r["median"]["generation_s"] == r["per_step"][1]["generation_s"]
    assert r["peak_memory_gib"] > 0
    assert r["peak_memory_kind"] == (
        "cuda max_memory_allocated" if on_gpu else "process peak RSS (ru_maxrss)"
    )
    assert r["completions_per_step"] == 8 and r["n_params"] > 0
    assert r["roofline_h100"]["seconds"] > 0
    # each phase against its bound on this device (grpokit.bench.roofline.phase_bounds): measured / bound
    phases = r["bounds"]["phases"]
    for name in ("generation", "reference", "update"):
        assert phases[name]["measured_s"] == r["median"][f"{name}_s"] > 0
        assert phases[name]["ratio"] == pytest.approx(phases[name]["measured_s"] / phases[name]["bound_s"])
    assert r["bounds"]["device"]["source"].startswith("datasheet: " if "H100" in r["device"] else "measured: ")
    json.dumps(r, allow_nan=False)  # plain JSON


def test_decode_roofline_hand_example():
    # 1e9 params in bf16 (2 bytes): 2e9 weight bytes read per decode step.
    # KV per cached position: 2 layers * 2 (K, V) * 1 kv head * head_dim 4 * 2 bytes = 32 bytes.
    # step 0 reads 2 rows * (3 prompt + 0) positions * 32 = 192 B; step 1: 2 * 4 * 32 = 256 B (448 B in all).
    # memory time: (2e9 + 192) / 1e12 + (2e9 + 256) / 1e12 = 4.000000448e-3 s.
    # compute per step: 2 * 1e9 * 2 rows = 4e9 FLOP / 1e15 = 4e-6 s  < 2e-3 s  -> memory bound.
    # tokens/s: 2 rows * 2 tokens / 4.000000448e-3 s = 999.999888...
    r = bench.decode_roofline(1e9, 2, 2, 1, 4, 2, 3, 2, 2, mem_bw_bytes_s=1e12, peak_flops=1e15)
    assert r["seconds"] == pytest.approx(4.000000448e-3, rel=1e-12)
    assert r["memory_s"] == pytest.approx(4.000000448e-3, rel=1e-12)
    assert r["compute_s"] == pytest.approx(8e-6, rel=1e-12)
    assert r["kv_bytes_total"] == 448
    assert r["weight_bytes_per_step"] == 2e9
    assert r["tokens_per_s"] == pytest.approx(4 / 4.000000448e-3, rel=1e-12)
    assert r["bound"] == "memory" and r["decode_steps"] == 2


def test_decode_roofline_compute_bound_and_defaults():
    # 1e6 params, batch 1000: 2 * 1e6 * 1000 = 2e9 FLOP / 1e12 = 2e-3 s per step, against
    # (2e6 weight bytes + at most 1000 * 2 * 4 KV bytes) / 1e12 ~ 2e-6 s: compute bound, 3 steps = 6e-3 s.
    r = bench.decode_roofline(1e6, 2, 1, 1, 1, 1000, 0, 3, 2, mem_bw_bytes_s=1e12, peak_flops=1e12)
    assert r["bound"] == "compute"
    assert r["seconds"] == pytest.approx(6e-3)
    assert r["tokens_per_s"] == pytest.approx(3000 / 6e-3)
    d = bench.decode_roofline(1e9, 2, 2, 1, 4, 2, 3, 2, 2)
    assert (d["mem_bw_bytes_s"], d["peak_flops"]) == (3.35e12, 989e12)  # H100 SXM


@pytest.mark.slow
def test_cli_tiny_prints_a_result_line(cache_dir, tiny_model, tmp_path, capsys):
    out_json = tmp_path / "bench.json"
    args = _parser().parse_args(
        ["bench", "--shape", "tiny", "--model-size", "tiny", "--cache-dir", str(cache_dir), "--steps", "2"]
        + ["--json", str(out_json), "--output-dir", str(tmp_path / "run")]
    )
    assert args.func(args) == 0
    out = capsys.readouterr().out
    result = _result_line(out)
    assert result["model_dir"] == str(tiny_model)  # the cached model was reused
    assert result["shape"] == "tiny" and len(result["step_s"]) == 2 and result["median_step_s"] > 0
    assert json.loads(out_json.read_text())["median_step_s"] == result["median_step_s"]
    assert "s/step" in out  # the table


def test_compare_trl_without_trl_fails_clearly(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "trl", None)  # as if not installed
    args = _parser().parse_args(
        ["bench", "--shape", "tiny", "--model-size", "tiny", "--cache-dir", str(tmp_path), "--compare", "trl"]
    )
    code = args.func(args)
    err = capsys.readouterr().err
    assert code != 0
    assert "'trl'" in err and "pip install" in err
    assert not any(tmp_path.iterdir())  # failed before building or running anything


def test_run_trl_passes_the_shape_and_parses_result(tiny_model, tmp_path, monkeypatch):
    """The subprocess contract, with a stand-in for TRL's script (same flags as the anchor's)."""
    fake = tmp_path / "fake_trl.py"
    fake.write_text(
        textwrap.dedent(
            """
            import argparse, json
            ap = argparse.ArgumentParser()
            ap.add_argument("model")
            for flag in ("--prompts", "--G", "--prompt-len", "--completion-len", "--steps", "--micro", "--vocab-hi"):
                ap.add_argument(flag, type=int)
            ap.add_argument("--beta", type=float)
            a = ap.parse_args()
            print("progress noise")
            print("RESULT", json.dumps(dict(system="trl", median_step_s=2.0, peak_alloc_gib=4.0, args=vars(a))))
            """
        )
    )
    monkeypatch.setattr(bench.trl, "check_trl", lambda python=None: None)
    trl = bench.run_trl(tiny_model, "tiny", steps=3, script=fake)
    assert trl["args"] == {
        "model": str(tiny_model),
        "prompts": 2,
        "G": 4,
        "prompt_len": 8,
        "completion_len": 8,
        "steps": 3,
        "micro": 8,
        "vocab_hi": 1021,
        "beta": 0.04,
    }
    ours = {"median_step_s": 1.0, "peak_memory_gib": 3.0, "peak_memory_kind": "cuda max_memory_allocated"}
    c = bench.compare(ours, trl)
    assert c["step_s_ratio"] == 0.5 and c["speedup"] == 2.0 and c["peak_memory_ratio"] == 0.75
    compile(bench.TRL_SCRIPT, "trl_bench.py", "exec")  # the built-in TRL script is valid Python
    with pytest.raises(bench.BenchError, match="RESULT"):
        bench.parse_result_line("no result here")


@pytest.mark.slow
def test_trl_out_of_memory_is_a_result_not_a_failure(tiny_model, tmp_path, monkeypatch, capsys):
    """A TRL run that dies of CUDA OOM is reported as such (the shape TRL cannot fit), with our numbers."""
    fake = tmp_path / "oom_trl.py"
    fake.write_text(
        "import sys\n"
        "print('generating...')\n"
        "print('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 40.00 GiB', file=sys.stderr)\n"
        "sys.exit(1)\n"
    )
    monkeypatch.setattr(bench.trl, "check_trl", lambda python=None: None)
    trl = bench.run_trl(tiny_model, "tiny", steps=2, script=fake)
    assert trl["out_of_memory"] is True and trl["median_step_s"] is None
    assert "40.00 GiB" in trl["error_tail"]
    ours = {"median_step_s": 1.0, "peak_memory_gib": 3.0, "peak_memory_kind": "cuda max_memory_allocated"}
    c = bench.compare(ours, trl)
    assert c["trl_out_of_memory"] and c["step_s_ratio"] is None and c["peak_memory_ratio"] is None
    result = bench.run_bench(tiny_model, "tiny", steps=1, output_dir=tmp_path / "run")
    result["compare"] = c
    bench.print_table(result)
    assert "out of memory" in capsys.readouterr().out

    crash = tmp_path / "crash_trl.py"
    crash.write_text("raise SystemExit('ImportError: something else broke')\n")
    with pytest.raises(bench.BenchError, match="(?s)TRL run failed.*something else broke"):
        bench.run_trl(tiny_model, "tiny", steps=2, script=crash)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="TRL is not installed (pip install trl)")
def test_run_trl_for_real_on_the_tiny_shape(tiny_model):
    """TRL's GRPOTrainer itself, in the subprocess, on the tiny shape (CPU): the harness end to end."""
    trl = bench.run_trl(tiny_model, "tiny", steps=2)
    assert trl["system"] == "trl" and trl["median_step_s"] > 0 and len(trl["step_s"]) == 2
    assert trl["completions_per_step"] == 8 and trl["completion_len"] == 8


def test_memory_fraction_is_the_cap_over_the_device():
    assert bench.run.memory_fraction(16, 80 * 2**30) == 0.2  # 16 GiB of an 80 GiB card
    assert bench.run.memory_fraction(80, 80 * 2**30) == 1.0  # the whole card is allowed
    for bad, match in ((0, "must be > 0"), (-1, "must be > 0"), (float("nan"), "must be > 0"), (81, "only 80.0 GiB")):
        with pytest.raises(ValueError, match=match):
            bench.run.memory_fraction(bad, 80 * 2**30)


@pytest.mark.slow
def test_cli_set_overrides_reach_the_config_and_a_cap_needs_cuda(cache_dir, tiny_model, tmp_path, capsys):
    base = ["bench", "--shape", "tiny", "--model-size", "tiny", "--cache-dir", str(cache_dir), "--steps", "1"]
    args = _parser().parse_args(base + ["--set", "algo.beta=0", "--set", "rollout.temperature=0.5"])
    assert args.func(args) == 0
    result = _result_line(capsys.readouterr().out)
    assert result["beta"] == 0.0
    assert result["median"]["reference_s"] == pytest.approx(0.0, abs=1e-3)  # beta 0: no reference pass
    assert result["overrides"] == ["algo.beta=0", "rollout.temperature=0.5"]
    args = _parser().parse_args(base + ["--set", "algo.no_such_knob=1"])
    assert args.func(args) == 2
    assert "no_such_knob" in capsys.readouterr().err
    if not __import__("torch").cuda.is_available():
        args = _parser().parse_args(base + ["--memory-cap-gib", "4", "--device", "cpu"])
        assert args.func(args) == 2
        assert "a memory cap needs a CUDA device" in capsys.readouterr().err
