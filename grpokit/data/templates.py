"""Prompt templates: how a dataset prompt becomes the text the policy continues.

``TEMPLATES`` maps a name to a function ``(prompt, tokenizer, system_prompt) -> str``:

    chat     the tokenizer's chat template with the assistant's turn opened
             (``add_generation_prompt=True``); a string prompt becomes one user message.
    plain    the prompt text as is.
    r1_zero  DeepSeek-R1-Zero's template (DeepSeek-AI 2025, Table 1), ending in " <think>" as
             in understand-r1-zero, so the model starts inside its reasoning.

``"auto"`` (the default) is TRL's convention: chat for a prompt that is a list of messages, plain
(the text as is) for a string, whether or not the tokenizer has a chat template. (Before issue 30
auto wrapped strings in the chat template too; TRL feeds them as is, and on the same model the two
gave completions of 11 and 46-51 tokens. Say template=chat to wrap strings.)

``chat_template_kwargs`` (TRL's GRPOConfig field of that name, e.g. ``{"enable_thinking": False}``)
are passed to ``apply_chat_template`` under chat.

Messages under plain and r1_zero: a conversation of only system/developer/user messages is
rendered as their contents joined by a blank line; one with assistant or tool turns is refused
(the text would lose who said what): use chat for those.

``system_prompt`` is a default system message. chat prepends it unless the conversation already
starts with its own system (or developer) message, which wins; plain puts it before the prompt
followed by a blank line; r1_zero refuses it, since that template is its own instruction.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from grpokit.data.prompts import DataError, Prompt, prompt_problem

R1_ZERO_TEMPLATE = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. "
    "The assistant first thinks about the reasoning process in the mind and then provides the user with "
    "the answer. The reasoning process and answer are enclosed within <think> </think> and <answer> "
    "</answer> tags, respectively, i.e., <think> reasoning process here </think> <answer> answer here "
    "</answer>. User: {prompt}. Assistant: <think>"
)


def render_chat(
    prompt: Prompt, tokenizer: Any, system_prompt: str | None = None, **chat_template_kwargs: Any
) -> str:
    """Apply the tokenizer's chat template and open the assistant's turn.

    A conversation that ends with an assistant message is continued instead (TRL's convention for
    a prefilled answer such as "Let me solve this step by step.\\n<think>").
    """
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"template 'chat' needs a tokenizer with a chat template, and {type(tokenizer).__name__} "
            f"({getattr(tokenizer, 'name_or_path', '?')}) has none; use template 'plain' or 'r1_zero' "
            "(base models usually have no chat template)."
        )
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    if system_prompt is not None and messages[0]["role"] not in ("system", "developer"):
        messages.insert(0, {"role": "system", "content": system_prompt})
    prefilled = messages[-1]["role"] == "assistant"
    return tokenizer.apply_chat_template(
        messages,
        tokenize=False,
        add_generation_prompt=not prefilled,
        continue_final_message=prefilled,
        **chat_template_kwargs,
    )


def render_plain(prompt: Prompt, tokenizer: Any = None, system_prompt: str | None = None) -> str:
    """The prompt text as is, after ``system_prompt`` and a blank line when one is given."""
    text = _prompt_text(prompt, "plain")
    return text if system_prompt is None else f"{system_prompt}\n\n{text}"


def render_r1_zero(prompt: Prompt, tokenizer: Any = None, system_prompt: str | None = None) -> str:
    """DeepSeek-R1-Zero's template around the prompt text (R1_ZERO_TEMPLATE)."""
    if system_prompt is not None:
        raise ValueError(
            "template 'r1_zero' carries its own instruction, so system_prompt would be ignored; "
            "drop system_prompt or use template 'chat' or 'plain'."
        )
    return R1_ZERO_TEMPLATE.format(prompt=_prompt_text(prompt, "r1_zero"))


TEMPLATES: dict[str, Callable[[Prompt, Any, str | None], str]] = {
    "chat": render_chat,
    "plain": render_plain,
    "r1_zero": render_r1_zero,
}
TEMPLATE_NAMES = ("auto", *TEMPLATES)


def resolve_template(prompt: Prompt, tokenizer: Any, template: str = "auto") -> str:
    """The concrete template name ("chat", "plain" or "r1_zero") used for ``prompt``."""
    if template == "auto":  # TRL's convention: messages get the chat template, strings go as they are
        return "chat" if isinstance(prompt, list) else "plain"
    if template not in TEMPLATES:
        raise ValueError(f"unknown template {template!r}; choose one of {list(TEMPLATE_NAMES)}.")
    return template


def render_prompt(
    prompt: Prompt,
    tokenizer: Any,
    *,
    template: str = "auto",
    system_prompt: str | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> str:
    """Render one prompt (a string or chat messages) to the text the policy continues.

    Example with template="r1_zero" and prompt "What is 2 + 2?":
        "A conversation between User and Assistant. ... User: What is 2 + 2?. Assistant: <think>"
    """
    problem = prompt_problem(prompt)
    if problem is not None:
        raise DataError(f"the prompt {problem}.")
    name = resolve_template(prompt, tokenizer, template)
    if name == "chat":
        return render_chat(prompt, tokenizer, system_prompt, **(chat_template_kwargs or {}))
    return TEMPLATES[name](prompt, tokenizer, system_prompt)


def encode_prompts(
    prompts: Sequence[Prompt],
    tokenizer: Any,
    *,
    template: str = "auto",
    system_prompt: str | None = None,
    max_prompt_tokens: int | None = None,
    source: str | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> list[list[int]]:
    """Render and tokenize each prompt; returns one list of token ids per prompt.

    Special tokens are added once. Chat-rendered text is tokenized with
    ``add_special_tokens=False``, because the chat template writes BOS itself where the model wants
    one. Plain and r1_zero text gets BOS in front when the tokenizer's own encoding starts with BOS
    (as Llama's does and Qwen's does not), and nothing else: an EOS some tokenizers append would
    tell the policy the prompt is already finished.

    Raises DataError naming the first prompt (row index, from 0) longer than ``max_prompt_tokens``;
    ``source`` names the dataset in messages.
    """
    if max_prompt_tokens is not None and max_prompt_tokens < 1:
        raise ValueError(f"max_prompt_tokens must be a positive integer or None, got {max_prompt_tokens!r}")
    where = f"{source}, " if source else ""
    texts, adds_bos = [], []
    for index, prompt in enumerate(prompts):
        try:
            name = resolve_template(prompt, tokenizer, template)
            texts.append(
                render_prompt(
                    prompt, tokenizer, template=name, system_prompt=system_prompt,
                    chat_template_kwargs=chat_template_kwargs,
                )
            )
        except ValueError as e:  # DataError too: say which prompt
            raise DataError(f"{where}row index {index}: {e}") from e
        adds_bos.append(name != "chat")

    bos = _bos_added_by(tokenizer)
    encoded = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
    input_ids = [
        [bos, *ids] if bos is not None and add and ids[:1] != [bos] else list(ids)
        for ids, add in zip(encoded, adds_bos)
    ]

    if max_prompt_tokens is not None:
        too_long = [(i, len(ids)) for i, ids in enumerate(input_ids) if len(ids) > max_prompt_tokens]
        if too_long:
            index, length = too_long[0]
            longest = max(n for _, n in too_long)
            raise DataError(
                f"{where}row index {index}: the prompt is {length} tokens long, more than "
                f"max_prompt_tokens={max_prompt_tokens} ({len(too_long)} of {len(input_ids)} prompts "
                f"are too long, the longest {longest} tokens); raise data.max_prompt_tokens or "
                "shorten the prompt."
            )
    return input_ids


def _bos_added_by(tokenizer: Any) -> int | None:
    """The BOS id when the tokenizer's default encoding starts with it, else None."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        return None
    probe = tokenizer("a", add_special_tokens=True)["input_ids"]
    return bos if probe[:1] == [bos] else None


def _prompt_text(prompt: Prompt, template: str) -> str:
    if isinstance(prompt, str):
        return prompt
    turns = sorted({m["role"] for m in prompt} - {"system", "developer", "user"})
    if turns:
        raise DataError(
            f"template {template!r} cannot render a conversation with {turns} messages without losing "
            "who said what; use template 'chat' or give the prompt as a string."
        )
    return "\n\n".join(m["content"] for m in prompt)


def describe_templates(prompts: Sequence[Prompt], template: str = "auto") -> str:
    """What the run does with its prompts, printed at start: e.g. "template auto: 200 string prompt(s)
    fed as is (plain), 0 message list(s) through the chat template"."""
    n_msgs = sum(isinstance(p, list) for p in prompts)
    n_str = len(prompts) - n_msgs
    if template != "auto":
        return f"template {template}: every prompt ({n_str} string(s), {n_msgs} message list(s))"
    return (
        f"template auto (TRL's convention): {n_str} string prompt(s) fed as is (plain), {n_msgs} message "
        "list(s) through the tokenizer's chat template; data.template=chat wraps strings too"
    )
