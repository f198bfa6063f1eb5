"""Run untrusted Python in a subprocess sandbox (parent side; the child is `_harness.py`).

What is isolated, with `isolation="namespaces"` (the default when running as root on Linux):
  - network: a new network namespace with no interfaces up; connect()/bind to anything fails,
    the host's loopback included.
  - processes: a new PID namespace; when the program ends or is killed, every process it started
    dies with it (fork bombs, daemons, setsid escapes). RLIMIT_NPROC caps tasks per sandbox: each
    concurrent run gets its own unprivileged uid (60000 + slot) with no supplementary groups.
  - filesystem: a private mount namespace; / is remounted read-only, /tmp /var/tmp /dev/shm
    /run/lock are fresh small tmpfs; the program runs in a fresh /tmp/work, its HOME and TMPDIR.
    Nothing it writes survives the run. It can still *read* world-readable host files (keep
    datasets in directories other users cannot read) but not /proc of host processes.
  - resources: RLIMIT_CPU (cpu_s), RLIMIT_AS (memory_mb), RLIMIT_FSIZE (file_mb), RLIMIT_NOFILE,
    no core dumps; a wall-clock limit enforced by the parent, which kills the whole process group
    (and so the namespace); stdout/stderr capped at max_output_bytes (the run is killed beyond).
  - environment: a scrubbed environment (PATH, LANG only), `python -I -S` (no user site, no
    site-packages unless `site_packages=True`, PYTHON* variables ignored), no inherited fds
    except the payload and result pipes, stdin is /dev/null in assert mode.
  - the tests are never on disk or in the environment or argv; they are sent through a pipe the
    harness reads only after the candidate's top-level code has run.

With `isolation="none"` (automatic when not root or namespaces are unavailable): rlimits, a new
session killed as a whole on timeout, a fresh temporary directory, the scrubbed environment. Not
isolated then: the network, the rest of the filesystem (writes anywhere the user may write),
processes that leave the session, RLIMIT_NPROC counts all of the user's processes. The program
runs as the trainer's own user: as root that means no process limit at all and full write access,
so `auto` logs a warning when it has to fall back to `none` as root.

Not defended in either mode: code that runs in the same interpreter as the tests can in principle
inspect the harness's memory (frames, gc) to find the per-run nonce and forge results, or
monkeypatch stdlib modules the tests use. The harness restores builtins and its own modules
before the tests, guards comparisons against objects of candidate-made classes and reads results
only from a private pipe with a nonce, which stops the tricks a policy finds by chance
(sys.exit before the tests, os._exit, printing "PASS", always-equal objects, overriding builtins or
the test helpers); a policy that has studied this harness could do more. Kernel exploits and
side channels are out of scope: use a VM or gVisor for hostile code at scale.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

log = logging.getLogger("grpokit.rewards")
HARNESS = str(Path(__file__).with_name("_harness.py"))
UID_BASE = 60000
_SLOTS: queue.SimpleQueue[int] = queue.SimpleQueue()
for _slot in range(64):
    _SLOTS.put(_slot)


@dataclass(frozen=True)
class SandboxLimits:
    wall_s: float = 10.0
    """Wall-clock limit for one program, enforced by the parent (kills the process group)."""
    cpu_s: float = 10.0
    """CPU-time limit (RLIMIT_CPU, rounded up to whole seconds)."""
    memory_mb: int = 512
    """Address-space limit (RLIMIT_AS) in MiB."""
    max_processes: int = 16
    """Tasks (processes and threads) per sandbox uid (RLIMIT_NPROC)."""
    max_output_bytes: int = 1 << 20
    """stdout and stderr together; beyond it the run is killed and counts as failed."""
    file_mb: int = 16
    """Largest file the program may write (RLIMIT_FSIZE)."""
    tmpfs_mb: int = 64
    """Size of each private tmpfs (namespaces mode)."""


@dataclass
class ProgramRun:
    stdout: str
    stderr: str
    returncode: int | None
    timed_out: bool
    output_exceeded: bool
    results: list[str]
    """Lines from the result pipe (assert mode), unparsed."""


_CAPS: dict[str, bool] | None = None
_CAPS_LOCK = threading.Lock()


def isolation_report() -> dict[str, bool]:
    """What this host offers: {"root", "namespaces"}; probed once by running the harness."""
    global _CAPS
    with _CAPS_LOCK:
        if _CAPS is None:
            caps = {"root": hasattr(os, "geteuid") and os.geteuid() == 0, "namespaces": False}
            if caps["root"] and sys.platform.startswith("linux"):
                try:
                    run = _run_program(
                        "import socket", None, "stdio", SandboxLimits(wall_s=10), True, False, ""
                    )
                    caps["namespaces"] = run.returncode == 0
                except OSError:
                    pass
            _CAPS = caps
        return dict(_CAPS)


def _resolve_isolation(isolation: str) -> bool:
    if isolation == "none":
        return False
    report = isolation_report()
    ok = report["namespaces"]
    if not ok and report["root"]:
        log.warning(
            "code sandbox: namespaces unavailable; untrusted code will run as root (isolation='none')"
        )
    if isolation == "namespaces" and not ok:
        raise RuntimeError("sandbox isolation='namespaces' needs root on Linux with unshare(2); use 'auto'")
    if isolation not in ("auto", "namespaces"):
        raise ValueError(f"isolation must be 'auto', 'namespaces' or 'none', got {isolation!r}")
    return ok


def run_program(
    code: str,
    stdin: str = "",
    *,
    limits: SandboxLimits = SandboxLimits(),
    isolation: str = "auto",
    site_packages: bool = False,
) -> ProgramRun:
    """Run `code` as a script (`__name__ == "__main__"`) with `stdin`; returns its output."""
    return _run_program(code, None, "stdio", limits, _resolve_isolation(isolation), site_packages, stdin)


def run_assert_tests(
    code: str,
    tests: dict,
    *,
    limits: SandboxLimits = SandboxLimits(),
    isolation: str = "auto",
    site_packages: bool = False,
) -> list[bool]:
    """Load `code` as a module, then run the test cases against it in the same interpreter.

    tests: {"kind": "sources", "cases": [src, ...]} (each source one all-or-nothing case) or
    {"kind": "functions", "cases": [src], "functions": ["test_a", ...]} (each test_* one case).
    Returns one bool per case; a case passes only if the harness reported it with this run's nonce.
    """
    n = len(tests["functions"]) if tests["kind"] == "functions" else len(tests["cases"])
    nonce = secrets.token_hex(16)
    payload = dict(tests, nonce=nonce)
    run = _run_program(code, payload, "assert", limits, _resolve_isolation(isolation), site_packages, None)
    passed = [False] * n
    for line in run.results:
        parts = line.split(" ")
        if len(parts) == 3 and parts[0] == nonce and parts[1].isdigit() and int(parts[1]) < n:
            passed[int(parts[1])] = parts[2] == "1" and not run.output_exceeded
    return passed


def _blob(text: str) -> bytes:
    data = text.encode("utf-8", "replace")
    return len(data).to_bytes(8, "little") + data


def _run_program(code, tests, mode, limits, isolate, site_packages, stdin) -> ProgramRun:
    slot = _SLOTS.get()
    workdir = None if isolate else tempfile.mkdtemp(prefix="grpokit-sandbox-")
    try:
        payload_r, payload_w = os.pipe()
        result_r, result_w = os.pipe()
        cfg = dict(asdict(limits), mode=mode, isolate=isolate, uid=UID_BASE + slot, workdir=workdir)
        cfg.update(payload_fd=payload_r, result_fd=result_w)
        flags = ["-I", "-B"] + ([] if site_packages else ["-S"])
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
        try:
            proc = subprocess.Popen(
                [sys.executable, *flags, HARNESS, json.dumps(cfg)],
                stdin=subprocess.PIPE if mode == "stdio" else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(payload_r, result_w),
                env=env,
                cwd="/",
                start_new_session=True,
            )
        finally:
            os.close(payload_r)
            os.close(result_w)
        return _collect(proc, code, tests, stdin, payload_w, result_r, limits)
    finally:
        if workdir:
            shutil.rmtree(workdir, ignore_errors=True)
        _SLOTS.put(slot)


def _feed(fd: int, chunks: list[bytes]) -> None:
    try:
        for c in chunks:
            view = memoryview(c)
            while view:
                n = os.write(fd, view)
                view = view[n:]
    except OSError:
        pass  # the child died or closed the pipe: its result will say so
    finally:
        os.close(fd)


def _collect(proc, code, tests, stdin, payload_w, result_r, limits) -> ProgramRun:
    chunks = [_blob(code)] + ([_blob(json.dumps(tests))] if tests is not None else [])
    feeders = [threading.Thread(target=_feed, args=(payload_w, chunks), daemon=True)]
    if proc.stdin is not None:
        data = (stdin or "").encode("utf-8", "replace")
        feeders.append(
            threading.Thread(target=_feed, args=(os.dup(proc.stdin.fileno()), [data]), daemon=True)
        )
        proc.stdin.close()
    for t in feeders:
        t.start()
    sel = selectors.DefaultSelector()
    bufs = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray(), result_r: bytearray()}
    for fd in bufs:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    deadline = time.monotonic() + limits.wall_s
    timed_out = exceeded = False
    exited_at = None
    while sel.get_map():
        now = time.monotonic()
        if now > deadline:
            timed_out = proc.poll() is None
            break
        if exited_at is None and proc.poll() is not None:
            exited_at = now
        if exited_at is not None and now - exited_at > 0.5:
            break  # leftovers (no namespaces) keep pipes open: stop waiting for them
        for key, _ in sel.select(timeout=min(0.05, max(0.0, deadline - now))):
            try:
                data = os.read(key.fd, 65536)
            except BlockingIOError:
                continue
            if not data:
                sel.unregister(key.fd)
                continue
            bufs[key.fd] += data
        if len(bufs[proc.stdout.fileno()]) + len(bufs[proc.stderr.fileno()]) > limits.max_output_bytes:
            exceeded = True
            break
    _kill_group(proc)
    sel.close()
    out, err, res = (
        bytes(bufs[proc.stdout.fileno()]),
        bytes(bufs[proc.stderr.fileno()]),
        bytes(bufs[result_r]),
    )
    proc.stdout.close()
    proc.stderr.close()
    os.close(result_r)
    try:
        rc = proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        rc = None
    return ProgramRun(
        stdout=out.decode("utf-8", "replace"),
        stderr=err[-4000:].decode("utf-8", "replace"),
        returncode=None if timed_out else rc,
        timed_out=timed_out,
        output_exceeded=exceeded,
        results=res.decode("ascii", "replace").splitlines(),
    )


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
