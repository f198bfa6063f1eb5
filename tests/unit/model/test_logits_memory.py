"""How many (chunk, vocabulary) logits blocks an LM-head chunk holds at once, forward and backward.

At Qwen2.5's 151,936 words one block of the default chunk (optim.logprob_chunk_size 1024) is 0.58 GiB in
float32, so each block more is a fixed cost of every update, as large as a few thousand tokens' activations
(grpokit bench --memory). Counted here on a tiny model by watching every tensor the dispatcher creates:
the chunk's logits and, in the backward, their gradient (two blocks); the log-softmax's and entropy's
temporaries are a few rows at a time. Before, the backward formed -exp(x - lse) * g out of place beside
the logits and the gradient (four blocks) and the forward divided the logits by T = 1 (a second block)."""

import pytest
import torch
from tiny_model import make_tiny_model
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from grpokit.model import logprobs as lp_module
from grpokit.model.logprobs import completion_logprobs

V = 1000  # the vocabulary: no other tensor of the tiny model has CHUNK x V elements
CHUNK = 7  # logprob_chunk_size: 20 scored tokens make chunks of 7, 7 and 6 rows


class LiveBlocks(TorchDispatchMode):
    """The most storages of exactly ``numel`` float32 elements alive at once among those created while on."""

    def __init__(self, numel: int):
        super().__init__()
        self.numel, self.live, self.most = numel, {}, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.live = {k: ref for k, ref in self.live.items() if not ref.expired()}
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes() == 4 * self.numel:
                self.live[t.untyped_storage().data_ptr()] = StorageWeakRef(t.untyped_storage())
        self.most = max(self.most, len(self.live))
        return out


def _batch(vocab: int, seed: int = 0):
    """3 rows: prompts of 3, 2, 4 tokens (left-padded), completions of 8, 5, 7 (20 scored tokens)."""
    g = torch.Generator().manual_seed(seed)
    p_len, c_len = [3, 2, 4], [8, 5, 7]
    p_ids, p_mask = torch.zeros(3, 4, dtype=torch.long), torch.zeros(3, 4, dtype=torch.long)
    c_ids, c_mask = torch.zeros(3, 8, dtype=torch.long), torch.zeros(3, 8, dtype=torch.long)
    for i in range(3):
        p_ids[i, 4 - p_len[i] :] = torch.randint(3, vocab, (p_len[i],), generator=g)
        p_mask[i, 4 - p_len[i] :] = 1
        c_ids[i, : c_len[i]] = torch.randint(3, vocab, (c_len[i],), generator=g)
        c_mask[i, : c_len[i]] = 1
    return p_ids, p_mask, c_ids, c_mask


@pytest.mark.parametrize("with_entropy", [False, True])
def test_an_lm_head_chunk_holds_at_most_its_logits_and_their_gradient(monkeypatch, with_entropy):
    monkeypatch.setattr(lp_module, "HELPER_ROWS", 2)  # the helpers' temporaries: 2 rows, not a block
    model, _ = make_tiny_model("qwen2", vocab_size=V)
    batch = _batch(V)
    forward, backward = LiveBlocks(CHUNK * V), LiveBlocks(CHUNK * V)
    with forward:
        lp, _ = completion_logprobs(model, *batch, chunk_size=CHUNK, with_entropy=with_entropy)  # (3, 8)
    loss = (lp * torch.linspace(-1, 1, lp.numel()).view_as(lp)).sum()
    with backward:
        loss.backward()
    assert forward.most == 1  # the chunk's logits, dropped before the next chunk
    assert backward.most == 2  # the recomputed logits and their gradient
    assert model.lm_head.weight.grad is not None and float(model.lm_head.weight.grad.abs().sum()) > 0
