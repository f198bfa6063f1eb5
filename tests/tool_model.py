"""The tiny Qwen2 made to end its turns early, and a chat template that renders tools and tool results:
the model of the multi-turn tests."""

import torch
from tiny_model import make_tiny_model

TOOLS_TEMPLATE = (
    "{% if tools %}<|user|>tools: {% for t in tools %}{{ t['function']['name'] }} {% endfor %}{% endif %}"
    "{% for m in messages %}{% if m['role'] == 'user' %}<|user|>{{ m['content'] }}"
    "{% elif m['role'] == 'tool' %}<|user|>result: {{ m['content'] }}"
    "{% else %}<|assistant|>{{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def tool_model(seed: int = 0):
    """The tiny Qwen2 with its EOS row scaled up, so that sampled turns end after 4-13 tokens."""
    model, tok = make_tiny_model("qwen2", seed=seed)
    with torch.no_grad():
        model.lm_head.weight[tok.eos_token_id] *= 3.0
    tok.chat_template = TOOLS_TEMPLATE
    return model, tok
