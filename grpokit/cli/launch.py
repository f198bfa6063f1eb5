"""``grpokit launch [torchrun options] COMMAND [ARGS]``: torchrun, with the ranks' exit codes passed on.

    grpokit launch --nproc_per_node=2 train cfg.yaml optim.lr=1e-6
    = torchrun --nproc_per_node=2 -m grpokit train cfg.yaml optim.lr=1e-6, but with grpokit's exit codes

The launching is torch's own (``torch.distributed.run``: its elastic agent starts, watches and stops the
ranks); this module only translates how it ends, because torchrun reports every end but success as exit 1
with a traceback of its own:
- a rank that fails: its exit code (2 for bad input, 1 for a failed run; 128 + N for a rank killed by
  signal N, e.g. 137 for the kernel's OOM killer), from the first rank that failed;
- SIGTERM / SIGINT (Ctrl-C) to the launcher: torch's agent passes the signal to every rank, each finishes
  its step and saves a checkpoint, and the launcher exits 143 / 130 like a single-process run.
Torch kills ranks that have not exited ``--shutdown_timeout`` seconds after the signal; its default (30 s)
can be shorter than a step plus a checkpoint of a large model, so the launcher sets 600 s unless the
option or ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT`` is given.
"""

from __future__ import annotations

import os
import sys

COMMANDS = ("train", "sft", "demo")  # the grpokit commands that split their work over torchrun ranks
SHUTDOWN_TIMEOUT_S = 600
USAGE = (
    "usage: grpokit launch [torchrun options] {" + ",".join(COMMANDS) + "} [args]\n"
    "  e.g. grpokit launch --nproc_per_node=2 train cfg.yaml optim.lr=1e-6\n"
    "  torchrun options: see torchrun --help (--nproc_per_node, --nnodes, --master_port, ...)"
)


class LaunchError(ValueError):
    """A launch command line that names no grpokit command to run."""


def split_command_line(argv: list[str]) -> tuple[list[str], list[str]]:
    """``[torchrun options...] COMMAND [args...]`` -> (torchrun options, [COMMAND, args...]). The command is
    the first argument that is a grpokit command name; everything before it goes to torchrun."""
    for i, arg in enumerate(argv):
        if arg in COMMANDS:
            return argv[:i], argv[i:]
        if arg in ("-m", "--module", "--no-python", "--no_python") or arg.endswith(".py"):
            raise LaunchError(
                f"grpokit launch runs a grpokit command, not {arg!r}: give one of {', '.join(COMMANDS)} "
                "after the torchrun options (for a script of your own, call torchrun itself)."
            )
    raise LaunchError(f"grpokit launch: no command given; name one of {', '.join(COMMANDS)}.\n{USAGE}")


def shutdown_timeout(options: list[str]) -> str:
    """The seconds torch's agent waits for the ranks after a signal: the user's ``--shutdown_timeout`` or
    ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``, else 600 s, set in the environment (which torch reads when the
    option is not given; a torch without the setting ignores it)."""
    for i, o in enumerate(options):
        name, _, value = o.partition("=")
        if name in ("--shutdown_timeout", "--shutdown-timeout"):
            return value or (options[i + 1] if i + 1 < len(options) else "?")
    return os.environ.setdefault("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", str(SHUTDOWN_TIMEOUT_S))


def exit_code_of(failure_exitcode: int) -> int:
    """A rank's ``exitcode`` as a shell reports it: negative -N (killed by signal N) -> 128 + N."""
    return 128 - failure_exitcode if failure_exitcode < 0 else failure_exitcode


def main(argv: list[str]) -> int:
    """Run torchrun on ``-m grpokit COMMAND ARGS``; return what the ranks' ending says (module docstring)."""
    if argv[:1] in (["-h"], ["--help"]):
        print(USAGE + "\n\n" + (__doc__ or "").split("\n\n", 2)[2])
        return 0
    try:
        options, command = split_command_line(argv)
    except LaunchError as e:
        print(e, file=sys.stderr)
        return 2
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    waits = shutdown_timeout(options)
    args = parse_args([*options, "-m", "grpokit", *command])
    try:
        run(args)
    except SignalException as e:  # the agent has passed the signal on to every rank and waited for them
        name = getattr(e.sigval, "name", str(e.sigval))
        print(
            f"grpokit launch: stopped by {name}: every rank was sent it and had up to "
            f"{waits} s to finish its step and save; continue with "
            "--resume",
            file=sys.stderr,
        )
        return 128 + int(e.sigval)
    except ChildFailedError as e:
        rank, failure = e.get_first_failure()
        code = exit_code_of(failure.exitcode)
        print(f"grpokit launch: rank {rank} exited with code {code}; its message is above", file=sys.stderr)
        return code
    return 0
