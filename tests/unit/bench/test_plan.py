"""grpokit bench --plan (grpokit.bench.plan): the parameter count against transformers' own, the largest
micro-batch by hand, the roles by hand, and the command on a config file."""

import json

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from grpokit.bench.plan import ModelDims, Settings, largest_micro_batch, lora_params, plan, predict
from grpokit.bench.shapes import MODEL_SHAPES


@pytest.mark.parametrize("shape,tied", [("tiny", True), ("1.5b", True), ("1.5b", False)])
def test_the_parameter_count_is_transformers_own(shape, tied):
    dims = dict(MODEL_SHAPES[shape], tie_word_embeddings=tied)
    with torch.device("meta"):
        model = Qwen2ForCausalLM(Qwen2Config(**dims))
    assert ModelDims.from_dict(dims).params == sum(p.numel() for p in model.parameters())


def test_lora_params_count_the_adapters_peft_adds():
    peft = pytest.importorskip("peft")
    dims = dict(MODEL_SHAPES["tiny"], tie_word_embeddings=True)
    model = Qwen2ForCausalLM(Qwen2Config(**dims))
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    wrapped = peft.get_peft_model(model, peft.LoraConfig(r=16, target_modules=targets))
    trainable = sum(p.numel() for p in wrapped.parameters() if p.requires_grad)
    assert lora_params(ModelDims.from_dict(dims), r=16) == trainable


def test_largest_micro_batch_by_hand():
    lengths = [10, 3, 7, 2, 30]  # sorted: 2, 3, 7, 10, 30
    # rows of 2: [2, 3] 6, [7, 10] 20, [30] 30 positions; rows of 3: [2, 3, 7] 21, [10, 30] 60
    assert largest_micro_batch(lengths, Settings(micro_batch_rows=2)) == 30
    assert largest_micro_batch(lengths, Settings(micro_batch_rows=3)) == 2 * 30
    assert largest_micro_batch(lengths, Settings()) == 5 * 30  # every row, padded to 30
    # packed, budget 12: [2, 3, 7] = 12, [10], [30] (alone: longer than the budget)
    assert largest_micro_batch(lengths, Settings(packing=True, micro_batch_tokens=12)) == 30
    # budget 25: [2, 3, 7, 10] 22, then [30]; budget 60: every row, 52
    assert largest_micro_batch(lengths, Settings(packing=True, micro_batch_tokens=25)) == 30
    assert largest_micro_batch(lengths, Settings(packing=True, micro_batch_tokens=60)) == 52
    assert largest_micro_batch(lengths, Settings(packing=True)) == 52  # every row, no padding


def test_roles_by_hand():
    """A 1,000-parameter stand-in: bf16_kahan is 2 + 2 + 6 bytes a parameter; offloading the optimizer
    takes its 6 off the GPU, a reference (beta > 0, no LoRA) adds 2, offloading it takes them off again."""
    dims = ModelDims(vocab=10, hidden=4, intermediate=8, layers=1, heads=2, kv_heads=1, head_dim=2, tied=True)
    p = dims.params
    base = predict(dims, Settings(precision="bf16_kahan"), [5, 5])["roles"]
    assert (base["policy_weights"], base["policy_gradients"], base["policy_optimizer"]) == (
        2 * p,
        2 * p,
        6 * p,
    )
    assert base["reference_model"] == 0  # beta 0
    assert (
        predict(dims, Settings(precision="bf16_kahan", offload_optimizer=True), [5])["roles"][
            "policy_optimizer"
        ]
        == 0
    )
    assert predict(dims, Settings(beta=0.04), [5])["roles"]["reference_model"] == 2 * p
    assert predict(dims, Settings(beta=0.04, offload_reference=True), [5])["roles"]["reference_model"] == 0
    # the sampler's KV cache: 10 tokens x 1 layer x (K and V) x 1 kv head x head dim 2 x 2 bytes
    assert predict(dims, Settings(), [5, 5])["roles"]["kv_cache"] == 10 * 1 * 2 * 1 * 2 * 2


def test_plan_says_a_full_bf16_kahan_1_5b_fits_16_gib_only_with_the_optimizer_offloaded(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(dict(MODEL_SHAPES["1.5b"], tie_word_embeddings=True)))
    rows = {r["settings"]: r for r in plan(ModelDims.from_file(tmp_path), 16, [384] * 256)}
    assert not rows["full bf16_kahan, packed"]["fits"]  # 14.4 GiB of weights, gradients and AdamW alone
    assert rows["full bf16_kahan, packed, optimizer offloaded"]["fits"]
    with pytest.raises(ValueError, match="not a transformers config.json"):
        ModelDims.from_file(tmp_path / "nothing.json")


@pytest.mark.slow
def test_the_update_memory_bench_measures_a_packed_update_and_predicts_it():
    """grpokit bench --memory's one variant, in this process, on a tiny Qwen2 (the real run uses the
    151,936-word vocabulary): the roles it reads are the parameters' bytes; the plan predicts the same."""
    from grpokit.bench.update_memory import LongTail, measure_variant

    dims = dict(MODEL_SHAPES["tiny"], tie_word_embeddings=True)
    tail = LongTail(rows=4, prompt_len=3, short_min=2, short_max=4, long_rows=1, long_len=9)
    r = measure_variant("packed", steps=1, tail=tail, model=dims)
    n = ModelDims.from_dict(dims).params
    with torch.device("meta"):
        meta = Qwen2ForCausalLM(Qwen2Config(**dims))
    tensors = len(list(meta.parameters()))
    buffers = sum(b.numel() * 4 for b in meta.buffers())  # RoPE's inverse frequencies (float32)
    assert r["n_params"] == n and r["roles"]["policy_weights"] == 4 * n + buffers  # float32
    assert r["roles"]["policy_optimizer"] == 8 * n + 4 * tensors  # AdamW's two moments, a step count a tensor
    assert r["predicted"]["roles"]["policy_weights"] == 4 * n
    assert (
        r["predicted"]["roles"]["reference_model"] + buffers
        == r["roles"]["reference_model"]
        == 4 * n + buffers
    )
    assert r["peak_bytes"] > 0 and r["median_update_s"] > 0 and r["micro_batch_rows"] == 4  # one packed micro


@pytest.mark.slow
def test_the_memory_bench_runs_each_variant_in_its_own_process_and_prints_the_table(capsys):
    from grpokit.bench.update_memory import VARIANTS, measure, print_memory_table

    dims = dict(MODEL_SHAPES["tiny"], tie_word_embeddings=True)
    result = measure(list(VARIANTS), steps=2, model=dims)
    assert set(result["variants"]) == {"padded", "packed"}
    padded, packed = result["variants"]["padded"], result["variants"]["packed"]
    assert padded["roles"] == packed["roles"]  # the same weights, gradients, AdamW, reference
    # the default long tail: 8 rows of 16 + 4..24 tokens and one of 16 + 256; padded 8 x 272 positions
    assert padded["predicted"]["largest_micro_batch_positions"] == 8 * 272
    assert packed["predicted"]["largest_micro_batch_positions"] < 8 * 272 / 4
    assert result["padded_over_packed"]["peak"] > 0
    print_memory_table(result)
    out = capsys.readouterr().out
    assert "padded / packed: peak" in out and "policy optimizer" in out
