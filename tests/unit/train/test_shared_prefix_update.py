"""optim.shared_prefix in the update and the log-prob passes (grpokit.train.update): a grouped batch's gradient, loss
and old log-probs are those of the padded forward, and the prompts do go through the model once each."""

import pytest
import torch
from update_parts import grads_of_one_step, make_learner

import grpokit.model.shared_prefix as shared
from grpokit.config.schema import resolve_algo
from grpokit.rollout.generation import Rollout
from grpokit.train.update import PolicyUpdate


def grouped_rollout(groups=3, group=4, seed=0) -> Rollout:
    """``groups`` prompts of 2-5 tokens, ``group`` completions of each (1-5 tokens), left/right-padded."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, 64, (int(torch.randint(2, 6, (1,), generator=g)),), generator=g) for _ in range(groups)]
    lengths = [int(torch.randint(1, 6, (1,), generator=g)) for _ in range(groups * group)]
    Lp, Lc, N = max(len(p) for p in prompts), max(lengths), groups * group
    r = Rollout(
        prompt_ids=torch.zeros(N, Lp, dtype=torch.long), prompt_mask=torch.zeros(N, Lp, dtype=torch.long),
        completion_ids=torch.zeros(N, Lc, dtype=torch.long), completion_mask=torch.zeros(N, Lc, dtype=torch.long),
        logprobs=torch.zeros(N, Lc), truncated=torch.zeros(N, dtype=torch.bool),
    )  # fmt: skip
    for i in range(N):
        p = prompts[i // group]
        r.prompt_ids[i, Lp - len(p) :], r.prompt_mask[i, Lp - len(p) :] = p, 1
        r.completion_ids[i, : lengths[i]] = torch.randint(3, 64, (lengths[i],), generator=g)
        r.completion_mask[i, : lengths[i]] = 1
    return r


@pytest.mark.parametrize(
    "split",
    [[], ["optim.micro_batch_size=5"], ["optim.epochs=2", "optim.mini_batches=2"], ["model.gradient_checkpointing=true"]],
)
def test_the_update_is_the_padded_ones(split, monkeypatch):
    r, advantages = grouped_rollout(), torch.linspace(-1.4, 1.9, 12)
    runs = {}
    prompts_run = []
    for name in ("_states", "_layerwise"):  # the cache's forward, and the layers' under gradient checkpointing
        inner = getattr(shared, name)
        monkeypatch.setattr(
            shared, name, lambda *a, _f=inner, always=False, **k: prompts_run.append(always) or _f(*a, always=always, **k)
        )
    for name, extra in {"shared": [], "padded": ["optim.shared_prefix=false"]}.items():
        learner, cfg = make_learner("algo.preset=grpo", "algo.beta=0", *split, *extra)
        updater = PolicyUpdate(learner, resolve_algo(cfg), cfg.optim, temperature=0.9, seed=0)
        old, _, _ = updater.rollout_logprobs(r)  # several passes: the old policy's, before the update
        out = {}
        grads = grads_of_one_step(learner, lambda u=updater, out=out: out.update(m=u.update(r, advantages)[0]))
        runs[name] = grads, out["m"], old
        if name == "shared":
            assert learner.shared_prefix and prompts_run.count(False) >= 1  # the update's forwards shared
            ran = len(prompts_run)
    assert len(prompts_run) == ran  # optim.shared_prefix=false: not tried
    (g_s, m_s, old_s), (g_p, m_p, old_p) = runs["shared"], runs["padded"]
    assert m_s["loss"] == pytest.approx(m_p["loss"], rel=1e-5, abs=1e-7)
    if old_p is not None:
        torch.testing.assert_close(old_s, old_p, rtol=0, atol=1e-5)
    for name, g in g_p.items():
        scale = float(g.abs().max())
        assert scale > 0, name
        torch.testing.assert_close(g_s[name], g, rtol=0, atol=1e-5 * scale, msg=name)


def test_off_when_packed():
    learner, _ = make_learner("optim.packing=true")
    assert not learner.shared_prefix
