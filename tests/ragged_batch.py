"""The ragged batch of the packing tests (padded == packed, on the CPU and on CUDA): rows whose prompts and
completions all differ in length, so that left padding, right padding and packed rows all show."""

import torch

PAD = 0


def ragged_batch(device: torch.device | str = "cpu", vocab: int = 64, seed: int = 0, multi_turn: bool = False):
    """(prompt_ids, prompt_mask, completion_ids, completion_mask, context_mask) on ``device``: 4 rows of
    left-padded prompts (5, 2, 4, 1 tokens) and right-padded completions (4, 9, 1, 6 tokens) of random ids
    3..vocab-1. context_mask is None; multi_turn: rows 1 and 3 hold tool tokens (attended, context_mask 1, not
    scored, completion_mask 0)."""
    g = torch.Generator().manual_seed(seed)
    p_len, c_len = [5, 2, 4, 1], [4, 9, 1, 6]
    Lp, Lc = max(p_len), max(c_len)
    p_ids, p_mask = torch.full((4, Lp), PAD), torch.zeros((4, Lp), dtype=torch.long)  # (4, 5)
    c_ids, c_mask = torch.full((4, Lc), PAD), torch.zeros((4, Lc), dtype=torch.long)  # (4, 9)
    for i in range(4):
        p_ids[i, Lp - p_len[i] :] = torch.randint(3, vocab, (p_len[i],), generator=g)
        p_mask[i, Lp - p_len[i] :] = 1
        c_ids[i, : c_len[i]] = torch.randint(3, vocab, (c_len[i],), generator=g)
        c_mask[i, : c_len[i]] = 1
    context = None
    if multi_turn:
        context = c_mask.clone()
        c_mask = c_mask.clone()
        c_mask[1, 3:6] = 0  # a tool's reply inside row 1, then the model again
        c_mask[3, 2:4] = 0
    device = torch.device(device)
    return (
        *(t.to(device) for t in (p_ids, p_mask, c_ids, c_mask)),
        None if context is None else context.to(device),
    )
