"""The trainer's side of asynchronous rollouts (rollout.max_staleness >= 1): what a rank's sampler process samples
with under torchrun (grpokit.collect.async_ranks: its share, its seed, no collective), and the log_history its reward
functions see. Real tiny runs; the 2-rank runs are in tests/e2e/torchrun/test_async_ranks.py."""

from __future__ import annotations

import copy
import json
import os

import pytest
import torch
from grpo_runs import ROWS, has_seven, make_cfg, make_trainer
from tiny_model import make_tiny_model

from grpokit.collect.async_ranks import (
    OVER_RANKS,
    RankShare,
    agree_on_age,
    sampler_for_process,
    taken_over_ranks,
)
from grpokit.train.distributed import REDUCTIONS, Distributed
from grpokit.trainers.grpo import GRPOTrainer


def test_a_rank_share_has_the_ranks_prompts_and_seed_and_no_collective():
    rank1 = Distributed(world=2, rank=1)  # the numbers torchrun's rank 1 has, no process group needed
    share = RankShare(rank1)
    assert not share.active and (share.world, share.rank) == (2, 1)
    assert share.my_share([10, 11, 12, 13]) == [12, 13] == rank1.my_share([10, 11, 12, 13])
    assert share.rank_seed(7) == rank1.rank_seed(7) != Distributed().rank_seed(7)
    assert share.gather("x") == ["x"] and share.all_true(False) is False  # the one-process no-ops
    alone = Distributed()
    assert agree_on_age(alone) is None
    sampling, overlap = {"zero_variance_frac": 0.5}, {"async/dropped": 4.0}
    assert taken_over_ranks(alone, sampling, overlap) == (sampling, overlap)
    assert set(OVER_RANKS.values()) <= set(REDUCTIONS)  # each a reduction Distributed.reduce knows


@pytest.mark.slow
def test_a_ranks_sampler_process_samples_its_half_of_the_step_with_its_seed(tmp_path):
    """The trainer's Sampler as rank 1 of 2 would run it in its process: 2 of the step's 4 prompts (the second
    half of the one-process take), whole groups, sampled with rank 1's seed: the same completions as the
    synchronous loop's rank 1 would make (its share, its seed), with no collective called."""
    trainer = make_trainer(tmp_path)  # 4 prompts x 4 completions a step
    sampler = trainer.sampler
    rank1 = Distributed(world=2, rank=1)
    process = sampler_for_process(sampler, rank1, sampler.model)
    assert process is not sampler and process.model is sampler.model and isinstance(process.dist, RankShare)
    assert sampler_for_process(sampler, Distributed(), sampler.model) is sampler  # alone: itself
    before = copy.deepcopy(sampler.stream)  # where the step's take starts
    batch, _, _ = process.sample_batch(0)
    rows = [ROWS[i] for i in before.take(4)[2:]]  # rank 1's half of the step's prompts
    assert [r["prompt"] for r in batch.rows] == [r["prompt"] for r in rows for _ in range(4)]
    ids = [sampler.encoded[ROWS.index(r)] for r in rows]
    again = sampler.rollout(ids, seed=rank1.rank_seed(_step_seed(trainer, 0)), step=0)
    assert torch.equal(again.completion_ids, batch.rollout.completion_ids)


def _step_seed(trainer, step: int) -> int:
    from grpokit.rollout.batch import step_seed

    return step_seed(trainer.cfg.train.seed, step, 0)


def recording(prompts, completions, trainer_state=None, **kw):
    """has_seven, noting the trainer_state it was given in $GRPOKIT_TEST_SEEN: it runs in the sampler process's
    reward worker, so a file says what it saw."""
    with open(os.environ["GRPOKIT_TEST_SEEN"], "a") as f:
        history = trainer_state.log_history
        seen = {"step": trainer_state.global_step, "logged": [h["step"] for h in history]}
        f.write(json.dumps({**seen, "has_loss": all("loss" in h for h in history)}) + "\n")
    return has_seven(prompts, completions)


@pytest.mark.slow
def test_reward_functions_in_the_sampler_process_see_the_steps_logged_before_their_batch(
    tmp_path, monkeypatch
):
    """K = 1, weights pushed each step (no batch dropped): the batch of global_step j gets the trainer's
    log_history of steps 1 .. j - 1 (the synchronous loop's has 1 .. j; before, the process's was always
    empty), as {"step": n, ...} lines with the metrics logged."""
    seen = tmp_path / "seen.jsonl"
    monkeypatch.setenv("GRPOKIT_TEST_SEEN", str(seen))
    model, tok = make_tiny_model("qwen2", seed=0)
    cfg = make_cfg(
        tmp_path, "rollout.max_staleness=1", "train.steps=4", "train.samples_every=0", "eval.enabled=false"
    )
    trainer = GRPOTrainer(
        cfg, model=model, tokenizer=tok, train_rows=ROWS, reward_functions=[("recording", recording, 1.0)]
    )
    trainer.train()
    calls = [json.loads(line) for line in seen.read_text().splitlines()]
    by_batch = {c["step"]: c for c in calls}
    assert {0, 1, 2, 3} <= set(by_batch)
    for j in range(4):
        assert by_batch[j]["logged"] == list(range(1, j)), by_batch[j]  # steps 1 .. j - 1
        assert by_batch[j]["has_loss"]


def test_under_fsdp_the_process_samples_the_unsharded_copy_with_the_policys_trainable_weights():
    """Under fsdp the trainer keeps a whole copy of the policy for sampling, frozen (Distributed.wrap); the push
    carries the parameters marked trainable, so sampling_weights marks the copy's as the policy's are. Without
    that no weight would reach the sampler process (trainable_parameters of the frozen copy is empty). The copy
    is set here as wrap() leaves it, its gather for this version done (no process group in a unit test)."""
    from grpokit.collect.async_ranks import sampling_weights
    from grpokit.collect.transport import trainable_parameters

    model, _ = make_tiny_model("qwen2", seed=0)
    model.get_input_embeddings().requires_grad_(False)  # a frozen part stays frozen in the copy
    dist = Distributed(world=2, rank=0, strategy="fsdp")
    dist._gen, dist._gen_of, dist._gen_version = copy.deepcopy(model).requires_grad_(False), id(model), 3
    assert trainable_parameters(dist._gen) == {}
    whole = sampling_weights(dist, model, 3)
    assert whole is dist._gen
    assert (
        set(trainable_parameters(whole))
        == set(trainable_parameters(model))
        != set(dict(model.named_parameters()))
    )
    assert sampling_weights(Distributed(), model, 3) is model  # alone (and ddp): the policy itself
