"""cpu_seconds counts this process's children, running or ended: a reward worker that has been waited for
still counts (before, in grpokit.bench.learn: only the children alive at the time)."""

import subprocess
import sys

from grpokit.core.clock import cpu_seconds

BURN = "import time\nwhile time.process_time() < 0.3: pass\n"


def test_an_ended_child_still_counts():
    before = cpu_seconds()
    subprocess.run([sys.executable, "-c", BURN], check=True)  # ended and waited for: os.times' children
    # the child burnt 0.3 CPU s (its start-up more); the parent only waited (the kernel counts in 10 ms ticks)
    assert cpu_seconds() - before >= 0.28
