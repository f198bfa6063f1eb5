"""cpu_seconds counts this process's children, running or ended: a reward worker that has been waited for
still counts (before, in grpokit.bench.learn: only the children alive at the time)."""

import subprocess
import sys
import time

from grpokit.core.clock import cpu_seconds

BURN = "import time\nwhile time.process_time() < 0.3: pass\n"


def test_an_ended_child_still_counts():
    before = cpu_seconds()
    subprocess.run([sys.executable, "-c", BURN], check=True)  # ended and waited for: os.times' children
    # the child burnt 0.3 CPU s (its start-up more); the parent only waited (the kernel counts in 10 ms ticks)
    assert cpu_seconds() - before >= 0.28


def test_the_training_clock_goes_on_from_a_checkpoint_and_stands_still_once_stopped():
    """train.max_cpu_seconds over a resume: the count starts from what the checkpoint recorded (before: from 0)."""
    from grpokit.core.clock import TrainingClock

    clock = TrainingClock()
    assert clock.state() == {"train_cpu_seconds": 0.0, "train_seconds": 0.0}
    clock.carry({"train_cpu_seconds": 5.0, "train_seconds": 7.0})
    assert clock.state() == {"train_cpu_seconds": 5.0, "train_seconds": 7.0}  # not started: the carried count
    clock.start()
    until = time.process_time() + 0.1
    while time.process_time() < until:  # this process burns 0.1 CPU s
        pass
    clock.stop()
    cpu, wall = clock.cpu(), clock.wall()
    assert cpu >= 5.09 and wall >= 7.09  # the kernel counts in 10 ms ticks
    until = time.process_time() + 0.05
    while time.process_time() < until:  # stopped: not counted
        pass
    assert (clock.cpu(), clock.wall()) == (cpu, wall)
    clock.start()  # a second leg in the same process keeps the first
    clock.stop()
    assert clock.cpu() >= cpu and clock.wall() >= wall
    clock.carry({})  # a checkpoint written before the count was recorded
    assert clock.state() == {"train_cpu_seconds": 0.0, "train_seconds": 0.0}
