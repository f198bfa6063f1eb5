"""The planner holds on-policy distillation's teacher (issue 53 item 5): its weights resident beside the policy's,
in generation and in the update, by hand on a tiny shape."""

from grpokit.bench.plan import ModelDims, Settings, plan, predict


def dims(hidden: int) -> ModelDims:
    config = {
        "vocab_size": 10, "hidden_size": hidden, "num_hidden_layers": 1, "num_attention_heads": 1,
        "num_key_value_heads": 1, "intermediate_size": 2 * hidden, "tie_word_embeddings": True,
    }  # fmt: skip
    return ModelDims.from_dict(config)


def test_the_teacher_is_resident_beside_the_policy():
    student, teacher = dims(4), dims(8)
    alone = predict(student, Settings(precision="fp32"), [5, 5])
    both = predict(student, Settings(precision="fp32", teacher_params=teacher.params), [5, 5])
    assert alone["roles"]["teacher_model"] == 0
    assert both["roles"]["teacher_model"] == 4 * teacher.params  # float32, as the policy's weights
    for peak in ("update_peak_bytes", "generation_peak_bytes", "peak_bytes"):
        assert both[peak] - alone[peak] == 4 * teacher.params
    half = predict(student, Settings(precision="fp32", teacher_params=teacher.params, teacher_bytes=2), [5])
    assert half["roles"]["teacher_model"] == 2 * teacher.params  # teacher.dtype=bfloat16
    rows = plan(student, 1.0, [5, 5], teacher=teacher)
    assert all(r["roles"]["teacher_model"] == 2 * teacher.params or r["roles"]["teacher_model"] == 4 * teacher.params
               for r in rows)  # fmt: skip
