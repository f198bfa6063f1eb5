"""Per-token whitening over a batch (REINFORCE++ and PPO whiten their token-level advantages with it).
Below both advantages.py and ppo.py, which use it."""

from __future__ import annotations

import torch
from torch import Tensor


def whiten_tokens(values: Tensor, completion_mask: Tensor, *, eps: float = 1e-6) -> Tensor:
    """Whiten per token over every masked-in token of the batch (REINFORCE++, arXiv 2501.03262 eq. 10).

      A_{i,t} = (x_{i,t} - mu) / (sigma + eps),  mu and sigma over all (i, t) with m_{i,t} = 1,
      sigma the population std (divide by sum m, as the paper and OpenRLHF do).

    Longer completions weigh more in mu and sigma (each token counts once), so the result is re-centred
    per token: the token mean of A is 0, the per-sequence mean generally is not.
    Worked example: x = [[1, 1, 1], [0, 0, pad]]: 5 tokens, mu = 3/5 = 0.6, sigma = sqrt((3*0.16 +
    2*0.36)/5) = sqrt(0.24) = 0.4899, so A = [[0.8165]*3, [-1.2247]*2]. When every masked-in value is
    equal the result is exactly 0.

    Args:
        values: (N, L) per-token values, e.g. returns-to-go; any value at masked positions.
        completion_mask: (N, L) 1 for generated tokens up to and including EOS.
    Returns:
        (N, L) whitened values, 0 at masked-out positions.
    """
    mask = completion_mask.to(torch.bool)  # (N, L)
    x = torch.where(mask, values, 0)  # (N, L)
    n = mask.sum().clamp(min=1)  # ()
    mean = x.sum() / n  # ()
    centred = torch.where(mask, x - mean, 0)  # (N, L)
    flat = torch.where(mask, x, -torch.inf).amax() == torch.where(mask, x, torch.inf).amin()  # ()
    centred = torch.where(flat, torch.zeros_like(centred), centred)  # (N, L)
    std = (centred.square().sum() / n).sqrt()  # () population std
    return centred / (std + eps)  # (N, L)
