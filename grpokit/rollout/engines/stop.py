"""Stop strings (``rollout.stop``): a completion ends at the token whose text completes one of them, as at an EOS.

    stop = StopStrings(("</answer>",), tokenizer)
    rollout = cut_at_stop(rollout, stop, pad_token_id)    # every engine's rollout, in Engine.generate

The end is the first n such that the text of the completion's first n tokens holds a stop string (their text with
special tokens written out, so that an added token such as ``</answer>`` can be one; the rewards' text skips
special tokens); that token is kept (masked 1, its log-prob kept), the rest become padding, and the
row is not truncated. So the text keeps the stop string, as transformers' ``stop_strings`` does (vLLM's
``include_stop_str_in_output=True``); the token that completes it may carry text after it (``">\\n"``), which stays.

What the model drew up to that token does not depend on what it drew after, so cutting afterwards gives exactly the
completion an engine that stopped there would have given. The fast engine also stops drawing for a row whose last
tokens' text holds a stop string (``hit``: the ``window`` last tokens, enough for any stop string's characters);
the vllm engine stops at a stop string that is one token (``token_ids``: vLLM reads no text, it runs without a
tokenizer); otherwise the hf and vllm engines draw on to an EOS or max_new_tokens and are cut here.

Written here rather than taken from transformers' StopStringCriteria: that one works on token ids inside generate()
(the hf engine only) and does not say at which token of a finished row the string ended, which the cut needs.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from grpokit.rollout.engines.base import Rollout


@dataclasses.dataclass(frozen=True, eq=False)
class StopStrings:
    """The stop strings of a rollout and the tokenizer that reads them (rollout.stop)."""

    strings: tuple[str, ...]
    tokenizer: Any

    def __post_init__(self) -> None:
        object.__setattr__(self, "strings", tuple(self.strings))
        if not self.strings or not all(isinstance(s, str) and s for s in self.strings):
            raise ValueError(f"stop strings must be non-empty strings, got {list(self.strings)!r}")

    @classmethod
    def of(cls, strings, tokenizer) -> StopStrings | None:
        """The stop strings of a setting (rollout.stop, sample.stop), or None when it lists none."""
        return cls(tuple(strings), tokenizer) if strings else None

    @property
    def window(self) -> int:
        """Tokens at the end of a completion whose text holds any stop string that ends in the last of them: 4 per
        character (a byte-level tokenizer may spend a token per byte of a 4-byte character), and a few more."""
        return 4 * max(len(s) for s in self.strings) + 4

    @functools.cached_property
    def token_ids(self) -> tuple[int, ...]:
        """The ids of the stop strings that are one token each (``</answer>`` as an added token, a single character):
        an engine can stop at those ids itself (the vllm engine's stop_token_ids, asked for every request); the others
        are found in the text. Encoded once."""
        ids = []
        for s in self.strings:
            encoded = self.tokenizer.encode(s, add_special_tokens=False)
            if len(encoded) == 1 and self.tokenizer.decode(encoded, skip_special_tokens=False) == s:
                ids.append(int(encoded[0]))
        return tuple(ids)

    def holds(self, text: str) -> bool:
        return any(s in text for s in self.strings)

    def hit(self, tails: list[list[int]]) -> list[bool]:
        """For each row's last ``window`` token ids: does their text hold a stop string?"""
        return [self.holds(t) for t in self.tokenizer.batch_decode(tails, skip_special_tokens=False)]

    def end(self, ids: list[int]) -> int | None:
        """The smallest n whose first n tokens' text holds a stop string (the completion's length with the stop),
        or None. A binary search: log2(len(ids)) decodes."""
        if not ids or not self.holds(self.tokenizer.decode(ids, skip_special_tokens=False)):
            return None
        return self._first_holding(ids)

    def _first_holding(self, ids: list[int]) -> int:
        """end() for ``ids`` whose whole text is known to hold a stop string."""
        decode = self.tokenizer.decode
        low, high = 1, len(ids)  # the text of ids[:high] holds one; find the first n that does
        while low < high:
            mid = (low + high) // 2
            if self.holds(decode(ids[:mid], skip_special_tokens=False)):
                high = mid
            else:
                low = mid + 1
        return high


def cut_at_stop(rollout: Rollout, stop: StopStrings, pad_token_id: int) -> Rollout:
    """``rollout`` with each completion ended after the token that completes a stop string (the module docstring):
    the tokens after it padding (ids pad_token_id, mask 0, log-probs 0), the row not truncated, the columns no wider
    than the longest completion. Single-turn rollouts (a completion's tokens are its first columns)."""
    if rollout.context_mask is not None:
        raise ValueError("stop strings cut single-turn rollouts; this one has turns (context_mask)")
    ids = rollout.completion_token_ids()
    texts = stop.tokenizer.batch_decode(ids, skip_special_tokens=False)
    ends = {row: stop._first_holding(ids[row]) for row, text in enumerate(texts) if stop.holds(text)}
    if not ends:
        return rollout
    mask = rollout.completion_mask.clone()
    completion_ids, logprobs = rollout.completion_ids.clone(), rollout.logprobs.clone()
    truncated = rollout.truncated.clone()
    for row, n in ends.items():
        mask[row, n:] = 0
        completion_ids[row, n:] = pad_token_id
        logprobs[row, n:] = 0.0
        truncated[row] = False
    width = max(1, int(mask.sum(-1).max()))
    return dataclasses.replace(
        rollout,
        completion_ids=completion_ids[:, :width],
        completion_mask=mask[:, :width],
        logprobs=logprobs[:, :width],
        truncated=truncated,
    )


def stopped_rows(stop: StopStrings, ids: torch.Tensor, rows: torch.Tensor, t: int, live: torch.Tensor) -> torch.Tensor:
    """(B,) bool: which batch rows, among ``live`` (B,) bool, now end in a stop string (``StopStrings.hit`` on their
    last ``window`` tokens). ``ids`` (N, >= t + 1): every row's tokens so far in columns 0..t; ``rows`` (B,) the
    batch rows' indices into it. For the fast engine's loop: one decode of the live rows' tails a check."""
    out = torch.zeros_like(live)
    live_rows = live.nonzero().squeeze(-1)
    if live_rows.numel():
        start = max(0, t + 1 - stop.window)
        tails = ids[rows[live_rows], start : t + 1].tolist()
        hits = torch.tensor(stop.hit(tails), dtype=torch.bool, device=live.device)
        out[live_rows] = hits
    return out


__all__ = ["StopStrings", "cut_at_stop", "stopped_rows"]
