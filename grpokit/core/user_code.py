"""Loading the user's own code named in a config ('package.module:attr' or 'path/file.py:attr'): reward
functions, tools, environments. One loader for all three, so each gets the same guard: the module is
imported in a forked child first, so that what it does at import time cannot end or hang the trainer:
``os._exit(7)``, a crash, or a module that blocks forever becomes a UserCodeError naming the file, before
the trainer imports it itself (a module that returns or raises in the child is then imported again in the
trainer, so import-time side effects run twice).

A fork, not a fresh interpreter: the child already holds everything the trainer imported (torch, ...),
so the probe costs about the module's own import time. The child dies with the trainer (a parent-death
signal: killing the trainer, SIGKILL included, leaves no probe behind) and its stdin, stdout and stderr
are /dev/null, so nothing it starts holds the trainer's output open (what the module prints at import
time is printed once, by the trainer's own import)."""

from __future__ import annotations

import importlib
import importlib.util
import os
import select
import signal
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from grpokit.core.errors import ConfigError

IMPORT_TIMEOUT_S = 60.0
"""How long a user's module may take to import (env GRPOKIT_REWARD_IMPORT_TIMEOUT_S overrides it)."""


class UserCodeError(ConfigError):
    """The module a config entry names cannot be imported; the message names the entry and what to fix."""


def name_of(obj: Callable | type, where: str) -> str:
    """'module:qualname' of a function or class given in code, the name a config keeps it under (and a worker or
    the sampler process loads it by; one defined in the running script is '__main__:name'), once checked that the
    name finds ``obj`` again. A lambda, a nested function or class, a method or an object without a name is a
    UserCodeError naming ``where`` (the config entry or keyword) and what to do."""
    module, name = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    found = None
    if module and name and "." not in name and "<" not in name:
        try:
            found = getattr(importlib.import_module(module), name, None)
        except ImportError:
            found = None
    if found is not obj:
        raise UserCodeError(
            f"{where}: {name or type(obj).__name__} cannot be found again by name (a lambda, a nested function or "
            "class, a method, or an object without a name): define it with def or class at the top level of your "
            "script or a module; grpokit loads it by name in worker processes"
        )
    return f"{module}:{name}"


def load_module(target: str, attr: str, where: str, prefix: str = "grpokit_user") -> ModuleType:
    """The module of 'package.module' or 'file.py' (target: what stands before ':'), probed in a child first.

    where: the config entry, for messages (``rewards[1].name='x.py:fn'``); prefix: the module name a
    file is loaded under (``<prefix>_<stem>``)."""
    if target.endswith(".py") or "/" in target:
        path = Path(target).expanduser()
        if not path.is_file():
            what = "is a folder, not a file" if path.is_dir() else "not found"
            raise UserCodeError(
                f"{where}: file {target} {what} (relative to {Path.cwd()}); give the path of an "
                f"existing .py file, e.g. path/to/{path.stem or 'module'}.py:{attr}"
            )
        module_spec = importlib.util.spec_from_file_location(f"{prefix}_{path.stem}", path)
        module = importlib.util.module_from_spec(module_spec)
        problem = probe_import(lambda: module_spec.loader.exec_module(module))  # a crash or hang ends a child
        if problem is not None:
            raise UserCodeError(f"{where}: running {target} failed: {problem}; fix the file")
        try:
            module_spec.loader.exec_module(module)
        except (Exception, SystemExit) as e:
            raise UserCodeError(f"{where}: running {target} failed: {describe(e)}; fix the file") from e
        return module
    if target not in sys.modules:
        problem = probe_import(lambda: importlib.import_module(target))
        if problem is not None:
            raise UserCodeError(
                f"{where}: importing module {target!r} failed: {problem}; fix it, or name a file instead "
                f"('path/to/{target.rsplit('.', 1)[-1]}.py:{attr}')"
            )
    try:
        return importlib.import_module(target)
    except (Exception, SystemExit) as e:
        raise UserCodeError(
            f"{where}: importing module {target!r} failed: {describe(e)}; install it or add its folder "
            f"to PYTHONPATH, or name a file instead ('path/to/{target.rsplit('.', 1)[-1]}.py:{attr}')"
        ) from e


def describe(e: BaseException) -> str:
    """'ExceptionType: first line of the message' (at most 300 characters of it)."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:300]}" if text else type(e).__name__


def probe_import(load: Callable[[], object], timeout_s: float | None = None) -> str | None:
    """Run ``load()`` (which imports the module) in a forked child; None when it returned or raised (an
    exception is safe to meet again in the trainer, which reports it), else what went wrong in words: the
    exit code or signal the process ended with, or the timeout."""
    if timeout_s is None:
        timeout_s = float(os.environ.get("GRPOKIT_REWARD_IMPORT_TIMEOUT_S") or IMPORT_TIMEOUT_S)
    read_fd, write_fd = os.pipe()
    parent = os.getpid()
    with warnings.catch_warnings():  # Python >= 3.12 warns on fork with threads: the child only imports
        warnings.filterwarnings("ignore", message=".*fork", category=DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 0
        try:
            os.close(read_fd)
            _die_with(parent)
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):  # never the trainer's stdout: a `| tee` or a CI log would wait for it
                os.dup2(null, fd)
            os.setpgid(0, 0)  # its own group: whatever the module starts is killed with it
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, signal.SIG_DFL)
            try:
                load()
            except BaseException:  # noqa: BLE001 - an exception is safe: the trainer's own import reports it
                pass
            os.write(write_fd, b"returned")
        except BaseException:  # noqa: BLE001
            code = 1
        finally:
            os._exit(code)
    os.close(write_fd)
    try:
        data, timed_out = _read_until_closed(read_fd, timeout_s)
    finally:
        os.close(read_fd)
        try:
            os.killpg(pid, signal.SIGKILL)  # a hung import, and whatever the module started
        except OSError:
            pass
        _, status = os.waitpid(pid, 0)
    if timed_out:
        return f"importing it did not finish within {timeout_s:.0f} s (it blocks at import time)"
    if data == b"returned":
        return None
    if os.WIFSIGNALED(status):
        return f"importing it killed the process (signal {signal.Signals(os.WTERMSIG(status)).name})"
    return f"importing it ended the process (exit code {os.waitstatus_to_exitcode(status)})"


def _die_with(parent: int) -> None:
    """Linux: the kernel kills this process when its parent (the trainer) dies, SIGKILLed included."""
    try:
        import ctypes  # noqa: PLC0415 - only in the probe's child

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: the parent's timeout still ends a hung import
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(1)


def _read_until_closed(fd: int, timeout_s: float) -> tuple[bytes, bool]:
    """(what the child wrote, whether the time ran out before it closed the pipe)."""
    deadline = time.monotonic() + timeout_s
    data = b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return data, True
        ready, _, _ = select.select([fd], [], [], min(left, 1.0))
        if ready:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return data, False
            data += chunk
