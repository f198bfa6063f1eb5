"""SFT rows -> token ids and loss mask (grpokit.data.sft), against hand-built examples: exactly which tokens
count, for plain and chat rendering, every format; and the one-line errors bad rows get.

The tiny tokenizer has one token per character; its chat template is
    <bos> then per message  <|user|>CONTENT   or   <|assistant|>CONTENT<eos>   then <|assistant|> to open a turn.
"""

from __future__ import annotations

import json

import pytest
import torch
from tiny_model import make_tiny_tokenizer

from grpokit.config.sft import SFTDataConfig, load_sft_config
from grpokit.data.prompts import DataError
from grpokit.data.sft import (
    collate,
    detect_format,
    encode_example,
    encode_examples,
    load_sft_rows,
    prompt_rows,
)

TOK = make_tiny_tokenizer()


def tokens(row, fmt, loss_on="auto", **data):
    """[(token, counted)] of one row."""
    ex = encode_example(row, fmt, TOK, SFTDataConfig(**data), loss_on)
    assert len(ex.input_ids) == len(ex.loss_mask)
    return [(t, bool(m)) for t, m in zip(TOK.convert_ids_to_tokens(ex.input_ids), ex.loss_mask)]


def trained(pairs):
    return "".join(t for t, m in pairs if m)


def test_plain_prompt_completion_counts_the_completion_and_eos():
    pairs = tokens({"prompt": "1+2=", "completion": "3"}, "prompt_completion", template="plain")
    assert pairs == [("1", 0), ("+", 0), ("2", 0), ("=", 0), ("3", 1), ("<eos>", 1)]


def test_r1_zero_prompt_is_rendered_as_grpokit_train_renders_it():
    pairs = tokens({"prompt": "1+2", "completion": "3</think>"}, "prompt_completion", template="r1_zero")
    # the completion continues after the template's "<think>"; the prompt part is untrained
    assert trained(pairs) == "3</think><eos>"
    assert pairs[-4][0] == "<think>" and not pairs[-4][1]


def test_chat_prompt_completion_counts_the_assistant_turn_with_its_end_token():
    pairs = tokens({"prompt": "1+2", "completion": "3"}, "prompt_completion", template="chat")
    assert pairs == [
        ("<bos>", 0),
        ("<|user|>", 0),
        ("1", 0),
        ("+", 0),
        ("2", 0),
        ("<|assistant|>", 0),
        ("3", 1),
        ("<eos>", 1),
    ]


def test_messages_count_every_assistant_turn_and_nothing_else():
    row = {
        "messages": [
            {"role": "user", "content": "ab"},
            {"role": "assistant", "content": "c"},
            {"role": "user", "content": "d"},
            {"role": "assistant", "content": "ef"},
        ]
    }
    pairs = tokens(row, "messages")
    assert pairs == [
        ("<bos>", 0), ("<|user|>", 0), ("a", 0), ("b", 0), ("<|assistant|>", 0), ("c", 1), ("<eos>", 1),
        ("<|user|>", 0), ("d", 0), ("<|assistant|>", 0), ("e", 1), ("f", 1), ("<eos>", 1),
    ]  # fmt: skip


def test_prompt_messages_with_an_assistant_turn_train_only_the_completion():
    prompt = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
    ]
    completion = [{"role": "assistant", "content": "d"}]
    pairs = tokens({"prompt": prompt, "completion": completion}, "prompt_completion")
    assert trained(pairs) == "d<eos>"  # the few-shot assistant turn "b" in the prompt is not trained


def test_system_prompt_is_prepended_untrained():
    pairs = tokens(
        {"prompt": "a", "completion": "b"}, "prompt_completion", template="plain", system_prompt="s"
    )
    assert pairs == [("s", 0), ("Ċ", 0), ("Ċ", 0), ("a", 0), ("b", 1), ("<eos>", 1)]


def test_text_counts_every_token_but_the_first():
    assert tokens({"text": "ab c"}, "text") == [("a", 0), ("b", 1), ("Ġ", 1), ("c", 1), ("<eos>", 1)]


def test_loss_on_all_counts_the_prompt_too():
    pairs = tokens(
        {"prompt": "1+2=", "completion": "3"}, "prompt_completion", loss_on="all", template="plain"
    )
    assert [m for _, m in pairs] == [0, 1, 1, 1, 1, 1]


def test_template_auto_renders_string_prompts_as_they_are_and_messages_through_the_chat_template():
    assert trained(tokens({"prompt": "1+2", "completion": "3"}, "prompt_completion")) == "3<eos>"
    assert tokens({"prompt": "1+2", "completion": "3"}, "prompt_completion")[0] == (
        "1",
        0,
    )  # as grpokit train
    messages = {"prompt": [{"role": "user", "content": "1+2"}], "completion": "3"}
    assert tokens(messages, "prompt_completion")[:2] == [("<bos>", 0), ("<|user|>", 0)]


def test_format_is_detected_from_the_columns():
    data = SFTDataConfig()
    assert detect_format([{"messages": []}], data, "f") == "messages"
    assert detect_format([{"prompt": "a", "completion": "b"}], data, "f") == "prompt_completion"
    assert detect_format([{"text": "a"}], data, "f") == "text"
    renamed = SFTDataConfig(prompt_column="question", completion_column="solution")
    assert detect_format([{"question": "a", "solution": "b"}], renamed, "f") == "prompt_completion"
    with pytest.raises(DataError, match=r"f, row index 0: columns \['question'\] match no SFT format"):
        detect_format([{"question": "a"}], data, "f")


def test_collate_padded_and_packed():
    a, b = encode_examples(
        [{"text": "abc"}, {"text": "d"}], TOK, SFTDataConfig(), "auto", "f"
    )  # 4 and 2 tokens
    padded = collate([a, b], pad_token_id=0, packing=False)
    assert padded["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert padded["loss_mask"].tolist() == [[0, 1, 1, 1], [0, 1, 0, 0]]
    assert padded["input_ids"][1, 2:].tolist() == [0, 0]
    packed = collate([a, b], pad_token_id=0, packing=True)
    assert packed["attention_mask"] is None
    assert packed["position_ids"].tolist() == [[0, 1, 2, 3, 0, 1]]
    assert packed["loss_mask"].tolist() == [[0, 1, 1, 1, 0, 1]]  # nothing predicted across the boundary
    assert torch.equal(packed["input_ids"][0], torch.tensor(a.input_ids + b.input_ids))


def test_eval_prompts_of_messages_rows_stop_before_the_last_assistant_turn():
    rows = [
        {
            "messages": [{"role": "user", "content": "1+2"}, {"role": "assistant", "content": "3"}],
            "answer": "3",
        }
    ]
    assert prompt_rows(rows, SFTDataConfig(), "f") == [
        {"answer": "3", "prompt": [{"role": "user", "content": "1+2"}]}
    ]
    with pytest.raises(DataError, match="text rows have no prompt"):
        prompt_rows([{"text": "a"}], SFTDataConfig(), "f")


@pytest.mark.parametrize(
    "rows, data, loss_on, message",
    [
        ([{"prompt": "a", "completion": "b"}, {"prompt": "a"}], {}, "auto",
         r"f, row index 1: no 'completion' field \(this row has \['prompt'\]\)"),
        ([{"prompt": "a", "completion": ""}], {}, "auto", "f, row index 0: 'completion' must be a non-empty string"),
        ([{"prompt": "", "completion": "b"}], {}, "auto", "f, row index 0: 'prompt' is an empty string"),
        ([{"messages": [{"role": "user", "content": "a"}]}], {}, "auto", "f, row index 0: 'messages' has no assistant message"),
        ([{"messages": [{"role": "bot", "content": "a"}]}], {}, "auto", "f, row index 0: 'messages' message 0 has role 'bot'"),
        ([{"messages": [{"role": "assistant", "content": "a"}]}], {}, "auto", "f, row index 0: message 0 is the assistant's"),
        ([{"text": "abc"}], {}, "completion", "f, row index 0: text rows have no completion"),
        ([{"text": "abcdef"}], {"max_length": 4}, "auto",
         "f, row index 0: 7 tokens, more than data.max_length=4; .* data.truncate=true"),
        ([{"prompt": "abcd", "completion": "e"}], {"max_length": 4, "truncate": True, "template": "plain"}, "auto",
         "f, row index 0: no token is trained on within data.max_length=4"),
    ],
)  # fmt: skip
def test_bad_rows_are_named(rows, data, loss_on, message):
    with pytest.raises(DataError, match=message):
        encode_examples(rows, TOK, SFTDataConfig(**data), loss_on, "f")


def test_truncate_cuts_on_the_right():
    (ex,) = encode_examples(
        [{"text": "abcdef"}], TOK, SFTDataConfig(max_length=4, truncate=True), "auto", "f"
    )
    assert TOK.convert_ids_to_tokens(ex.input_ids) == ["a", "b", "c", "d"] and ex.loss_mask == [0, 1, 1, 1]


def test_messages_need_a_chat_template():
    plain = make_tiny_tokenizer()
    plain.chat_template = None
    rows = [{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}]
    with pytest.raises(
        DataError, match="f, row index 0: chat messages need a tokenizer with a chat template"
    ):
        encode_examples(rows, plain, SFTDataConfig(), "auto", "f")


def test_rows_load_from_a_file_and_a_non_object_row_is_named(tmp_path):
    path = tmp_path / "sft.jsonl"
    path.write_text(json.dumps({"text": "a"}) + "\n" + json.dumps(["not", "a", "row"]) + "\n")
    with pytest.raises(DataError, match=r"sft.jsonl, line 2: expected an object \(a row\), got a list"):
        load_sft_rows(SFTDataConfig(train=str(path)))


def test_config_keys_that_do_not_apply_are_refused():
    cfg = load_sft_config(None, ["data.train=x.jsonl"])
    assert cfg.optim.lr == 2e-5 and cfg.train.output_dir == "runs/sft" and cfg.sft.loss_on == "auto"
    from grpokit.config.schema import ConfigError

    with pytest.raises(ConfigError, match=r"optim.epochs=2 does not apply to grpokit sft"):
        load_sft_config(None, ["optim.epochs=2"])
    with pytest.raises(ConfigError, match=r"unknown config key 'rollout'"):
        load_sft_config(None, ["rollout.group_size=4"])
    with pytest.raises(ConfigError, match=r"sft.loss_on='assistant' is not one of"):
        load_sft_config(None, ["sft.loss_on=assistant"])


@pytest.mark.parametrize(
    "override, message",
    [
        ("model.device=gpu", r"model.device='gpu' is not a device"),
        ("train.seed=-1", r"train.seed=-1 is out of range"),
        ("optim.precision=bf16", r"optim.precision='bf16' is not one of"),
        ("train.report_to=comet", r"train.report_to='comet' is not one of"),
    ],
)
def test_the_shared_sections_are_checked_as_for_grpokit_train(override, message):
    """grpokit sft and grpokit train check model/optim/train from the same declarations (grpokit.config.declare.check_tree)."""
    from grpokit.config.schema import ConfigError, load_config

    for load in (load_sft_config, load_config):
        with pytest.raises(ConfigError, match=message):
            load(None, [override])
