"""What the update does when the GPU runs out of memory (grpokit.train.learner.MicroBatchSize), checked on the CPU
by raising torch.cuda.OutOfMemoryError from the micro-batch function, as CUDA's allocator does.

The order seen on an H100 under a 16 GiB cap (docs/benchmarks.md): first free what the sampler holds on the device
(its static KV cache and CUDA graphs, rebuilt by the next rollout) and retry the same rows; only then halve
the rows (under optim.micro_batch_size=auto); a fixed size or one row that does not fit is a named error."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from tiny_model import PAD_ID, SAMPLE_PROMPTS, make_tiny_model

from grpokit.core.errors import TrainingError
from grpokit.rollout.generation import FastGenerator, HFGenerator
from grpokit.train.distributed import Distributed
from grpokit.train.learner import MicroBatchSize

CUDA = torch.device("cuda")  # a device object only: MicroBatchSize reads its type, nothing is allocated


def _oom() -> torch.cuda.OutOfMemoryError:
    return torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 28.00 MiB. GPU 0 has ...")


class Room:
    """A make_room hook holding `held` buffers; records what was alive each time it was called."""

    def __init__(self, held: int, watch: list | None = None):
        self.held, self.calls, self.watch, self.alive_at_call = held, 0, watch or [], []

    def __call__(self) -> bool:
        self.calls += 1
        gc.collect()
        self.alive_at_call.append(sum(ref() is not None for ref in self.watch))
        if self.held:
            self.held -= 1
            return True
        return False


def test_room_is_made_before_rows_are_halved():
    notes, tried = [], []
    fits = {"rows": 4, "room_made": False}

    def fn(rows: int) -> str:
        tried.append(rows)
        if not fits["room_made"] or rows > fits["rows"]:
            raise _oom()
        return f"ran {rows}"

    room = Room(held=1)

    def make_room() -> bool:
        freed = room()
        fits["room_made"] = fits["room_made"] or freed
        return freed

    micro = MicroBatchSize("auto", CUDA, Distributed(), notes.append, make_room)
    dropped = []
    assert micro.run(fn, torch.full((16,), 10), on_oom=lambda: dropped.append(1)) == "ran 4"
    # 16 fails, room is made, 16 again (fails: too many rows), then 8, then 4
    assert tried == [16, 16, 8, 4]
    assert room.calls == 3 and room.held == 0  # asked after every failure; it had something once
    assert len(dropped) == 3  # the partial gradient dropped after each failure
    assert micro.cap == 4 and micro.last == 4
    assert notes[0] == "out of GPU memory at 16 rows per micro-batch: freed the sampler's KV cache, retrying"
    assert notes[1:] == [
        "out of GPU memory at 16 rows per micro-batch: retrying with 8 (auto)",
        "out of GPU memory at 8 rows per micro-batch: retrying with 4 (auto)",
    ]
    # the next step starts from the remembered cap
    tried.clear()
    assert micro.run(fn, torch.full((16,), 10), on_oom=lambda: None) == "ran 4" and tried == [4]


def test_once_room_was_needed_it_is_made_before_every_pass():
    """The sampler rebuilds its KV cache at every rollout: after the first time freeing it let the rows fit,
    the next passes free it first instead of failing once more each time."""
    cache = {"held": True}
    tried, notes = [], []

    def make_room() -> bool:
        held, cache["held"] = cache["held"], False
        return held

    def fn(rows: int) -> int:
        tried.append(rows)
        if cache["held"]:
            raise _oom()
        return rows

    micro = MicroBatchSize("auto", CUDA, Distributed(), notes.append, make_room)
    assert micro.run(fn, torch.full((8,), 10), on_oom=lambda: None) == 8 and tried == [8, 8]
    for _ in range(3):  # three more passes, each after a rollout that rebuilt the cache
        cache["held"] = True
        tried.clear()
        assert micro.run(fn, torch.full((8,), 10), on_oom=lambda: None) == 8 and tried == [8]
    assert len(notes) == 1 and micro.cap is None  # one failed try in all, no halving


def test_the_failed_try_is_freed_before_room_is_made():
    """The activations of the try that failed must be gone when memory is freed and the rows retried: an
    exception's traceback keeps the failed frame (and its tensors) alive inside an ``except`` block."""
    watch: list = []
    room = Room(held=1, watch=watch)

    def fn(rows: int) -> int:
        activations = torch.ones(rows, 1000)  # what a forward pass would hold
        watch.append(weakref.ref(activations))
        if len(watch) < 3:
            raise _oom()
        return rows

    micro = MicroBatchSize("auto", CUDA, Distributed(), lambda _: None, room)
    assert micro.run(fn, torch.full((8,), 10), on_oom=lambda: None) == 4
    assert room.alive_at_call == [0, 0]  # nothing of the failed tries alive when the hook ran


@pytest.mark.parametrize("setting", [4, "auto"])
def test_what_does_not_fit_is_a_named_error(setting):
    room = Room(held=1)

    def fn(rows: int):
        raise _oom()

    micro = MicroBatchSize(setting, CUDA, Distributed(), lambda _: None, room)
    with pytest.raises(TrainingError, match=r"out of GPU memory with (4|1) completions per micro-batch \(CUDA out"):
        micro.run(fn, torch.full((4,), 10), on_oom=lambda: None)
    assert room.held == 0  # the room was made first, once


def test_without_a_hook_auto_halves_at_once():
    tried = []

    def fn(rows: int) -> int:
        tried.append(rows)
        if rows > 2:
            raise _oom()
        return rows

    micro = MicroBatchSize("auto", CUDA, Distributed(), lambda _: None)
    assert micro.run(fn, torch.full((8,), 10), on_oom=lambda: None) == 2 and tried == [8, 4, 2]


def test_generators_release_their_buffers_and_rebuild_them_exactly():
    """The hook the trainer gives the learner is its generator's release(): True while a KV cache is held,
    False after; the next rollout rebuilds the cache and samples exactly what it would have."""
    model, _ = make_tiny_model("qwen2", seed=3)
    kw = dict(group_size=2, max_new_tokens=9, temperature=1.0, eos_token_ids=[1], pad_token_id=PAD_ID)
    for kv_cache in ("static", "dynamic"):
        gen = FastGenerator(kv_cache=kv_cache)
        assert gen.release() is False  # nothing built yet
        a = gen.generate(model, SAMPLE_PROMPTS, seed=5, **kw)
        assert gen.release() is True and gen.release() is False
        b = gen.generate(model, SAMPLE_PROMPTS, seed=5, **kw)
        assert torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.logprobs, b.logprobs)
        assert a.completion_ids.device.type == "cpu"  # Rollout.to_host: every generator returns CPU tensors
    assert HFGenerator().release() is False


def test_the_trainer_wires_its_generator_to_the_learner(tmp_path):
    from tiny_model import small_trainer

    trainer = small_trainer(tmp_path / "run", 1)
    assert trainer.learner.micro.make_room == trainer.sampler.generator.release


@pytest.mark.parametrize("tokens", [None, "auto"])
def test_under_torchrun_an_out_of_memory_error_stops_the_rank_by_name_without_a_retry(tokens):
    # A retry on one rank alone (freeing the KV cache, or fewer rows) would run collectives the other ranks do
    # not: they wait in the same forward/backward. Even with room to make, the rank stops with a named error.
    tried = []

    def fn(rows: int) -> None:
        tried.append(rows)
        raise _oom()

    room = Room(held=1)
    dist = Distributed(world=2, rank=1)  # a rank's view: nothing here communicates before the error
    micro = MicroBatchSize("auto", CUDA, dist, lambda note: None, room, tokens=tokens)
    what = "optim.micro_batch_tokens" if tokens else "optim.micro_batch_size"
    with pytest.raises(TrainingError, match=f"out of GPU memory on rank 1 .*cannot retry alone.*{what}"):
        micro.run(fn, torch.full((8,), 10), on_oom=lambda: None)
    assert tried == [80 if tokens else 8] and room.calls == 0  # one try; no room made, no halving
