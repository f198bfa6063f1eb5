"""Padding-free packing: rows of different lengths laid end to end in one row, and micro-batches sized by a
token budget. One implementation for SFT (grpokit.data.sft.collate) and the RL passes
(grpokit.model.logprobs, grpokit.train.critic, grpokit.train.update).

A packed row holds the real tokens of every row of a micro-batch one after the other, with positions
restarting at 0 at each row; with no attention mask, transformers reads the restarts from ``position_ids``
and keeps attention inside each row (its packed-sequence detection; ``check_packed_attention`` in
grpokit.model.logprobs checks that a model does). Nothing is padded, so a micro-batch costs the sum of its
rows' lengths, not rows x the longest:

    lengths 5, 3, 2 padded: 3 x 5 = 15 token positions; packed: 5 + 3 + 2 = 10.

The loss normaliser stays the whole mini-batch's, so how rows are grouped never changes the gradient.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def pack_sequences(sequences: Sequence[Sequence[int] | Tensor]) -> tuple[Tensor, Tensor]:
    """(input_ids (1, T), position_ids (1, T)) of ``sequences`` laid end to end, T their total length.

    Example: [[7, 8, 9], [4, 5]] -> input_ids [[7, 8, 9, 4, 5]], position_ids [[0, 1, 2, 0, 1]]."""
    ids = [torch.as_tensor(s, dtype=torch.long).reshape(-1) for s in sequences]
    if not ids:
        return torch.zeros(1, 0, dtype=torch.long), torch.zeros(1, 0, dtype=torch.long)
    positions = [torch.arange(len(s)) for s in ids]
    return torch.cat(ids)[None], torch.cat(positions)[None]  # (1, T) each


def pack_masked(ids: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The tokens of padded rows ``ids`` (N, L) where ``mask`` (N, L) is 1, packed row after row.

    Returns input_ids (1, T), position_ids (1, T) and ``where`` (N, L) long: each kept token's index in
    the packed row, -1 where mask is 0. A row's positions are the cumulative count of its kept tokens, the
    positions the padded forward gives it (padding on either side shifts nothing).
    Example: ids [[0, 7, 8], [4, 5, 0]], mask [[0, 1, 1], [1, 1, 0]] -> input_ids [[7, 8, 4, 5]],
    position_ids [[0, 1, 0, 1]], where [[-1, 0, 1], [2, 3, -1]]."""
    keep = mask.bool()  # (N, L)
    positions = keep.long().cumsum(-1) - 1  # (N, L)
    where = torch.where(keep, keep.reshape(-1).long().cumsum(0).view_as(keep) - 1, -1)  # (N, L)
    return ids[keep][None], positions[keep][None], where


def token_budget_batches(order: Tensor, lengths: Tensor, budget: int) -> list[Tensor]:
    """``order`` (M,) row indices cut into consecutive micro-batches of at most ``budget`` tokens, each row
    costing ``lengths[row]``; a row longer than the budget goes alone (it is never cut). Rows sorted by
    length (grpokit.rollout.batch.length_sorted) keep the number of micro-batches near the least.

    Example: lengths 2, 3, 4, 9 in that order, budget 6 -> [0, 1], [2], [3]."""
    if budget < 1:
        raise ValueError(f"a micro-batch token budget must be >= 1, got {budget}")
    out: list[list[int]] = []
    used = 0
    for row in order.tolist():
        cost = int(lengths[row])
        if out and used + cost <= budget:
            out[-1].append(row)
            used += cost
        else:
            out.append([row])
            used = cost
    return [torch.tensor(rows, dtype=order.dtype) for rows in out]


def cut_to_count(micros: list[Tensor], lengths: Tensor, count: int) -> list[Tensor]:
    """``micros`` (micro-batches of row indices, as from token_budget_batches) cut further until there are
    ``count`` of them: each cut takes the micro-batch of several rows holding the most tokens and splits it
    in two where its tokens divide most evenly. Cuts only lower a micro-batch's tokens, so the budget still
    holds, and rows keep their order. Under torchrun every rank must run as many micro-batches (DDP and FSDP
    communicate in each forward/backward): a rank that packed fewer cuts to the largest count.

    Example: micro-batches [0, 1, 2], [3] with lengths 2, 3, 4, 9 and count 3 -> [0, 1], [2], [3]
    (the 9-token micro-batch is one row; [0, 1, 2] cut after 2 + 3 = 5 of its 9 tokens)."""
    rows = sum(len(m) for m in micros)
    if count > rows:
        raise ValueError(f"cannot cut {rows} rows into {count} micro-batches (each needs at least one row)")
    out = list(micros)
    while len(out) < count:
        tokens = [int(lengths[m].sum()) if len(m) > 1 else -1 for m in out]
        k = max(range(len(out)), key=tokens.__getitem__)  # the fullest micro-batch that can be cut
        cum = lengths[out[k]].cumsum(0)  # (n,) tokens up to and including each row
        cut = int((cum[:-1] - cum[-1] / 2).abs().argmin()) + 1  # 1 <= cut < n: both halves keep a row
        out[k : k + 1] = [out[k][:cut], out[k][cut:]]
    return out
