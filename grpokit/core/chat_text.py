"""Chat messages tokenized with their text as data: what a model, a tool, an environment or a data set wrote
is encoded as plain text, so that "<|im_end|>\\n<|im_start|>user" inside a message is characters, never the
template's turn boundaries (ALGORITHMS.md sec. 11).

The chat template is rendered with each message's string fields (content, name, ...) replaced by
sentinels; the template's own text between them is tokenized as usual (its special tokens are
structure), each field's text on its own with ``split_special_tokens=True`` (its special-token strings are
split into ordinary tokens). The template never sees the real text, so nothing in it can change how the
template renders (a template that branches on a message's content renders it as for any other text).

    pieces = render_pieces(tokenizer, [{"role": "tool", "content": "42<|im_end|>"}], add_generation_prompt=True)
    ids = encode_pieces(tokenizer, pieces)    # "<|im_start|>tool\\n" ids + plain-text ids of "42<|im_end|>" + ...

Pieces are (text, is_data) pairs. Each piece is tokenized on its own, so a field's first token never
merges with the template's text before it (the ids are the record, as sampled ids are: ALGORITHMS.md sec. 11).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

_SENTINEL = "GRPOKITFIELD{}XSENTINEL"
_FIND = re.compile(r"GRPOKITFIELD(\d+)XSENTINEL")


def clean_text(text: str) -> str:
    """``text`` with what UTF-8 cannot encode (lone surrogates such as "\\ud800") replaced by U+FFFD: the
    tokenizer, the transcript files and the logs all need valid Unicode."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def cut_text(text: str, max_chars: int) -> str:
    """``text`` cut to ``max_chars`` characters with a note of how many were left out."""
    if len(text) <= max_chars:
        return text
    return text[:max_chars] + f"... [cut: {len(text) - max_chars} more characters]"


def render_pieces(
    tokenizer, messages: Sequence[dict], *, tools: list | None = None, **template_kwargs
) -> list[tuple[str, bool]]:
    """The chat template's rendering of ``messages`` as (text, is_data) pieces: the template's own text
    (is_data False) and each message's string fields other than the role (is_data True, the field's real
    text). ``template_kwargs`` go to ``apply_chat_template`` (add_generation_prompt, continue_final_message).
    ValueError when the template does not render a message's content verbatim."""
    values: list[str] = []
    contents: set[int] = set()  # the values that are a message's content: the template must render them
    masked = []
    for m in messages:
        out = {}
        for key, value in m.items():
            if key != "role" and isinstance(value, str):
                out[key] = _SENTINEL.format(len(values))
                if key == "content":
                    contents.add(len(values))
                values.append(value)
            else:
                out[key] = value
        masked.append(out)
    text = tokenizer.apply_chat_template(masked, tools=tools, tokenize=False, **template_kwargs)
    pieces: list[tuple[str, bool]] = []
    at = 0
    for match in _FIND.finditer(text):
        k = int(match.group(1))
        if k >= len(values):  # not one of ours (the template's own text cannot hold one, but be exact)
            continue
        if match.start() > at:
            pieces.append((text[at : match.start()], False))
        pieces.append((values[k], True))
        contents.discard(k)
        at = match.end()
    if at < len(text):
        pieces.append((text[at:], False))
    if contents:
        raise ValueError(
            "the chat template does not render a message's content as given (it drops or changes it, e.g. "
            "with | lower or a slice), so it cannot be encoded as plain text; render message['content'] as is"
        )
    return pieces


def pieces_text(pieces: Sequence[tuple[str, bool]]) -> str:
    return "".join(text for text, _ in pieces)


def encode_pieces(tokenizer, pieces: Sequence[tuple[str, bool]]) -> list[int]:
    """Token ids of the pieces: the template's text with its special tokens, data as plain text."""
    ids: list[int] = []
    for text, is_data in pieces:
        if text:
            ids += encode_text(tokenizer, text, plain=is_data)
    return ids


def encode_text(tokenizer, text: str, *, plain: bool) -> list[int]:
    """Ids of ``text`` without BOS/EOS; ``plain``: special-token strings in it are split into ordinary tokens."""
    text = clean_text(text)
    if plain:
        return list(tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def encode_pieces_with_offsets(
    tokenizer, pieces: Sequence[tuple[str, bool]], add_special_tokens: bool = False
) -> tuple[list[int], list[tuple[int, int]]]:
    """:func:`encode_pieces` with each token's (start, end) characters in the pieces' joined text (a fast
    tokenizer's offset mapping, piece by piece); ``add_special_tokens``: the tokenizer's own BOS/EOS around
    them, at (0, 0), as ``tokenizer(text)`` adds them."""
    ids: list[int] = []
    offsets: list[tuple[int, int]] = []
    at = 0
    for text, is_data in pieces:
        text = clean_text(text)
        if text:
            enc = tokenizer(
                text, add_special_tokens=False, split_special_tokens=is_data, return_offsets_mapping=True
            )
            ids += list(enc["input_ids"])
            offsets += [(at + s, at + e) for s, e in enc["offset_mapping"]]
        at += len(text)
    if add_special_tokens:
        probe = list(tokenizer("a", add_special_tokens=False)["input_ids"])
        full = list(tokenizer("a", add_special_tokens=True)["input_ids"])
        k = next((k for k in range(len(full)) if full[k : k + len(probe)] == probe), 0)
        before, after = full[:k], full[k + len(probe) :]
        ids = before + ids + after
        offsets = [(0, 0)] * len(before) + offsets + [(0, 0)] * len(after)
    return ids, offsets
