"""The parent side of a sandbox (the child side is `_harness.py`): `Sandbox`, its limits, the probe of what
the host offers (`isolation_report`), one program's run (`run_program`) and one completion's tests run in a
driver process (`run_tests_job`). What the sandbox guarantees: `grpokit.sandbox`. Loaded by file path in the
fork server too (`_zygote.py`), so it imports nothing of grpokit at its top."""

from __future__ import annotations

import json
import logging
import os
import queue
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from importlib.util import module_from_spec, spec_from_file_location
from pathlib import Path

log = logging.getLogger("grpokit.rewards")
HARNESS = str(Path(__file__).with_name("_harness.py"))
SANDBOX_ID = 1000  # uid and gid of the code inside its namespace
UID_BASE = 60000  # as root: outside uid/gid of slot i is UID_BASE + i
ISOLATIONS = ("auto", "namespaces", "none")
START_S = 3.0
"""Allowance for starting a sandbox (namespaces, mounts) on top of its wall-clock limit."""
_SLOTS: queue.SimpleQueue[int] = queue.SimpleQueue()
for _slot in range(64):
    _SLOTS.put(_slot)


@dataclass(frozen=True)
class SandboxLimits:
    wall_s: float = 10.0
    """Wall-clock limit for one run (all the calls of one completion, or one stdin case)."""
    cpu_s: float = 10.0
    """CPU-time limit per process (RLIMIT_CPU, rounded up to whole seconds)."""
    memory_mb: int = 512
    """MiB for the whole sandbox: RLIMIT_AS per process, and the sum of its processes' resident memory."""
    max_processes: int = 16
    """Tasks (processes and threads) per sandbox (RLIMIT_NPROC)."""
    max_output_bytes: int = 1 << 20
    """stdout and stderr together (stdin/stdout runs), and the largest answer to one call."""
    file_mb: int = 16
    """Largest file the program may write (RLIMIT_FSIZE)."""
    tmpfs_mb: int = 64
    """Size of the writable /tmp of each sandbox."""
    tmpfs_inodes: int = 2048
    """Files, directories, links and symlinks /tmp may hold together (tmpfs nr_inodes: each costs about
    1 KiB of kernel memory the file data does not count; hard links count one each)."""


class SandboxError(RuntimeError):
    """The sandbox could not be started."""


@dataclass
class ProgramRun:
    stdout: str
    stderr: str
    returncode: int | None
    timed_out: bool
    output_exceeded: bool


class _Forked:
    """The harness (`_harness.main`) forked from this process, which is a child of the fork server
    (`_zygote.py`) and has never held a test: the part of subprocess.Popen that Sandbox uses."""

    def __init__(self, cfg: dict, keep: list[int], stdio: bool):
        pipes = [os.pipe() for _ in range(3)] if stdio else []
        harness = _harness()
        self.pid = os.fork()
        if self.pid == 0:  # the harness: never returns
            try:
                null = os.open(os.devnull, os.O_RDWR)
                ends = (pipes[0][0], pipes[1][1], pipes[2][1]) if stdio else (null, null, null)
                for fd, end in enumerate(ends):
                    os.dup2(end, fd)
                keep = sorted({0, 1, 2, *keep})
                for low, high in zip(keep, [*keep[1:], 1 << 16]):
                    os.closerange(low + 1, high)
                os.setsid()
                for sig in (signal.SIGALRM, signal.SIGCHLD, signal.SIGPIPE, signal.SIGINT, signal.SIGTERM):
                    signal.signal(sig, signal.SIG_DFL)
                harness.main(cfg)
            finally:
                os._exit(125)
        self.returncode = None
        self.stdin = self.stdout = self.stderr = None
        if stdio:
            for r, w in pipes:
                os.close(r if r == pipes[0][0] else w)
            self.stdin = os.fdopen(pipes[0][1], "wb")
            self.stdout, self.stderr = os.fdopen(pipes[1][0], "rb"), os.fdopen(pipes[2][0], "rb")

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired("harness", timeout)
            time.sleep(0.002)
        return self.returncode


_HARNESS = None


def _harness():
    """`_harness.py`, loaded by path once per process (in the fork server and its children only)."""
    global _HARNESS
    if _HARNESS is None:
        spec = spec_from_file_location("_grpokit_harness", HARNESS)
        _HARNESS = module_from_spec(spec)
        spec.loader.exec_module(_HARNESS)
    return _HARNESS


class Sandbox:
    """One started sandbox: `start` it, talk over `req_w`/`resp_r` (serve mode) or its stdio
    (stdio mode), then `close` it, which kills everything it started. Made only in a child of the
    fork server (`_zygote.py`): the harness is forked from it, not started as a new interpreter."""

    def __init__(self, mode: str, limits: SandboxLimits, isolate: bool, site_packages: bool, slot: int):
        self.mode, self.isolate, self.workdir = mode, isolate, None
        ctl_r, self.ctl_w = os.pipe()
        self.status_r, status_w = os.pipe()
        req_r, self.req_w = os.pipe()
        self.resp_r, resp_w = os.pipe() if mode == "serve" else (None, None)
        if not isolate:
            self.workdir = tempfile.mkdtemp(prefix="grpokit-sandbox-")
        fds = {"ctl": ctl_r, "status": status_w, "req": req_r, "resp": resp_w}
        cfg = dict(
            asdict(limits), mode=mode, isolate=isolate, site_packages=site_packages, workdir=self.workdir
        )
        cfg.update(fds=fds, max_message_bytes=limits.max_output_bytes)
        try:
            self.proc = _Forked(cfg, [fd for fd in fds.values() if fd is not None], stdio=mode == "stdio")
        except BaseException:
            self._close_fds(ctl_r, status_w, req_r, resp_w)
            self.close()
            raise
        self._close_fds(ctl_r, status_w, req_r, resp_w)
        try:
            self._handshake(UID_BASE + slot if os.geteuid() == 0 else None)
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _close_fds(*fds):
        for fd in fds:
            if fd is not None:
                os.close(fd)

    def _handshake(self, outside_id: int | None) -> None:
        ready, _, _ = select.select([self.status_r], [], [], 30)
        state = os.read(self.status_r, 1) if ready else b""
        if state != b"u":
            err = self.proc.stderr.read().decode(errors="replace")[-2000:] if self.proc.stderr else ""
            raise SandboxError(f"sandbox did not start (namespaces: {self.isolate}) {err}".strip())
        if self.isolate:
            uid = outside_id if outside_id is not None else os.geteuid()
            gid = outside_id if outside_id is not None else os.getegid()
            proc = f"/proc/{self.proc.pid}"
            try:
                for name, text in (
                    ("setgroups", "deny"),
                    ("uid_map", f"{SANDBOX_ID} {uid} 1"),
                    ("gid_map", f"{SANDBOX_ID} {gid} 1"),
                ):
                    with open(f"{proc}/{name}", "w") as f:
                        f.write(text)
            except OSError as e:
                raise SandboxError(f"sandbox: writing the uid/gid maps failed: {e}") from e
        os.write(self.ctl_w, b"g")

    def close(self, grace_s: float = 5.0) -> int | None:
        """Stop the run (the harness kills every process of the sandbox) and wait for it."""
        for name in ("ctl_w", "req_w", "status_r", "resp_r"):
            fd = getattr(self, name, None)
            if fd is not None:
                setattr(self, name, None)
                os.close(fd)
        rc = None
        proc = getattr(self, "proc", None)
        if proc is not None:
            try:
                rc = proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                rc = proc.wait()
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None
        return rc


_CAPS: dict | None = None
_CAPS_LOCK = threading.Lock()
_WARNED_NONE = False


def isolation_report() -> dict:
    """What this host offers: {"root", "namespaces", "reason"}; probed once by running a sandbox."""
    global _CAPS
    with _CAPS_LOCK:
        if _CAPS is None:
            caps = {"root": os.geteuid() == 0, "namespaces": False, "reason": ""}
            if not sys.platform.startswith("linux"):
                caps["reason"] = "namespaces are Linux-only"
            else:
                try:
                    run = _run_program("print(6 * 7)", "", SandboxLimits(wall_s=20), True, False)
                    caps["namespaces"] = run.returncode == 0 and run.stdout == "42\n"
                    caps["reason"] = (
                        "" if caps["namespaces"] else (run.stderr.strip()[-300:] or "probe failed")
                    )
                except (OSError, SandboxError) as e:
                    caps["reason"] = str(e)[-300:]
            _CAPS = caps
        return dict(_CAPS)


UNISOLATED = (
    "model-written code runs with isolation='none': as your user, with your network, read and "
    "write access to every file you can access (datasets with their tests, checkpoints, ~/.ssh), "
    "the right to signal or ptrace your processes (the trainer included) and to leave processes "
    "running; only rlimits and the timeout apply"
)


def resolve_isolation(isolation: str) -> bool:
    """True to isolate; raises where `auto`/`namespaces` cannot be honoured (never falls back)."""
    global _WARNED_NONE
    if isolation not in ISOLATIONS:
        raise ValueError(f"isolation must be one of {ISOLATIONS}, got {isolation!r}")
    if isolation == "none":
        if not _WARNED_NONE:
            _WARNED_NONE = True
            log.warning("code sandbox: %s", UNISOLATED)
        return False
    report = isolation_report()
    if not report["namespaces"]:
        raise RuntimeError(
            "code sandbox: no isolation available on this host (unprivileged user namespaces are "
            f"off or blocked: {report['reason']}). Refusing to run model-written code. Enable them "
            "(sysctl kernel.unprivileged_userns_clone=1 / user.max_user_namespaces > 0) or pass "
            f"isolation='none' to accept that {UNISOLATED}."
        )
    return True


def take_slot() -> int:
    return _SLOTS.get()


def give_slot(slot: int) -> None:
    _SLOTS.put(slot)


def run_program(
    code: str,
    stdin: str = "",
    *,
    limits: SandboxLimits = SandboxLimits(),
    isolation: str = "auto",
    site_packages: bool = False,
) -> ProgramRun:
    """Run `code` as a script (`__name__ == "__main__"`) with `stdin`; returns its output."""
    return _run_program(code, stdin, limits, resolve_isolation(isolation), site_packages)


def _run_program(code, stdin, limits, isolate, site_packages) -> ProgramRun:
    from grpokit.sandbox._zygote import fork_server  # noqa: PLC0415 - _zygote.py loads this file by path

    slot = take_slot()
    try:
        body = json.dumps({"code": code, "stdin": stdin or ""}).encode()
        header = {"limits": asdict(limits), "isolate": isolate, "site_packages": site_packages, "slot": slot}
        out = fork_server(site_packages).run("stdio", header, body, limits.wall_s + START_S)
    finally:
        give_slot(slot)
    if out is None:
        return ProgramRun("", "", None, True, False)
    return ProgramRun(**out)


def run_tests_job(job: dict, limits: SandboxLimits, isolate: bool, site_packages: bool) -> dict | None:
    """Run one completion's tests in a fresh driver process of the fork server (`_driver.py`: the tests there,
    the candidate's code in a sandbox it starts), within `limits.wall_s`; the driver's verdict {"passed",
    "unsupported", "timed_out"}, or None when it was killed (past its time, or out of CPU or memory)."""
    from grpokit.sandbox._zygote import fork_server  # noqa: PLC0415 - _zygote.py loads this file by path

    slot = take_slot()
    header = {"limits": asdict(limits), "isolate": isolate, "site_packages": site_packages, "slot": slot}
    try:  # the driver stops itself at wall_s; it is killed 2 s later
        return fork_server(site_packages).run("driver", header, json.dumps(job).encode(), limits.wall_s + 2)
    finally:
        give_slot(slot)


def run_stdio(header: dict, job_fd: int) -> dict:
    """In a child of the fork server: start the sandbox, then read the code and stdin, run them."""
    limits = SandboxLimits(**header["limits"])
    box = Sandbox("stdio", limits, header["isolate"], header["site_packages"], header["slot"])
    try:
        with os.fdopen(job_fd, "rb") as f:
            job = json.loads(f.read())
        return asdict(_collect(box, job["code"], job["stdin"], limits))
    finally:
        box.close()


def _feed(fd: int, data: bytes) -> None:
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    except OSError:
        pass  # the child died or closed the pipe: its result will say so
    finally:
        os.close(fd)


def _collect(box: Sandbox, code: str, stdin: str, limits: SandboxLimits) -> ProgramRun:
    proc = box.proc
    message = json.dumps(code).encode()
    req_w, box.req_w = box.req_w, None
    feeders = [
        threading.Thread(
            target=_feed, args=(req_w, len(message).to_bytes(8, "little") + message), daemon=True
        ),
        threading.Thread(
            target=_feed, args=(os.dup(proc.stdin.fileno()), stdin.encode("utf-8", "replace")), daemon=True
        ),
    ]
    proc.stdin.close()
    for t in feeders:
        t.start()
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    bufs = {out_fd: bytearray(), err_fd: bytearray()}
    open_fds = [out_fd, err_fd]
    deadline = time.monotonic() + limits.wall_s
    timed_out = exceeded = False
    exited_at = None
    while open_fds:
        now = time.monotonic()
        if now > deadline:
            timed_out = True
            break
        if exited_at is None and proc.poll() is not None:
            exited_at = now
        if exited_at is not None and now - exited_at > 0.5:
            break  # without isolation, leftovers may hold the pipes open: stop waiting for them
        ready, _, _ = select.select(open_fds, [], [], min(0.1, deadline - now))
        for fd in ready:
            data = os.read(fd, 65536)
            if not data:
                open_fds.remove(fd)
            bufs[fd] += data
        if len(bufs[out_fd]) + len(bufs[err_fd]) > limits.max_output_bytes:
            exceeded = True
            break
    rc = box.close()  # kills what is left (on time-out or flood) and reaps the harness
    proc.stdout.close()
    proc.stderr.close()
    return ProgramRun(
        stdout=bytes(bufs[out_fd]).decode("utf-8", "replace"),
        stderr=bytes(bufs[err_fd][-4000:]).decode("utf-8", "replace"),
        returncode=None if timed_out else rc,
        timed_out=timed_out,
        output_exceeded=exceeded,
    )


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
