import os

import pytest
import torch

# Under pytest-xdist (`python -m pytest -n auto`, the README's test command), each worker is its own process
# with its own torch: without a share of the cores each would start one OpenMP thread per core and the workers
# would fight over them. A worker gets cores // workers threads (at least one); a run without xdist keeps
# torch's default.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)

# The asynchronous sampler process (rollout.max_staleness >= 1) is a fork on a CPU-only run by default and a
# spawned interpreter on a GPU (grpokit.collect.async_sampler.start_method). The suite runs the spawned one, the
# path a GPU run takes (the CPU cannot run it otherwise); tests of the fork set GRPOKIT_SAMPLER_START=fork.
os.environ.setdefault("GRPOKIT_SAMPLER_START", "spawn")
if _WORKERS > 1:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // _WORKERS))


def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one worker per core, at most 4 (each holds its own torch and tiny models; past 4 the
    subprocess-heavy tests gain little and memory grows)."""
    return max(1, min(os.cpu_count() or 1, 4))


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
