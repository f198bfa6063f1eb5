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
- SIGKILL to the launcher: each rank dies with it (``grpokit.cli.rank``), and with each rank what it started.
A bad torchrun option is a one-line error (exit 2) before anything starts. Without ``--log-dir`` (and with
no ``--redirects`` / ``--tee``, whose files the user may want), torch's log folder is a temporary one,
removed at the end, instead of a ``/tmp/torchelastic_*`` left by every launch.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

LAUNCHER_PID = "GRPOKIT_LAUNCHER_PID"  # the launcher's pid, for each rank to die with it (grpokit.cli.rank)
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
        print(USAGE + "\n\n" + (__doc__ or "").split("\n\n", 2)[2].replace("``", ""))  # no RST markup in a terminal
        return 0
    try:
        options, command = split_command_line(argv)
    except LaunchError as e:
        print(e, file=sys.stderr)
        return 2
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import run

    waits = shutdown_timeout(options)
    try:
        args = parse_options(options, command)
    except LaunchError as e:
        print(e, file=sys.stderr)
        return 2
    logs = None
    if not args.log_dir and not (args.redirects or args.tee) or args.redirects == args.tee == "0":
        logs = args.log_dir = tempfile.mkdtemp(prefix="grpokit-launch-")  # torch's would stay in /tmp
    os.environ[LAUNCHER_PID] = str(os.getpid())  # each rank dies with this process (grpokit.cli.rank)
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
    except (
        ValueError,
        RuntimeError,
        OSError,
        AssertionError,  # torch's agent asserts some settings only when it starts
    ) as e:  # torch's agent failed before or while starting the ranks
        text = str(e).strip().splitlines()
        print(
            f"grpokit launch: torchrun failed: {type(e).__name__}: {text[0] if text else '(no message)'}",
            file=sys.stderr,
        )
        return 1
    finally:
        if logs is not None:
            shutil.rmtree(logs, ignore_errors=True)
    return 0


def parse_options(options: list[str], command: list[str]):
    """torchrun's namespace for ``options`` running ``grpokit.cli.rank COMMAND``, checked as torch's
    ``run`` checks it; a bad option is a one-line LaunchError (torch prints a usage text or a traceback)."""
    import copy

    from torch.distributed.run import config_from_args, get_args_parser

    parser = get_args_parser()

    def refuse(message: str):
        raise LaunchError(f"grpokit launch: bad torchrun option: {message}; see torchrun --help")

    parser.error = refuse
    try:
        args = parser.parse_args([*options, "-m", "grpokit.cli.rank", *command])
    except SystemExit as e:  # --help of torchrun's own, or an argparse exit without error()
        raise LaunchError(f"grpokit launch: torchrun's options stopped with exit code {e.code}") from None
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry

    backends = getattr(rendezvous_handler_registry, "_registry", None)
    if isinstance(backends, dict) and args.rdzv_backend not in backends and not args.standalone:
        refuse(f"--rdzv_backend={args.rdzv_backend} is not one of {', '.join(sorted(backends))}")
    trial = copy.deepcopy(args)
    trial.log_dir = trial.log_dir or os.devnull  # no log folder made for the check
    try:
        config, _, _ = config_from_args(trial)
    except (ValueError, RuntimeError, AssertionError, TypeError, KeyError, OSError) as e:
        text = str(e).strip().splitlines()
        refuse(f"{type(e).__name__}: {text[0] if text else ''}".rstrip(": "))
    if config.nproc_per_node < 1:  # torch's agent asserts it later, with a bare AssertionError and a traceback
        refuse(f"--nproc_per_node={args.nproc_per_node} starts no process: give 1 or more (e.g. --nproc_per_node=2)")
    port = getattr(args, "master_port", None)  # None: torch picks one
    if port is not None and not 0 <= port <= 65535:  # torch's rendezvous refuses it only once started
        refuse(f"--master_port={args.master_port} is not a port: give one in 0-65535 (e.g. --master_port=29500)")
    if args.rdzv_endpoint:  # the same, for the rendezvous's HOST[:PORT]
        from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

        try:
            parse_rendezvous_endpoint(args.rdzv_endpoint, default_port=29400)
        except ValueError as e:
            refuse(f"--rdzv_endpoint={args.rdzv_endpoint}: {str(e).strip().splitlines()[0]}")
    if not args.monitor_interval > 0:  # torch's agent asserts it once started, with no message
        refuse(f"--monitor_interval={args.monitor_interval:g}: give seconds > 0 (e.g. --monitor_interval=0.1)")
    return args
