"""Length shaping as reward functions (factories): DAPO's overlong penalty and a linear penalty.

Length is measured in tokens when the trainer passes `completion_ids` (one list of token ids per
completion, TRL's convention) or a `completion_length` column (ints). Otherwise it falls back to an
estimate, ceil(characters / chars_per_token) with chars_per_token = 4 by default (English BPE
averages about 4 characters a token) and logs a warning once: pass token ids for exact lengths.
"""

from __future__ import annotations

import logging
import math

from grpokit.scoring.completions import to_text

log = logging.getLogger("grpokit.rewards")
_warned = False


def completion_lengths(completions: list, columns: dict, chars_per_token: float = 4.0) -> list[int]:
    """Token length of each completion (see module doc for the fallback)."""
    global _warned
    ids = columns.get("completion_ids")
    if ids is not None:
        return [len(x) for x in ids]
    lengths = columns.get("completion_length")
    if lengths is not None:
        return [int(x) for x in lengths]
    if not _warned:
        log.warning(
            "length rewards: no completion_ids/completion_length column; estimating tokens as "
            "characters / %.1f",
            chars_per_token,
        )
        _warned = True
    return [math.ceil(len(to_text(c)) / chars_per_token) for c in completions]


def overlong_penalty(max_len: int, buffer_len: int, *, chars_per_token: float = 4.0):
    """DAPO's soft overlong punishment (Yu et al. 2025, eq. 13), with L_max = max_len, L_cache = buffer_len:

        R_len = 0                              if len <= L_max - L_cache
              = ((L_max - L_cache) - len) / L_cache  if L_max - L_cache < len <= L_max
              = -1                             if len > L_max

    e.g. max_len 20, buffer_len 4: lengths 16 -> 0, 18 -> -0.5, 20 -> -1, 21 -> -1.
    """
    if not (isinstance(max_len, int) and isinstance(buffer_len, int) and 0 < buffer_len <= max_len):
        raise ValueError(
            f"overlong_penalty needs integers 0 < buffer_len <= max_len, got {max_len}, {buffer_len}"
        )
    soft = max_len - buffer_len

    def overlong(prompts: list, completions: list, **columns) -> list[float]:
        out = []
        for n in completion_lengths(completions, columns, chars_per_token):
            out.append(0.0 if n <= soft else (soft - n) / buffer_len if n <= max_len else -1.0)
        return out

    overlong.__name__ = "overlong_penalty"
    return overlong


def length_penalty(max_len: int, *, min_len: int = 0, scale: float = 1.0, chars_per_token: float = 4.0):
    """A linear length penalty: 0 up to min_len, falling linearly to -scale at max_len, -scale beyond.

        R = -scale * clip((len - min_len) / (max_len - min_len), 0, 1)

    e.g. max_len 100, min_len 20, scale 0.5: lengths 10 -> 0, 60 -> -0.25, 100 -> -0.5, 500 -> -0.5.
    """
    if not (isinstance(max_len, int) and isinstance(min_len, int) and 0 <= min_len < max_len):
        raise ValueError(f"length_penalty needs integers 0 <= min_len < max_len, got {min_len}, {max_len}")

    def length(prompts: list, completions: list, **columns) -> list[float]:
        return [
            -scale * min(1.0, max(0.0, (n - min_len) / (max_len - min_len)))
            for n in completion_lengths(completions, columns, chars_per_token)
        ]

    length.__name__ = "length_penalty"
    return length


overlong_penalty._grpokit_factory = True
length_penalty._grpokit_factory = True
