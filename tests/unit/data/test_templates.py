"""grpokit.data.templates with tiny word-level tokenizers built, saved and reloaded locally.

Token ids are pinned by the vocabulary below: <s>=1, <|im_start|>=3, <|im_end|>=4, user=6, ...
"""

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from grpokit.data.prompts import DataError
from grpokit.data.templates import R1_ZERO_TEMPLATE, TEMPLATES, encode_prompts, render_prompt

VOCAB = [
    "<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>",  # 0-4
    "system", "user", "assistant",  # 5-7
    "What", "is", "2", "+", "?",  # 8-12
    "Be", "brief", ".", "Let", "me", "think",  # 13-18
]  # fmt: skip
IDS = {word: i for i, word in enumerate(VOCAB)}

# Qwen-style markup; the Llama-style variant writes BOS first, as Llama 3's template does.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
QUESTION = "What is 2 + 2?"
QUESTION_IDS = [IDS[w] for w in ("What", "is", "2", "+", "2", "?")]  # [8, 9, 10, 11, 10, 12]


def build_tokenizer(folder, *, adds="", chat_template=None):
    """A WordLevel tokenizer over VOCAB whose default encoding is `adds` around the text:
    "" adds nothing (Qwen), "bos" adds <s> first (Llama), "bos+eos" also appends </s>."""
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(VOCAB)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    single = {"": "$A", "bos": "<s> $A", "bos+eos": "<s> $A </s>"}[adds]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=single, special_tokens=[("<s>", 1), ("</s>", 2)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )
    if chat_template is not None:
        fast.chat_template = chat_template
    fast.save_pretrained(folder)
    return PreTrainedTokenizerFast.from_pretrained(folder)


@pytest.fixture(scope="module")
def qwen_chat(tmp_path_factory):
    return build_tokenizer(tmp_path_factory.mktemp("qwen_chat"), chat_template=CHAT_TEMPLATE)


@pytest.fixture(scope="module")
def llama_chat(tmp_path_factory):
    return build_tokenizer(
        tmp_path_factory.mktemp("llama_chat"), adds="bos", chat_template="{{ bos_token }}" + CHAT_TEMPLATE
    )


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A base model's tokenizer: no chat template, BOS defined but not added (like Qwen base)."""
    return build_tokenizer(tmp_path_factory.mktemp("base"))


def test_tokenizer_round_trip_keeps_chat_template(qwen_chat):
    assert qwen_chat.chat_template == CHAT_TEMPLATE
    assert qwen_chat(QUESTION, add_special_tokens=False)["input_ids"] == QUESTION_IDS


def test_templates_dict():
    assert sorted(TEMPLATES) == ["chat", "plain", "r1_zero"]


# ---- render_prompt ---------------------------------------------------------------------------


def test_chat_wraps_a_string_as_one_user_message(qwen_chat):
    text = render_prompt(QUESTION, qwen_chat, template="chat")
    assert text == "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n"


def test_chat_with_messages_and_default_system_prompt(qwen_chat):
    messages = [{"role": "user", "content": QUESTION}]
    text = render_prompt(messages, qwen_chat, system_prompt="Be brief.")
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_chat_own_system_message_wins_over_system_prompt(qwen_chat):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": QUESTION}]
    text = render_prompt(messages, qwen_chat, system_prompt="Ignored.")
    assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>\n") and "Ignored" not in text


def test_chat_continues_a_prefilled_assistant_message(qwen_chat):
    messages = [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": "Let me think"}]
    text = render_prompt(messages, qwen_chat)
    assert text == "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\nLet me think"


def test_chat_without_chat_template_says_what_to_pick(base):
    with pytest.raises(ValueError, match="has none; use template 'plain' or 'r1_zero'"):
        render_prompt(QUESTION, base, template="chat")


def test_auto_feeds_a_string_as_is_even_when_the_tokenizer_has_a_chat_template(qwen_chat):
    # TRL's convention (issue 30): only message lists go through the chat template
    assert render_prompt(QUESTION, qwen_chat) == QUESTION
    messages = [{"role": "user", "content": QUESTION}]
    assert render_prompt(messages, qwen_chat) == render_prompt(QUESTION, qwen_chat, template="chat")


def test_auto_picks_plain_for_a_string_without_chat_template(base):
    assert render_prompt(QUESTION, base) == QUESTION


def test_auto_picks_chat_for_messages_even_without_chat_template(base):
    with pytest.raises(ValueError, match="template 'chat' needs a tokenizer with a chat template"):
        render_prompt([{"role": "user", "content": QUESTION}], base)


def test_plain(base):
    assert render_prompt(QUESTION, base, template="plain") == QUESTION
    assert (
        render_prompt(QUESTION, None, template="plain", system_prompt="Be brief.")
        == "Be brief.\n\nWhat is 2 + 2?"
    )


def test_plain_joins_system_and_user_messages(base):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": QUESTION}]
    assert render_prompt(messages, base, template="plain") == "Be brief.\n\nWhat is 2 + 2?"


def test_plain_refuses_assistant_turns(base):
    messages = [{"role": "user", "content": "2 + 2"}, {"role": "assistant", "content": "4"}]
    with pytest.raises(
        DataError, match=r"cannot render a conversation with \['assistant'\] messages.*use template 'chat'"
    ):
        render_prompt(messages, base, template="plain")


def test_r1_zero_exact_text(base):
    assert render_prompt(QUESTION, base, template="r1_zero") == (
        "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. "
        "The assistant first thinks about the reasoning process in the mind and then provides the user with "
        "the answer. The reasoning process and answer are enclosed within <think> </think> and <answer> "
        "</answer> tags, respectively, i.e., <think> reasoning process here </think> <answer> answer here "
        "</answer>. User: What is 2 + 2?. Assistant: <think>"
    )


def test_r1_zero_takes_the_user_message_and_ignores_the_chat_template(qwen_chat):
    text = render_prompt([{"role": "user", "content": "Say {x}"}], qwen_chat, template="r1_zero")
    assert text == R1_ZERO_TEMPLATE.replace("{prompt}", "Say {x}")  # braces in the prompt survive


def test_r1_zero_refuses_system_prompt(base):
    with pytest.raises(ValueError, match="'r1_zero' carries its own instruction"):
        render_prompt(QUESTION, base, template="r1_zero", system_prompt="Be brief.")


def test_unknown_template(base):
    with pytest.raises(
        ValueError, match=r"unknown template 'r1'; choose one of \['auto', 'chat', 'plain', 'r1_zero'\]"
    ):
        render_prompt(QUESTION, base, template="r1")


def test_bad_prompt(base):
    with pytest.raises(DataError, match="the prompt is an empty string"):
        render_prompt("", base)


# ---- encode_prompts --------------------------------------------------------------------------


def test_encode_chat_adds_no_special_tokens_beyond_the_template(qwen_chat):
    (ids,) = encode_prompts([QUESTION], qwen_chat, template="chat")
    # <|im_start|> user What is 2 + 2 ? <|im_end|> <|im_start|> assistant
    assert ids == [3, 6, *QUESTION_IDS, 4, 3, 7]


def test_encode_chat_keeps_a_single_bos(llama_chat):
    (ids,) = encode_prompts([QUESTION], llama_chat, template="chat")
    assert ids == [1, 3, 6, *QUESTION_IDS, 4, 3, 7]  # the template's BOS, not a second one


def test_encode_plain_adds_bos_when_the_tokenizer_does(llama_chat, base):
    assert encode_prompts([QUESTION], llama_chat, template="plain") == [[1, *QUESTION_IDS]]
    assert encode_prompts([QUESTION], base) == [QUESTION_IDS]  # BOS defined, but base never adds it
    assert encode_prompts(["<s> " + QUESTION], llama_chat, template="plain") == [[1, *QUESTION_IDS]]


def test_encode_plain_drops_the_eos_a_tokenizer_appends(tmp_path):
    tokenizer = build_tokenizer(tmp_path, adds="bos+eos")
    assert tokenizer(QUESTION)["input_ids"] == [1, *QUESTION_IDS, 2]
    assert encode_prompts([QUESTION], tokenizer, template="plain") == [[1, *QUESTION_IDS]]


def test_encode_r1_zero_matches_tokenizing_the_rendered_text(llama_chat):
    (ids,) = encode_prompts([QUESTION], llama_chat, template="r1_zero")
    text = render_prompt(QUESTION, llama_chat, template="r1_zero")
    assert ids == llama_chat(text)["input_ids"] and ids[0] == 1 and ids.count(1) == 1


def test_encode_mixed_prompts_with_auto(base, qwen_chat):
    prompts = [QUESTION, [{"role": "user", "content": QUESTION}]]
    assert encode_prompts(prompts, qwen_chat) == [QUESTION_IDS, [3, 6, *QUESTION_IDS, 4, 3, 7]]
    assert encode_prompts(prompts, qwen_chat, template="chat") == [[3, 6, *QUESTION_IDS, 4, 3, 7]] * 2
    with pytest.raises(DataError, match=r"d\.jsonl, row index 1: template 'chat' needs a tokenizer"):
        encode_prompts(prompts, base, source="d.jsonl")


def test_encode_too_long_prompt(base):
    prompts = ["2", QUESTION, "2 + 2", QUESTION + " 2"]  # 1, 6, 3 and 7 tokens
    assert [len(ids) for ids in encode_prompts(prompts, base, max_prompt_tokens=7)] == [1, 6, 3, 7]
    with pytest.raises(DataError) as error:
        encode_prompts(prompts, base, max_prompt_tokens=5, source="d.jsonl")
    assert str(error.value) == (
        "d.jsonl, row index 1: the prompt is 6 tokens long, more than max_prompt_tokens=5 (2 of 4 prompts "
        "are too long, the longest 7 tokens); raise data.max_prompt_tokens or shorten the prompt."
    )


def test_encode_rejects_bad_max_prompt_tokens(base):
    with pytest.raises(ValueError, match="max_prompt_tokens must be a positive integer"):
        encode_prompts([QUESTION], base, max_prompt_tokens=0)


def test_encode_empty_list(base):
    assert encode_prompts([], base) == []


def test_chat_template_kwargs_reach_the_template(qwen_chat):
    messages = [{"role": "user", "content": QUESTION}]
    kept, qwen_chat.chat_template = qwen_chat.chat_template, "{{ flag }}|{{ messages[0]['content'] }}"
    try:
        assert render_prompt(messages, qwen_chat, chat_template_kwargs={"flag": "no-think"}) == "no-think|" + QUESTION
    finally:
        qwen_chat.chat_template = kept


def test_the_template_used_is_said():
    from grpokit.data.templates import describe_templates

    said = describe_templates([QUESTION, QUESTION, [{"role": "user", "content": QUESTION}]])
    assert "2 string prompt(s) fed as is (plain), 1 message list(s) through the tokenizer's chat template" in said
