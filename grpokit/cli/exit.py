"""How every ``grpokit`` process ends (the console script, ``python -m grpokit``, a torchrun rank): ``exit_program``.
A rank of a process group whose command succeeded leaves without the interpreter's teardown."""

from __future__ import annotations

import atexit
import os
import sys
from typing import NoReturn


def exit_program(code: int) -> NoReturn:
    """End the process with ``code``: ``sys.exit(code)``, unless the command succeeded in a process that joined a
    torch.distributed group (a torchrun rank). Then the ranks meet in a barrier (none tears down while another is
    still writing), the exit handlers run (grpokit.train.distributed's destroys the group; TensorBoard, wandb and
    logging flush), and the process leaves with ``os._exit(0)``: the interpreter's teardown is skipped.

    Why: gloo's and the TCPStore's C++ threads outlive the group in objects freed during that teardown (FSDP's
    device mesh holds the group), and a C++ thread that takes the GIL then aborts the process ("terminate called
    without an active exception", exit -6) after a finished run: once in CI, on a two-rank FSDP SFT run that had
    saved its checkpoint. PyTorch's own attempt to fix it at exit was abandoned (pytorch/pytorch#179291).
    A failed rank ends as before (sys.exit): a barrier could wait on ranks stuck in another collective, and a
    quicker exit lets torchrun's agent stop the other ranks before they have said why they failed."""
    dist = sys.modules.get("torch.distributed")
    if code != 0 or dist is None or not dist.is_available() or not dist.is_initialized():
        sys.exit(code)
    try:
        dist.barrier()
    except Exception as e:  # a rank that failed has left: its own code says so, this one's stays 0
        print(f"grpokit: rank {dist.get_rank()}: the ranks' last barrier failed ({e})", file=sys.stderr)
    try:
        atexit._run_exitfuncs()  # noqa: SLF001 (what sys.exit would run; public since Python 2, only named _)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
