"""The frozen reference's log-probs computed in an asynchronous run's sampler process (grpokit.train.reference):
the trainer makes no reference pass for a batch that comes with them; they are bit for bit the trainer's own
pass on the same batch (one torch thread on each side); a K = 1 run logs the same kl and trains the same
weights with the pass in either place; the reference's weights reach the process shared, not pickled."""

from __future__ import annotations

import pytest
import torch
from grpo_runs import make_trainer
from tiny_model import make_tiny_model

from grpokit.collect.reference import sampler_reference
from grpokit.collect.transport import _load_payload, _shared_payload, shared_tensors
from grpokit.config.schema import load_config, resolve_algo
from grpokit.model.loading import frozen_reference
from grpokit.model.precision import PRECISIONS
from grpokit.train.distributed import Distributed
from grpokit.train.reference import ReferencePass
from grpokit.train.update import PolicyUpdate

# wall-clock numbers (and reward/*/seconds), and how long the trainer waited: the rest must match exactly
VARYING = ("time/", "step_time", "tokens_per_s", "peak_memory_mb", "async/wait_s", "async/queue_depth", "async/sampler_busy",
           "async/trainer_busy")  # fmt: skip


@pytest.fixture
def one_thread():
    """The trainer on one torch thread, as the sampler process is (and as the demo runs): a float32 forward on
    the CPU is then the same arithmetic in both processes."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class ReferenceCounting(PolicyUpdate):
    """Counts the trainer's reference passes; keeps each batch with the reference log-probs it came with."""

    passes = 0
    shipped: list = []

    def rollout_logprobs(self, r, ref_logprobs=None):
        ReferenceCounting.shipped.append((r, ref_logprobs))
        return super().rollout_logprobs(r, ref_logprobs)

    def logprobs_no_grad(self, model, r, reference=False, entropy=False):
        ReferenceCounting.passes += reference
        return super().logprobs_no_grad(model, r, reference=reference, entropy=entropy)


class TrainerReference(PolicyUpdate):
    """The trainer's own reference pass whatever the batch came with (where the pass was before)."""

    def rollout_logprobs(self, r, ref_logprobs=None):
        return super().rollout_logprobs(r)


@pytest.mark.slow
@pytest.mark.parametrize(
    "start, extra",
    [("spawn", ()), ("fork", ()), ("spawn", ("lora.enabled=true", "lora.r=4"))],
    ids=["spawn", "fork", "lora"],
)
def test_the_sampler_ships_the_reference_log_probs_and_they_are_the_trainers_own_bit_for_bit(
    start, extra, tmp_path, monkeypatch, one_thread
):
    """K = 1, 3 steps (the grpo preset: beta 0.04): the trainer makes no reference pass; each batch came with
    (N, Lc) reference log-probs equal to what the trainer's own pass gives that batch (LoRA: the base with the
    adapter disabled, which the sampler's copy of the policy holds)."""
    monkeypatch.setenv("GRPOKIT_SAMPLER_START", start)
    ReferenceCounting.passes, ReferenceCounting.shipped = 0, []
    trainer = make_trainer(
        tmp_path, "rollout.max_staleness=1", "train.steps=3", "train.samples_every=0", "eval.enabled=false",
        *extra, updater=ReferenceCounting,
    )  # fmt: skip
    assert trainer.source.process.start_method == start
    trainer.train()
    assert ReferenceCounting.passes == 0  # before: one a step
    assert len(ReferenceCounting.shipped) == 3
    for r, shipped in ReferenceCounting.shipped:
        assert shipped is not None and shipped.shape == r.completion_ids.shape
        own = trainer.updater.logprobs_no_grad(
            trainer.ref_model, r, reference=True
        )  # the reference never moved
        assert torch.equal(shipped, own)
        assert shipped[r.completion_mask.bool()].lt(0).all()  # real log-probs, not a placeholder
    assert trainer.log_history[-1]["kl"] > 0  # the policy moved from the reference: the KL read them
    assert ReferenceCounting.passes == 3  # (the comparison's own passes)


@pytest.mark.slow
def test_a_k1_run_logs_the_same_kl_and_trains_the_same_weights_with_the_reference_pass_in_either_place(
    tmp_path, one_thread
):
    """Weights pushed only when a batch is too old (rollout.sync_every beyond the run): every batch's version is
    then set by the steps, not by timing (0, 0, then the batch of step 3 is 2 old: dropped, version 2 pushed
    before the next is started), so both runs train the same batches."""
    runs = []
    for name, updater in (("sampler", PolicyUpdate), ("trainer", TrainerReference)):
        trainer = make_trainer(
            tmp_path / name, "rollout.max_staleness=1", "rollout.sync_every=50", "train.steps=4",
            "train.samples_every=0", "eval.enabled=false", updater=updater,
        )  # fmt: skip
        trainer.train()
        runs.append(trainer)
    here, there = (
        [
            {k: v for k, v in m.items() if not k.startswith(VARYING) and not k.endswith("/seconds")}
            for m in t.log_history
        ]
        for t in runs
    )
    assert [m["async/version"] for m in here] == [0.0, 0.0, 2.0, 2.0]
    assert [m["kl"] for m in here] == [m["kl"] for m in there] and here[-1]["kl"] > 0
    assert here == there  # every other number too
    for (name, a), b in zip(runs[0].model.state_dict().items(), runs[1].model.state_dict().values()):
        assert torch.equal(a, b), name


def test_the_reference_reaches_the_sampler_process_shared_not_pickled():
    """The pickled description names the reference's tensors; the process gets the tensors themselves (a fork:
    the trainer's pages; spawn: shared memory), not a copy in the pickle."""
    model, _ = make_tiny_model("qwen2", seed=0)
    ref = frozen_reference(model, lora_enabled=False)
    tensors = shared_tensors(ref)
    assert tensors.keys() >= {n for n, _ in ref.named_parameters()}
    weight_bytes = sum(t.numel() * t.element_size() for t in tensors.values())
    alone = _shared_payload(("recipe", model))
    payload = _shared_payload(("recipe", model, ref), tensors)
    assert len(payload) - len(alone) < weight_bytes / 10  # its modules' structure only
    _, _, received = _load_payload(payload, tensors)
    for name, t in [*received.named_parameters(), *received.named_buffers()]:
        assert t is tensors[name], name
    ids = torch.tensor([[3, 5, 7, 9]])
    with torch.no_grad():
        assert torch.equal(ref(input_ids=ids).logits, received(input_ids=ids).logits)


def test_the_trainer_keeps_its_own_pass_where_the_sampler_cannot_make_it():
    def reference(*overrides, dist=None, device="cpu"):
        cfg = load_config(None, ["model.device=cpu", "algo.preset=grpo", *overrides])
        alone = dist or Distributed()
        return sampler_reference(  # asynchronous: as grpokit.collect.factory decides it, from rollout.max_staleness
            cfg, resolve_algo(cfg), alone, torch.device(device), None, PRECISIONS["fp32"],
            asynchronous=cfg.rollout.max_staleness >= 1,
        )  # fmt: skip

    made = reference("rollout.max_staleness=1", "optim.micro_batch_size=3", "optim.logprob_chunk_size=64")
    assert isinstance(made, ReferencePass)
    assert (made.micro_batch_size, made.micro_batch_tokens, made.chunk_size) == (3, None, 64)
    assert (
        reference(
            "rollout.max_staleness=1", "optim.packing=true", "optim.micro_batch_tokens=512"
        ).micro_batch_tokens
        == 512
    )
    assert reference() is None  # synchronous: the trainer's pass, as before
    assert reference("rollout.max_staleness=1", "algo.beta=0") is None  # no reference at all
    assert reference("rollout.max_staleness=1", device="cuda") is None  # a GPU: not shared with the process
    fsdp = Distributed(world=2, rank=0, strategy="fsdp")
    assert reference("rollout.max_staleness=1", dist=fsdp) is None  # the reference is sharded over the ranks
    ddp = Distributed(world=2, rank=0, strategy="ddp")
    assert isinstance(reference("rollout.max_staleness=1", dist=ddp), ReferencePass)  # each rank's own share
