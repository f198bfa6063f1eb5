"""The masks the loss trained on are the ones the saved rollouts and the run explorer show (issue 35's review: the
per-token view repeated the surrogate's call and left the off-policy, entropy and covariance masks out).

A spy loss takes the terms of each micro-batch with grpokit.algos.loss.loss_terms (what policy_loss aggregates) and
keeps the tokens each mask acted on; the saved rollouts' "masks" column must name the same tokens, and the loss the
explorer recomputes from the saved file must be the logged one."""

import json

import pytest
import torch
from grpo_runs import recording_trainer

from grpokit.algos import policy_loss, register_loss
from grpokit.algos.loss import loss_terms
from grpokit.algos.token_terms import MASK_BITS
from grpokit.rollout.record import read_rollouts, rollout_files

SEEN: list[dict] = []  # per micro-batch: each row's log-probs and the mask bits the loss's terms had


def mask_spy(logprobs, old_logprobs, advantages, completion_mask, **kw):
    terms_kw = {k: v for k, v in kw.items() if k not in ("agg", "norm_len", "num_sequences", "num_tokens")}
    t = loss_terms(logprobs.detach(), old_logprobs, advantages, completion_mask, **terms_kw)
    bits = torch.zeros(t.mask.shape, dtype=torch.int64)
    for reason, acted in t.masked.items():
        bits |= acted.long() * MASK_BITS[reason]
    SEEN.append({"logprobs": logprobs.detach().clone(), "mask": completion_mask.clone(), "bits": bits})
    return policy_loss(logprobs, old_logprobs, advantages, completion_mask, **kw)


register_loss("mask_spy", mask_spy)


CASES = {
    "off_policy+entropy+clip_cov": [
        "algo.off_policy_mask=0.0",
        "algo.top_entropy_quantile=0.5",
        "algo.cov_penalty=clip_cov",
        "algo.cov_ratio=0.3",
        "algo.clip_cov_lb=-100",
        "algo.clip_cov_ub=100",
    ],
    "dppo_tv+kl_cov": ["algo.preset=dppo_tv", "algo.cov_penalty=kl_cov", "algo.cov_ratio=0.3"],
}


@pytest.fixture(scope="module", params=list(CASES))
def run(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("masks")
    trainer = recording_trainer(tmp / "run", *CASES[request.param], "algo.loss=mask_spy")
    SEEN.clear()
    trainer.train()
    return tmp / "run", list(SEEN)


@pytest.mark.slow
def test_saved_masks_are_the_ones_the_loss_trained_on(run):
    folder, seen = run
    t = read_rollouts(rollout_files(folder)[0])[0].to_pydict()
    trained = []  # (log-probs, mask bits) of every row the loss saw; two rows of one group can be the same text
    for call in seen[len(seen) // 2 :]:  # the second step's micro-batches: the saved one
        for j in range(call["logprobs"].shape[0]):
            n = int(call["mask"][j].sum())
            trained.append((tuple(call["logprobs"][j, :n].tolist()), call["bits"][j, :n].tolist()))
    saved = [(tuple(t["logprobs"][i]), t["masks"][i]) for i in range(len(t["logprobs"]))]
    assert len(trained) == len(saved) == 16
    assert sorted(saved) == sorted(trained)  # the same rows with the same masks, whatever the order
    assert any(any(row) for row in t["masks"])  # some mask acted


@pytest.mark.slow
def test_the_explorer_gives_back_the_logged_loss_with_the_masks(run):
    from grpokit.view.data import step_view

    folder, _ = run
    logged = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()][-1]
    totals = step_view(rollout_files(folder)[0], {})["totals"]
    assert totals["loss"] == pytest.approx(logged["loss"], rel=1e-5, abs=1e-8)
