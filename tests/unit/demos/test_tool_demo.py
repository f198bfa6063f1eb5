"""The tool-use demo's pieces (grpokit.demos.tools): the teacher's episodes are assembled as the rollout
engine assembles them, the call parses, the reward reads the last turn."""

import json
import random
from dataclasses import asdict

import pytest
import torch

from grpokit.demos import tools as d
from grpokit.rollout.multiturn import ChatDelta
from grpokit.rollout.tools import hermes, load_tools


def test_teacher_episode_ids_labels_and_call():
    tok = d.build_tokenizer()
    delta = ChatDelta(tok, [t.schema for t in load_tools([d.multiply])])
    row = {"prompt": "1234*5678=", "answer": "7006652"}
    turns = d.teacher_turns(row, random.Random(0), d.ToolDemoSpec(teacher_tool=1.0))
    assert hermes(turns[0])[0].name == "multiply" and hermes(turns[0])[0].arguments == {"a": 1234, "b": 5678}
    ids, labels = d.episode_ids(delta, tok, row, turns)
    assert tok.decode(ids, skip_special_tokens=False) == (
        "<|tools|>multiply <|user|>1234*5678=<|assistant|>"
        '<tool_call>{"name": "multiply", "arguments": {"a": 1234, "b": 5678}}</tool_call><eos>'
        "<|tool|>7006652<|assistant|><answer>7006652</answer><eos>"
    )
    trained = tok.decode([i for i, lab in zip(ids, labels) if lab != -100], skip_special_tokens=False)
    assert trained == turns[0] + "<eos>" + "<answer>7006652</answer><eos>"  # the model's turns only
    assert len(tok(turns[0], add_special_tokens=False).input_ids) == 11  # 3 pieces + 8 digits
    guess = d.teacher_turns(row, random.Random(1), d.ToolDemoSpec(teacher_tool=0.0))
    assert len(guess) == 1 and guess[0] != "<answer>7006652</answer>"


def test_tool_answer_reads_the_last_assistant_turn():
    episodes = [
        [{"role": "assistant", "content": "<tool_call>..."}, {"role": "tool", "content": "42"},
         {"role": "assistant", "content": "<answer>42</answer>"}],
        [{"role": "assistant", "content": "<answer>42</answer>"}, {"role": "tool", "content": "x"},
         {"role": "assistant", "content": "<answer>41</answer>"}],
        [],
    ]  # fmt: skip
    assert d.tool_answer(None, episodes, ["42", "42", "42"]) == [1.0, 0.0, 0.0]


def test_warm_start_batches_drill_the_copy_without_training_the_choice_to_call():
    """Half of each batch are copy drills, trained on all but their first token: the copies (factors into the
    call, result into the answer) get 16 + ~5 episodes per batch of 32 (before: ~10, too few to learn them),
    while the trained first tokens (the choice: call or answer) stay the teacher's, ~30% calls."""
    spec = d.ToolDemoSpec()
    tok = d.build_tokenizer()
    delta = ChatDelta(tok, [t.schema for t in load_tools([d.multiply])])
    rows, _ = d.make_problems(d.ToolDemoSpec(train_size=64, eval_size=1))
    rng, gen = random.Random(0), torch.Generator().manual_seed(0)
    batch = d.warm_start_batch(delta, tok, rows, spec, rng, gen)
    assert len(batch) == spec.sft_batch == 32
    first_turns, copies = [], 0
    for ids, labels in batch:
        text = tok.decode(ids, skip_special_tokens=False)
        trained = tok.decode([i for i, lab in zip(ids, labels) if lab != -100], skip_special_tokens=False)
        a, b = text.split("<|user|>")[1].split("=")[0].split("*")
        if "<|tool|>" in text:  # a call and its result: the call copies the factors, the answer the result
            result = text.split("<|tool|>")[1].split("<|assistant|>")[0]
            assert result == str(int(a) * int(b))
            assert trained.endswith(f'{a}, "b": {b}}}}}</tool_call><eos><answer>{result}</answer><eos>')
            copies += 1
        if not trained.startswith("<"):  # a drill: all but the choice (the call's first token) is trained
            assert trained == f'{a}, "b": {b}}}}}</tool_call><eos><answer>{result}</answer><eos>'
        else:
            first_turns.append(trained.startswith("<tool_call>"))
    assert len(first_turns) == 16  # 16 drills, 16 teacher episodes
    assert copies >= 16 + 1 and copies == 16 + sum(first_turns)
    assert 0 < sum(first_turns) < 16  # the choice: the teacher's mix of calls and guesses


def test_every_product_has_eight_digits_so_the_copy_is_at_one_distance():
    """The result the answer copies sits at the same distance in every episode (module docstring); the
    factors keep their 4 digits and the eval rows stay apart from the training rows."""
    train, held_out = d.make_problems(d.ToolDemoSpec())
    assert len(train) == 4000 and len(held_out) == 200
    assert {len(r["answer"]) for r in train + held_out} == {8}
    assert all(3163 <= int(x) <= 9999 for r in train + held_out for x in r["prompt"].rstrip("=").split("*"))
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in held_out}


def test_the_shipped_tool_model_is_the_current_specs_and_its_weights_are_the_recorded_ones():
    """The tool demo's warm-started model ships with the package (python -m grpokit.demos.shipped --demo
    tools): a change of ToolDemoSpec or DEMO_VERSION without a rebuild fails here (the demo would otherwise
    warm-start for minutes on every first run)."""
    from grpokit.demos import shipped
    from grpokit.demos.default import SHIPPED_MANIFEST, shipped_key

    manifest = json.loads((d.SHIPPED_DIR / SHIPPED_MANIFEST).read_text())
    assert manifest["key"] == shipped_key(d.ToolDemoSpec()), "rebuild: python -m grpokit.demos.shipped --demo tools"
    assert manifest["spec"] == asdict(d.ToolDemoSpec())
    assert manifest["command"] == "python -m grpokit.demos.shipped --demo tools"
    assert shipped.file_sha256(d.SHIPPED_DIR / shipped.WEIGHTS) == manifest["weights_sha256"]
    size = sum(p.stat().st_size for p in d.SHIPPED_DIR.iterdir())
    assert size < 800_000, f"the shipped tool demo model takes {size} bytes"


def test_prepare_uses_the_shipped_tool_model_without_a_warm_start(tmp_path):
    from grpokit.demos.default import shipped_model

    messages = []
    paths = d.prepare(cache=tmp_path, log=messages.append)
    assert paths["model"] == d.SHIPPED_DIR
    assert not any("warm start" in m for m in messages) and any("shipped" in m for m in messages), messages
    train, held_out = (p.read_text().splitlines() for p in (paths["train"], paths["eval"]))
    assert len(train) == 4000 and len(held_out) == 200
    assert shipped_model(d.ToolDemoSpec(sft_steps=3), d.SHIPPED_DIR) is None  # another spec: warm-started


@pytest.mark.slow
def test_the_tool_model_build_is_reproducible_and_recorded(tmp_path):
    from grpokit.demos import shipped
    from grpokit.demos.default import shipped_key

    small = d.ToolDemoSpec(hidden_size=32, sft_steps=4, sft_batch=8, train_size=40, eval_size=4)
    first = shipped.build(tmp_path / "a", small, log=lambda m: None, demo="tools")
    second = shipped.build(tmp_path / "b", small, log=lambda m: None, demo="tools")
    assert first["weights_sha256"] == second["weights_sha256"] and first["key"] == shipped_key(small)
    assert first["command"] == "python -m grpokit.demos.shipped --demo tools"
    assert shipped.file_sha256(tmp_path / "a" / shipped.WEIGHTS) == first["weights_sha256"]
