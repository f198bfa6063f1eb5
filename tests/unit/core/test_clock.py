"""cpu_seconds counts this process's children, running or ended: a reward worker that has been waited for
still counts (before, in grpokit.bench.learn: only the children alive at the time)."""

import os
import subprocess
import sys
import time

import pytest

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
    assert cpu >= 5.085 and wall > 7.0  # CPU: 0.1 s read as whole 10 ms ticks at both ends (0.09 at worst)
    until = time.process_time() + 0.05
    while time.process_time() < until:  # stopped: not counted
        pass
    assert (clock.cpu(), clock.wall()) == (cpu, wall)
    clock.start()  # a second leg in the same process adds to the first
    until = time.process_time() + 0.05
    while time.process_time() < until:
        pass
    clock.stop()
    assert clock.cpu() >= cpu + 0.035 and clock.wall() > wall
    clock.carry({})  # a checkpoint written before the count was recorded
    assert clock.state() == {"train_cpu_seconds": 0.0, "train_seconds": 0.0}


# A fresh parent (no other children: nothing else can add seconds) starts a child that forks a grandchild; the
# grandchild burns 0.3 CPU s and ends, the child reaps it and lives on. The grandchild's seconds are then in the
# living child's cutime, which os.times (RUSAGE_CHILDREN) does not see until the child itself is waited for.
PARENT = """
import importlib.util, os, subprocess, sys
spec = importlib.util.spec_from_file_location("clock", sys.argv[1])  # not grpokit/__init__ (it imports torch)
clock = importlib.util.module_from_spec(spec)
spec.loader.exec_module(clock)
CHILD = '''
import os, sys, time
pid = os.fork()
if pid == 0:
    while time.process_time() < 0.3:
        pass
    t = os.times()
    print(t.user + t.system, flush=True)
    os._exit(0)
os.waitpid(pid, 0)
t = os.times()
print(t.user + t.system, flush=True)
sys.stdin.read()
'''
def own():
    t = os.times()
    return t.user + t.system
before, own_before = clock.cpu_seconds(), own()
child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
grandchild_s, child_s = float(child.stdout.readline()), float(child.stdout.readline())
charged = clock.cpu_seconds() - before - (own() - own_before)  # the descendants' part, the child alive
walked = clock._descendants_seconds(clock._task_children)
scanned = clock._descendants_seconds(clock._scanned_children())
child.stdin.close()
child.wait()
print(charged, walked, scanned, child_s, grandchild_s)
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="Linux's /proc")
def test_a_grandchild_reaped_by_a_living_child_is_charged():
    """Before, a living child's own seconds counted (psutil's user + system), not the 0.3 s its reaped grandchild
    burnt: those came only once the child itself ended. Both ways of finding the children give the same."""
    from grpokit.core import clock

    out = subprocess.run(
        [sys.executable, "-c", PARENT, clock.__file__], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    charged, walked, scanned, child_s, grandchild_s = map(float, out.split())
    assert grandchild_s >= 0.28  # 0.3 s, in whole ticks
    # /proc and os.times count in 10 ms ticks: a few readings, a few ticks at most
    for seconds in (charged, walked, scanned):
        assert seconds == pytest.approx(child_s + grandchild_s, abs=0.05)
