"""grpokit bench --memory --compare trl: TRL's GRPOTrainer measured on the same batch, beside grpokit's update."""

from __future__ import annotations

import argparse

import pytest

from grpokit import bench
from grpokit.bench.shapes import MODEL_SHAPES
from grpokit.bench.update_memory import LongTail, measure, print_memory_table, trl_setting_differences


@pytest.mark.slow
def test_trl_runs_beside_grpokit_on_the_same_batch_and_model(capsys):
    """Both rows, each from its own process, on the tiny Qwen2 and the default long-tailed batch. The
    peaks depend on the machine's load, so only their sign is checked; the roles do not: the same model in
    float32 gives TRL the same weights, gradients, AdamW state and reference, byte for byte."""
    pytest.importorskip("trl", reason="TRL runs beside grpokit here: pip install 'grpokit[trl]'")
    dims = dict(MODEL_SHAPES["tiny"], tie_word_embeddings=True)
    result = measure(["packed"], steps=2, model=dims, trl=True)
    assert list(result["variants"]) == ["packed", "trl"]
    packed, trl = result["variants"]["packed"], result["variants"]["trl"]
    assert packed["peak_bytes"] > 0 and trl["peak_bytes"] > 0
    assert trl["dtype"] == "torch.float32" and trl["n_params"] == packed["n_params"]
    for role in ("policy_weights", "policy_gradients", "policy_optimizer", "reference_model"):
        assert trl["roles"][role] == packed["roles"][role] > 0, role
    assert len(trl["update_s"]) == 2 and trl["median_update_s"] == trl["update_s"][1] > 0  # step 2's
    assert trl["micro_batch_rows"] == 8 and trl["predicted"] is None
    ratio = result["over_trl"]["packed"]
    assert ratio["peak"] == packed["peak_bytes"] / trl["peak_bytes"]
    assert ratio["update_s"] == packed["median_update_s"] / trl["median_update_s"]
    # TRL hard-codes its std epsilon (1e-4); every other setting both have is given grpokit's value
    assert [d["key"] for d in result["trl_setting_differences"]] == ["algo.std_eps"]
    print_memory_table(result)
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["GiB", "packed", "(plan)", "trl", "(plan)"]
    assert "packed / trl: peak" in out and "algo.std_eps: grpokit 1e-06, trl 0.0001" in out


def test_a_grpokit_override_shows_among_the_differences():
    """--set acts on grpokit's runs only, so the differences name it: adam_beta2 0.95 here, TRL's run 0.99
    (grpokit's default, which trl_values gives it)."""
    got = trl_setting_differences(LongTail(), 2, 0.04, ["optim.adam_beta2=0.95"])
    assert {"key": "optim.adam_beta2", "grpokit": 0.95, "trl": 0.99} in got
    assert [d["key"] for d in trl_setting_differences(LongTail(), 2, 0.04)] == ["algo.std_eps"]


def test_memory_compare_trl_refuses_another_python_or_script(capsys):
    parser = argparse.ArgumentParser(prog="grpokit")
    bench.add_bench_parser(parser.add_subparsers(dest="command"))
    for flag in ("--trl-python", "--trl-script"):
        args = parser.parse_args(["bench", "--memory", "--compare", "trl", flag, "/usr/bin/python3"])
        assert args.func(args) == 2
        assert f"runs TRL in this Python with grpokit's meter: drop {flag}" in capsys.readouterr().err
