"""model.disable_dropout (TRL's disable_dropout): with dropout in the model (a Qwen2 whose attention drops 50%,
a LoRA adapter dropping 30%), a training-mode forward is random and differs from the sampler's eval-mode one;
with the setting every dropout is 0 and the two agree. TRL's own disable_dropout_in_model leaves the attention's
dropout on (a float, not a torch.nn.Dropout): the same model through it still differs."""

from __future__ import annotations

import pytest
import torch
from tiny_model import make_tiny_model

from grpokit.config.schema import load_config
from grpokit.config.trl import from_trl
from grpokit.train.learner import load_model


def dropping_model():
    model, tok = make_tiny_model("qwen2", seed=0)
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = 0.5  # what Qwen2Config(attention_dropout=0.5) builds
    return model, tok


def train_and_eval_logits(model, ids):
    model.train()
    with torch.no_grad():
        first, second = model(ids).logits, model(ids).logits
        model.eval()
        evaluated = model(ids).logits
    return first, second, evaluated


@pytest.mark.parametrize("disable", [False, True])
def test_disable_dropout_makes_the_training_forward_the_sampling_one(disable):
    model, tok = dropping_model()
    cfg = load_config(None, ["model.device=cpu", "lora.enabled=true", "lora.dropout=0.3",
                             f"model.disable_dropout={str(disable).lower()}"])  # fmt: skip
    model, _, _, _ = load_model(cfg, model, tok)
    ids = torch.tensor([[1, 5, 9, 13, 17, 21, 25, 29]])
    torch.manual_seed(0)
    first, second, evaluated = train_and_eval_logits(model, ids)
    drops = [m.p for m in model.modules() if isinstance(m, torch.nn.Dropout)]
    assert drops and all((p == 0.0) == disable for p in drops)  # LoRA's dropouts
    if disable:
        torch.testing.assert_close(first, evaluated, rtol=0, atol=1e-6)
        torch.testing.assert_close(second, evaluated, rtol=0, atol=1e-6)
    else:
        assert float((first - second).abs().max()) > 1e-3 and float((first - evaluated).abs().max()) > 1e-3


def test_trls_disable_dropout_in_model_leaves_the_attention_dropout_on_and_the_field_maps():
    trl = pytest.importorskip("trl")
    model, _ = dropping_model()
    trl.trainer.utils.disable_dropout_in_model(model)
    torch.manual_seed(0)
    first, _, evaluated = train_and_eval_logits(model, torch.tensor([[1, 5, 9, 13, 17, 21, 25, 29]]))
    assert float((first - evaluated).abs().max()) > 1e-3
    assert from_trl({"disable_dropout": True})[0]["model"]["disable_dropout"] is True
    assert "disable_dropout" not in from_trl({})[0].get("model", {})
