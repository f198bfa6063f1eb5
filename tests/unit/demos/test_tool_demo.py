"""The tool-use demo's pieces (grpokit.demos.tools): the teacher's episodes are assembled as the rollout
engine assembles them, the call parses, the reward reads the last turn."""

import random

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
