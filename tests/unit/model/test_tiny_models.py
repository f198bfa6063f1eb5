"""The shared tiny test model: builds offline, round-trips through save_pretrained / Auto* loading."""

import pytest
import torch
from tiny_model import make_tiny_model, save_tiny_model
from transformers import AutoModelForCausalLM, AutoTokenizer

TEXT = "what is 12+3?\nthe answer is #### 15"


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_tiny_model_round_trip(tmp_path, arch):
    model, tok = make_tiny_model(arch, seed=0)
    assert (tok.pad_token_id, tok.eos_token_id, tok.bos_token_id) == (0, 1, 2)
    assert model.config.pad_token_id == tok.pad_token_id and model.config.eos_token_id == tok.eos_token_id
    assert len(tok) == model.config.vocab_size == 64
    ids = tok(TEXT)["input_ids"]
    assert tok.decode(ids) == TEXT  # one token per character, lossless on this alphabet
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "1+2?"}], add_generation_prompt=True, tokenize=False
    )
    assert chat == "<bos><|user|>1+2?<|assistant|>"
    assert tok(chat)["input_ids"] == [2, 4, 11, 20, 12, 27, 5]

    save_tiny_model(tmp_path, arch, seed=0)
    model2 = AutoModelForCausalLM.from_pretrained(tmp_path)
    tok2 = AutoTokenizer.from_pretrained(tmp_path)
    assert tok2(TEXT)["input_ids"] == ids and tok2(chat)["input_ids"] == tok(chat)["input_ids"]
    assert tok2.decode(ids) == TEXT and tok2.pad_token_id == 0 and tok2.eos_token_id == 1
    assert tok2.padding_side == "left"
    x = torch.tensor([ids])
    with torch.no_grad():
        torch.testing.assert_close(model2(x).logits, model(x).logits, rtol=0, atol=0)


def test_tiny_model_seed_is_deterministic_and_isolated():
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a, _ = make_tiny_model("qwen2", seed=7)
    after = torch.rand(1)
    b, _ = make_tiny_model("qwen2", seed=7)
    c, _ = make_tiny_model("qwen2", seed=8)
    assert torch.equal(before, after)  # the global RNG is untouched
    assert torch.equal(a.lm_head.weight, b.lm_head.weight)
    assert not torch.equal(a.lm_head.weight, c.lm_head.weight)
