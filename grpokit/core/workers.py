"""A forked worker process that runs the user's code (reward functions, tools) apart from the trainer.

One fork recipe for both (``grpokit.rewards._workers`` and ``grpokit.rollout.tools.runner``): the child is in its
own process group (``killpg`` reaches whatever it starts; Ctrl-C at the terminal does not), dies with its
parent (``PR_SET_PDEATHSIG``), has default signal handlers, closes the parent-side pipe ends of the other
live workers, and then serves requests on a pipe pair until the parent closes it. The standard library's
multiprocessing is not used because it neither puts a child in its own group nor ties its life to the
parent, and its pickling of the target would re-import user modules in a spawn start.
"""

from __future__ import annotations

import ctypes
import os
import signal
import warnings
from collections.abc import Callable, Iterable

PR_SET_PDEATHSIG = 1


def fork_worker(
    serve: Callable[[int, int, int], None], close_in_child: Iterable[int]
) -> tuple[int, int, int]:
    """Fork a worker; returns (pid, to_child, from_child), the parent's ends of its request and reply pipes.

    In the child, ``serve(parent_pid, requests_fd, replies_fd)`` runs, then the child exits: 0 when serve
    returned, 1 when it raised (the parent sees the closed pipe). close_in_child: the parent-side pipe ends
    of other workers, which the child must not hold open."""
    req_r, req_w = os.pipe()
    rep_r, rep_w = os.pipe()
    parent = os.getpid()
    inherited = tuple(close_in_child)
    with warnings.catch_warnings():  # Python >= 3.12 warns on fork with threads (torch has some): the
        # child runs only the user's code, never the trainer's threads' work
        warnings.filterwarnings("ignore", message=".*fork", category=DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: never returns
        status = 0
        try:
            os.setpgid(0, 0)
            try:
                ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            except (OSError, AttributeError):
                pass
            if os.getppid() != parent:  # the parent died before the death signal was armed
                os._exit(0)
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE):
                signal.signal(sig, signal.SIG_DFL)
            for fd in (*inherited, req_w, rep_r):
                try:
                    os.close(fd)
                except OSError:
                    pass
            serve(parent, req_r, rep_w)
        except BaseException:  # noqa: BLE001 - the parent sees the closed pipe and reports it
            status = 1
        finally:
            os._exit(status)
    try:
        os.setpgid(pid, pid)  # also here, so killpg works even before the child has run
    except OSError:
        pass
    os.close(req_r)
    os.close(rep_w)
    return pid, req_w, rep_r
