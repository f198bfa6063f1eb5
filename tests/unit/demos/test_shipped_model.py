"""The default demo's warm-started model ships with the package (grpokit/demos/model, built by
``python -m grpokit.demos.shipped``): the first command skips the 1,500-step warm start."""

import json
from dataclasses import asdict

import pytest

from grpokit.demos import shipped
from grpokit.demos.default import (
    SHIPPED_DIR,
    SHIPPED_MANIFEST,
    DemoSpec,
    completion_text,
    prepare_demo,
    shipped_key,
    shipped_model,
)


def test_shipped_model_is_the_current_specs_and_its_weights_are_the_recorded_ones():
    """A change of DemoSpec or DEMO_VERSION without a rebuild fails here (the demo would otherwise build
    the model for minutes on every first run)."""
    manifest = json.loads((SHIPPED_DIR / SHIPPED_MANIFEST).read_text())
    assert manifest["key"] == shipped_key(DemoSpec()), "rebuild: python -m grpokit.demos.shipped"
    assert manifest["spec"] == asdict(DemoSpec())
    assert shipped.file_sha256(SHIPPED_DIR / shipped.WEIGHTS) == manifest["weights_sha256"]
    size = sum(p.stat().st_size for p in SHIPPED_DIR.iterdir())
    assert size < 800_000, f"the shipped demo model takes {size} bytes"


def test_prepare_demo_uses_the_shipped_model_without_a_warm_start(tmp_path):
    messages = []
    paths = prepare_demo(cache=tmp_path, log=messages.append)
    assert paths["model"] == SHIPPED_DIR
    assert not any("warm start" in m and "/1500" in m for m in messages), messages
    assert any("shipped" in m for m in messages)
    train, held_out = (p.read_text().splitlines() for p in (paths["train"], paths["eval"]))
    assert len(train) == 50 * 50 - 200 and len(held_out) == 200
    # a spec the package was not built from is warm-started as before
    assert shipped_model(DemoSpec(sft_steps=3)) is None


@pytest.mark.slow
def test_shipped_model_answers_like_the_warm_start_it_is(tmp_path):
    """Greedy answers on 60 held-out problems: always in the <answer>N</answer> format the teacher taught,
    mostly wrong (the teacher's sum+1 habit: 30% right): what GRPO then corrects. A random model would
    write no format; a model trained on the truth would be mostly right."""
    import torch
    from transformers import AutoModelForCausalLM

    from grpokit.model.loading import load_tokenizer

    paths = prepare_demo(cache=tmp_path, log=lambda m: None)
    tok = load_tokenizer(str(paths["model"]))
    model = AutoModelForCausalLM.from_pretrained(paths["model"], dtype=torch.float32).eval()
    rows = [json.loads(line) for line in paths["eval"].read_text().splitlines()][:60]
    formatted = right = off_by_one = 0
    for row in rows:
        ids = torch.tensor([tok(row["prompt"], add_special_tokens=False).input_ids])
        out = model.generate(ids, max_new_tokens=8, do_sample=False, eos_token_id=tok.eos_token_id,
                             pad_token_id=tok.pad_token_id)  # fmt: skip
        text = tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
        total = int(row["answer"])
        formatted += text.startswith("<answer>") and text.endswith("</answer>")
        right += text == completion_text(total)
        off_by_one += text in (completion_text(total + 1), completion_text(total - 1))
    assert formatted == len(rows)
    assert right <= 0.4 * len(rows) and off_by_one >= 0.5 * len(rows), (right, off_by_one)


@pytest.mark.slow
def test_build_is_reproducible_and_recorded(tmp_path):
    """Two builds of a small spec give the same bytes; the manifest records the spec's key and the sha."""
    small = DemoSpec(max_operand=9, eval_size=20, hidden_size=32, sft_steps=20, sft_batch=16)
    first = shipped.build(tmp_path / "a", small, log=lambda m: None)
    second = shipped.build(tmp_path / "b", small, log=lambda m: None)
    assert first["weights_sha256"] == second["weights_sha256"]
    assert first["key"] == shipped_key(small)
    assert shipped.file_sha256(tmp_path / "a" / shipped.WEIGHTS) == first["weights_sha256"]
    assert shipped.weight_differences(tmp_path / "a", tmp_path / "b") == 0.0
