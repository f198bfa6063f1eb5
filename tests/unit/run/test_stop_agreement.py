"""The training loop's stop under torchrun (grpokit.run.loop): a signal caught while the ranks agree is not lost.

Every rank gives its signal (or None) to ``Distributed.agree`` after each step and all stop on the first one given.
A rank that catches SIGTERM while that collective runs has already given None: the answer (None) must not wipe
its flag, or the signal is lost and the run goes on (a two-rank CI run did, for 400 s). The loop runs here over a
real tiny trainer seen through a view whose ``dist`` plays a second rank: active, and its first agreement is the one
during which the signal arrives."""

from tiny_model import small_trainer

from grpokit.run.loop import run_training


class RacingRanks:
    """A Distributed whose agree() sees the signal arrive on this rank during the collective of step ``at``."""

    active = True

    def __init__(self, real, at: int):
        self.real, self.at, self.calls = real, at, []
        self.stop = None  # the loop's StopOnSignals, given by the view's begin()

    def __getattr__(self, name):
        return getattr(self.real, name)

    def agree(self, value):
        self.calls.append(value)
        if value is None and len(self.calls) == self.at and self.stop is not None:
            self.stop.signal_name = "SIGTERM"  # the handler ran while this rank waited in the gather
        return value  # every other rank gave None; this rank's own value as it was given


class LoopView:
    """The trainer as the loop sees it, with the racing ranks as its ``dist``; the rest is the trainer's own."""

    def __init__(self, trainer, dist):
        object.__setattr__(self, "trainer", trainer)
        object.__setattr__(self, "dist", dist)

    def __getattr__(self, name):
        return getattr(self.trainer, name)

    def begin(self, log, stop):
        self.dist.stop = stop
        return self.trainer.begin(log, stop)


def test_a_signal_caught_while_the_ranks_agree_stops_the_run_after_the_next_step(tmp_path):
    trainer = small_trainer(tmp_path / "run", 6)
    ranks = RacingRanks(trainer.dist, at=2)
    summary = run_training(LoopView(trainer, ranks))
    # step 2's agreement saw None and the signal arrived during it; step 3's carries it: every rank stops there
    assert ranks.calls[:3] == [None, None, "SIGTERM"]
    assert summary["stopped_by"] == "SIGTERM" and summary["steps"] == 3 and trainer.step == 3
    assert summary["checkpoint"] and summary["checkpoint"].endswith("step_000003")
