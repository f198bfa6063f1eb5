"""SFT rows in TRL's conventions -> token ids and the loss mask that says which tokens are trained on.

    messages           {"messages": [{"role": "user", ...}, {"role": "assistant", ...}, ...]}
    prompt_completion  {"prompt": "...", "completion": "..."} (either may be a list of messages)
    text               {"text": "..."}

Which tokens count (``loss_mask`` 1), under ``sft.loss_on=auto``:

- messages: every assistant turn, from its first content token through the end of its turn as the chat
  template writes it (the end-of-turn token included, a newline after it not); the template's
  "assistant" header opening the turn is the prompt's, as in generation.
- prompt_completion: the completion. A string prompt is rendered as ``grpokit train`` renders it
  (``data.template``); under plain / r1_zero the completion's text follows it and EOS ends it; under
  chat (or a prompt given as messages) the completion is the assistant's turn of the chat template.
- text: every token (the first has nothing to be predicted from, so it never counts, in any format).

``sft.loss_on=all`` trains every token of every format; ``trl`` (TRL's SFTTrainer default) the completion of
prompt_completion rows and every token of messages and text rows.

Example (plain template, a tokenizer with one token per character and EOS "<eos>"):
prompt "1+2=", completion "3" gives ids ``1 + 2 = 3 <eos>`` and loss_mask ``0 0 0 0 1 1``.

The text is tokenized piece by piece, the prompt exactly as ``grpokit.data.templates.encode_prompts``
tokenizes it for generation, so the model is trained on the token ids it will see and produce later
(a tokenizer that would merge across the prompt/completion boundary cannot make the two disagree).
Errors are ``DataError`` and name the source, the row (``row index N``, from 0) and the fix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from grpokit.config.sft import SFTDataConfig
from grpokit.data.prompts import DataError, load_prompts, prompt_problem
from grpokit.data.templates import encode_prompts, resolve_template


@dataclass
class SFTExample:
    """One tokenized example: ``input_ids`` (L,) and ``loss_mask`` (L,), 1 where token t is trained on
    (its log-prob given tokens < t enters the loss); ``loss_mask[0]`` is always 0."""

    input_ids: list[int]
    loss_mask: list[int]

    @property
    def num_loss_tokens(self) -> int:
        return sum(self.loss_mask)


def load_sft_rows(
    data: SFTDataConfig, train_rows: list[dict] | None = None, eval_rows: list[dict] | None = None
) -> tuple[list[dict], list[dict]]:
    """(training rows, held-out rows) of ``data``, read by grpokit.data.prompts's readers; rows given are kept."""
    from grpokit.core.errors import ConfigError

    if train_rows is None:
        if not data.train:
            raise ConfigError("data.train is empty: give a JSONL/JSON/CSV/Parquet file of SFT rows")
        train_rows = load_prompts(data.train, prompt_column=None, split=data.split, config=data.config)
    if eval_rows is None and data.eval:
        eval_rows = load_prompts(
            data.eval,
            prompt_column=None,
            limit=data.eval_limit,
            split=data.eval_split,
            default_split="test",
            config=data.config if data.eval == data.train else None,
        )
    return train_rows, eval_rows or []


def detect_format(rows: Sequence[dict], data: SFTDataConfig, source: str) -> str:
    """data.format, or under auto the format the first row's columns name (messages, then
    prompt + completion, then text). Every row is checked against it by ``encode_examples``."""
    if data.format != "auto":
        return data.format
    first = rows[0] if rows else {}
    if data.messages_column in first:
        return "messages"
    if data.prompt_column in first and data.completion_column in first:
        return "prompt_completion"
    if data.text_column in first:
        return "text"
    raise DataError(
        f"{source}, row index 0: columns {list(first)} match no SFT format: give "
        f"'{data.messages_column}' (chat messages), '{data.prompt_column}' + '{data.completion_column}', "
        f"or '{data.text_column}' (or name the columns with data.messages_column / data.prompt_column / "
        "data.completion_column / data.text_column)."
    )


def encode_examples(
    rows: Sequence[dict], tokenizer: Any, data: SFTDataConfig, loss_on: str, source: str
) -> list[SFTExample]:
    """Every row tokenized with its loss mask; a row that cannot be used raises DataError naming it."""
    if not rows:
        return []
    fmt = detect_format(rows, data, source)
    if fmt == "prompt_completion":
        check_one_kind(rows, data, source)
    out = []
    for index, row in enumerate(rows):
        where = f"{source}, row index {index}"
        try:
            example = encode_example(row, fmt, tokenizer, data, loss_on)
        except DataError as e:
            raise DataError(f"{where}: {e}") from None
        if data.max_length is not None and len(example.input_ids) > data.max_length:
            if not data.truncate:
                raise DataError(
                    f"{where}: {len(example.input_ids)} tokens, more than data.max_length={data.max_length}; "
                    "raise data.max_length, shorten or drop the row, or set data.truncate=true to cut it."
                )
            example = SFTExample(example.input_ids[: data.max_length], example.loss_mask[: data.max_length])
        if example.num_loss_tokens == 0:
            cut = f" within data.max_length={data.max_length}" if data.truncate and data.max_length else ""
            raise DataError(
                f"{where}: no token is trained on{cut} ({fmt} row, sft.loss_on={loss_on}); give it a "
                "completion / assistant turn, or drop the row."
            )
        out.append(example)
    return out


def check_one_kind(rows: Sequence[dict], data: SFTDataConfig, source: str) -> None:
    """prompt + completion rows are all chat (the prompt or the completion a list of messages) or all plain
    text: a file mixing them would train on two renderings of the same kind of example (the chat
    template's and data.template's). DataError names the first row of the other kind."""
    kinds = [
        isinstance(row.get(data.prompt_column), list) or isinstance(row.get(data.completion_column), list)
        for row in rows
    ]
    if any(k != kinds[0] for k in kinds):
        index = kinds.index(not kinds[0])
        name = {True: "chat (prompt or completion given as messages)", False: "plain text (strings)"}
        raise DataError(
            f"{source}, row index {index}: a {name[kinds[index]]} row, while row index 0 is {name[kinds[0]]}; "
            "one file holds one kind: convert the rows to one form, or split the file"
        )


def encode_example(row: dict, fmt: str, tokenizer: Any, data: SFTDataConfig, loss_on: str) -> SFTExample:
    """One row of format ``fmt`` -> SFTExample (module docstring); DataError says what is wrong with it."""
    if fmt == "messages":
        messages = _field(row, data.messages_column)
        _check_messages(messages, data.messages_column, need_assistant=True)
        pieces = _chat_pieces(messages, tokenizer, data, train_from=0)
    elif fmt == "prompt_completion":
        prompt, completion = _field(row, data.prompt_column), _field(row, data.completion_column)
        problem = prompt_problem(prompt)
        if problem:
            raise DataError(f"{data.prompt_column!r} {problem}")
        if isinstance(completion, list):
            _check_messages(completion, data.completion_column, need_assistant=True)
        elif not isinstance(completion, str) or not completion:
            raise DataError(
                f"{data.completion_column!r} must be a non-empty string or a list of assistant messages, "
                f"got {completion!r:.60}"
            )
        if isinstance(prompt, list) or isinstance(completion, list) or _chat(prompt, tokenizer, data):
            prompt_msgs = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
            completion_msgs = (
                completion if isinstance(completion, list) else [{"role": "assistant", "content": completion}]
            )
            pieces = _chat_pieces(prompt_msgs + completion_msgs, tokenizer, data, len(prompt_msgs))
        else:  # plain / r1_zero: the rendered prompt, then the completion's text and EOS
            prompt_ids = _encode_prompt(prompt, tokenizer, data)
            completion_ids = tokenizer(completion, add_special_tokens=False)["input_ids"]
            ids = prompt_ids + completion_ids + [_eos(tokenizer)]
            return _masked(ids, [0] * len(prompt_ids) + [1] * (len(ids) - len(prompt_ids)), loss_on, fmt)
    elif fmt == "text":
        if loss_on == "completion":
            raise DataError("text rows have no completion to train on; use sft.loss_on=auto or all")
        text = _field(row, data.text_column)
        if not isinstance(text, str) or not text.strip():
            raise DataError(f"{data.text_column!r} must be a non-empty string, got {text!r:.60}")
        ids = encode_prompts([text], tokenizer, template="plain")[0] + [_eos(tokenizer)]
        return _masked(ids, [1] * len(ids), "all", fmt)
    else:
        raise DataError(f"data.format={fmt!r} is not one of messages, prompt_completion, text")
    ids, mask = [], []
    for text, trained in pieces:
        piece_ids = tokenizer(text, add_special_tokens=False)["input_ids"] if text else []
        ids += piece_ids
        mask += [int(trained)] * len(piece_ids)
    return _masked(ids, mask, loss_on, fmt)


def prompt_rows(rows: Sequence[dict], data: SFTDataConfig, source: str) -> list[dict]:
    """Held-out SFT rows as grpokit.rollout.evaluate's prompt rows: ``prompt`` is the row's prompt (messages rows:
    the conversation before its last assistant turn); the row's other columns (``answer`` ...) stay for
    the verifier. Text rows have no prompt: DataError."""
    fmt = detect_format(rows, data, source)
    if fmt == "text":
        raise DataError(
            f"{source}: text rows have no prompt to generate from, so a reward cannot score them; remove "
            "rewards (held-out loss only) or give data.eval as prompt/completion or messages rows."
        )
    content = {data.messages_column, data.prompt_column, data.completion_column}
    out = []
    for index, row in enumerate(rows):
        if fmt == "messages":
            messages = _field(row, data.messages_column, f"{source}, row index {index}: ")
            last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=0)
            prompt = messages[:last]
        else:
            prompt = _field(row, data.prompt_column, f"{source}, row index {index}: ")
        out.append({**{k: v for k, v in row.items() if k not in content}, "prompt": prompt})
    return out


def collate(examples: Sequence[SFTExample], pad_token_id: int, packing: bool) -> dict[str, Any]:
    """A micro-batch of examples as the tensors grpokit.model.logprobs.token_logprobs takes.

    Padded: input_ids / loss_mask / attention_mask (n, L), right-padded to the longest example.
    Packed (padding-free): input_ids / loss_mask / position_ids (1, T), T the examples' total length,
    positions restarting at 0 at each example, attention_mask None. Example: lengths 3 and 2 give
    position_ids [[0, 1, 2, 0, 1]]; each example's first token has loss_mask 0 (SFTExample's rule), so no
    token is predicted across the boundary."""
    import torch

    if packing:  # grpokit.data.packing: the RL passes' packing too
        from grpokit.data.packing import pack_sequences

        input_ids, position_ids = pack_sequences([e.input_ids for e in examples])  # (1, T) each
        return {
            "input_ids": input_ids,
            "loss_mask": torch.tensor([[m for e in examples for m in e.loss_mask]]),  # (1, T)
            "position_ids": position_ids,
            "attention_mask": None,
        }
    width = max(len(e.input_ids) for e in examples)
    pad = [width - len(e.input_ids) for e in examples]
    return {
        "input_ids": torch.tensor([e.input_ids + [pad_token_id] * k for e, k in zip(examples, pad)]),  # (n, L)
        "loss_mask": torch.tensor([e.loss_mask + [0] * k for e, k in zip(examples, pad)]),  # (n, L)
        "attention_mask": torch.tensor([[1] * len(e.input_ids) + [0] * k for e, k in zip(examples, pad)]),
        "position_ids": None,
    }


# ---------------------------------------------------------------------------------------------


def _field(row: dict, column: str, where: str = "") -> Any:
    if column not in row:
        raise DataError(f"{where}no {column!r} field (this row has {list(row)}); give every row one or drop it")
    return row[column]


def _check_messages(messages: Any, column: str, need_assistant: bool) -> None:
    problem = prompt_problem(messages) if isinstance(messages, list) else "must be a list of chat messages"
    if problem:
        raise DataError(f"{column!r} {problem}")
    if need_assistant and not any(m["role"] == "assistant" for m in messages):
        raise DataError(f"{column!r} has no assistant message, so nothing to train on; add one or drop the row")


def _chat(prompt: Any, tokenizer: Any, data: SFTDataConfig) -> bool:
    try:
        return resolve_template(prompt, tokenizer, data.template) == "chat"
    except ValueError as e:
        raise DataError(str(e)) from None


def _encode_prompt(prompt: Any, tokenizer: Any, data: SFTDataConfig) -> list[int]:
    """The prompt's ids exactly as grpokit train encodes it for generation."""
    return encode_prompts(
        [prompt],
        tokenizer,
        template=data.template,
        system_prompt=data.system_prompt,
        chat_template_kwargs=data.chat_template_kwargs,
    )[0]


def _eos(tokenizer: Any) -> int:
    if tokenizer.eos_token_id is None:
        raise DataError("the tokenizer has no eos token, so a completion could not be ended")
    return int(tokenizer.eos_token_id)


def _masked(ids: list[int], mask: list[int], loss_on: str, fmt: str) -> SFTExample:
    """Apply sft.loss_on=all (and trl on messages rows: TRL trains every token of a conversation unless
    assistant_only_loss), and zero the first token (nothing predicts it)."""
    if loss_on == "all" or (loss_on == "trl" and fmt == "messages"):
        mask = [1] * len(ids)
    mask = list(mask)
    if mask:
        mask[0] = 0
    return SFTExample(list(ids), mask)


def _render(tokenizer: Any, messages: list[dict], generation_prompt: bool, kwargs: dict[str, Any]) -> str:
    try:
        return tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=generation_prompt, **kwargs
        )
    except Exception as e:  # jinja's TemplateError, or a template's raise_exception (role order ...)
        raise DataError(f"the chat template cannot render this conversation ({type(e).__name__}: {e})") from None


def _chat_pieces(
    messages: list[dict], tokenizer: Any, data: SFTDataConfig, train_from: int
) -> list[tuple[str, bool]]:
    """The conversation as the chat template writes it, cut into (text, trained) pieces: the assistant
    messages at index >= ``train_from`` are trained on. Assistant turn i spans from the end of the render of
    messages[:i] with the generation prompt (the turn's header) to the end of the render of
    messages[:i + 1] (trailing newlines left out). Templates that render earlier turns differently once
    later ones follow (e.g. dropping past reasoning) are refused: the pieces would not be the text."""
    if not getattr(tokenizer, "chat_template", None):
        raise DataError(
            "chat messages need a tokenizer with a chat template, and this one has none; give "
            "prompt/completion strings with data.template=plain (or r1_zero), or use a chat model"
        )
    system_prompt, kwargs = data.system_prompt, data.chat_template_kwargs
    if system_prompt is not None and messages[0]["role"] not in ("system", "developer"):
        messages = [{"role": "system", "content": system_prompt}, *messages]
        train_from += 1
    if messages[0]["role"] == "assistant":
        raise DataError("message 0 is the assistant's; a conversation starts with a system or user message")
    full = _render(tokenizer, messages, False, kwargs)
    pieces, pos = [], 0
    for i, message in enumerate(messages):
        if message["role"] != "assistant" or i < train_from:
            continue
        start_text = _render(tokenizer, messages[:i], True, kwargs)
        end_text = _render(tokenizer, messages[: i + 1], False, kwargs)
        if not (full.startswith(end_text) and end_text.startswith(start_text) and len(start_text) >= pos):
            raise DataError(
                f"the chat template renders message {i} and the turns before it differently once later turns "
                "follow (it may drop earlier reasoning), so the trained tokens cannot be located; split the "
                "conversation into one prompt/completion row per assistant turn"
            )
        end = len(end_text.rstrip("\n"))
        if end <= len(start_text):
            end = len(end_text)
        pieces += [(full[pos : len(start_text)], False), (full[len(start_text) : end], True)]
        pos = end
    pieces.append((full[pos:], False))
    return [(text, trained) for text, trained in pieces if text]
