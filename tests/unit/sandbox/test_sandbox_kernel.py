"""Kernel memory a sandboxed program can make outside its processes' memory, and /proc as a channel
between sandboxes (issue 51). Real sandboxes throughout; the hostile-program suite
(tests/hostile_programs.py) runs the file, link, xattr and counter attacks as root and as user nobody."""

import ast
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest

from grpokit.sandbox import SandboxLimits, isolation_report, run_program

pytestmark = pytest.mark.skipif(
    not isolation_report()["namespaces"],
    reason=f"no user namespaces here, the sandbox refuses to run: {isolation_report()['reason']}",
)


def run(code: str, **limits) -> "object":
    return run_program(code, limits=SandboxLimits(**{"wall_s": 30, "cpu_s": 30, **limits}))


FILL = """import os
made, error = {{}}, None
def fill(kind, make):
    n = 0
    try:
        while n < 5000:
            make(n)
            n += 1
    except OSError as e:
        made[kind] = n
        return e
    made[kind] = n
open("a", "w").close()
os.mkdir("d")
for kind, make in [("files", lambda n: open(f"d/f{{n}}", "w").close()),
                   ("links", lambda n: os.link("a", f"d/{{n:0250d}}")),
                   ("dirs", lambda n: os.mkdir(f"d/x{{n}}")),
                   ("symlinks", lambda n: os.symlink("a", f"d/s{{n}}"))]:
    error = fill(kind, make) or error
    for name in os.listdir("d"):
        (os.rmdir if name.startswith("x") else os.unlink)(f"d/{{name}}")
print(made, flush=True)
{last}
"""


def test_tmp_holds_at_most_tmpfs_inodes_entries_of_any_kind_and_says_so():
    """Files, hard links (with 250-character names), directories and symlinks each take one of /tmp's
    `tmpfs_inodes` (before: none was limited; 2 million empty files held 1.6 GiB of unreclaimable kernel
    memory in a sandbox of memory_mb=256). The error a program does not catch names the limit."""
    run_ = run(FILL.format(last="[open(f'd/g{n}', 'w').close() for n in range(100)]"), tmpfs_inodes=64)
    made = ast.literal_eval(run_.stdout.splitlines()[0])  # the program's own dict of counts
    # /tmp already holds itself, "a" and "d": 61 entries are left, whatever their kind
    assert made == {"files": 61, "links": 61, "dirs": 61, "symlinks": 61}
    assert "No space left on device" in run_.stderr
    assert (
        "sandbox limit: /tmp holds at most 64 files, directories and links together (tmpfs_inodes)"
        in run_.stderr
    )
    bytes_full = run("open('big', 'wb').write(b'x' * (3 << 20))", tmpfs_mb=2, file_mb=16)
    assert "sandbox limit: /tmp holds at most 2 MiB (tmpfs_mb)" in bytes_full.stderr


def test_extended_attributes_are_refused_and_the_error_says_so():
    """Extended attributes held up to 64 KiB of kernel memory each on /tmp (tmpfs keeps them in slab)."""
    run_ = run("import os\nopen('a', 'w').close()\nos.setxattr('a', 'user.k', b'v')")
    assert "[Errno 95] Operation not supported" in run_.stderr
    assert "sandbox limit: extended attributes (xattrs) are refused in the sandbox" in run_.stderr


MAPPINGS = """import mmap, os, time
keep = [mmap.mmap(-1, 4096, prot=mmap.PROT_READ | (mmap.PROT_WRITE if i % 2 else 0)) for i in range({n})]
for _ in range(5):
    if os.fork() == 0:
        time.sleep(5)
        os._exit(0)
time.sleep(1.5)
print("held", len(keep))
"""


def test_mappings_count_against_memory_mb():
    """One-page mappings (alternating protections, so that none merge) cost the kernel ~320 bytes each
    and no resident memory: six processes with 30,000 each held ~60 MiB of kernel memory the guard did
    not count (measured before: 8 x 58,860 held 150 MiB under memory_mb=256). Counted now at VMA_BYTES
    each, they stop the sandbox at memory_mb=160 (their resident memory is about half of it) and the
    sandbox's stderr says why; the same program with 100 mappings a process runs to its end."""
    few = run(MAPPINGS.format(n=100), memory_mb=160, max_processes=8)
    assert few.returncode == 0 and few.stdout == "held 100\n", few.stderr
    many = run(MAPPINGS.format(n=30000), memory_mb=160, max_processes=8)
    assert many.returncode == 128 + signal.SIGKILL and "held 30000" not in many.stdout
    assert "grpokit sandbox: stopped: its processes held" in many.stderr
    assert "memory_mb=160" in many.stderr


def test_proc_shows_nothing_and_sys_is_absent():
    """/proc is an allowlist, and it is empty: no file of the whole machine, no process (the guard's
    included), no /proc/self; /sys is not there at all. Honest programs still run (os.cpu_count)."""
    run_ = run(
        "import os\nprint(os.listdir('/proc'), os.path.exists('/sys'), os.cpu_count() >= 1)\n"
        "for p in ('/proc/self/status', '/proc/meminfo', '/proc/1/status'):\n"
        "    try:\n        open(p)\n        print('readable', p)\n    except OSError:\n        pass\n"
    )
    assert run_.returncode == 0 and run_.stdout == "[] False True\n", run_.stderr


# --- /proc entries that move while another sandbox works ------------------------------------------
PROBE = r"""
import hashlib, json, os, sys, time
SKIP = {"kcore", "kmsg", "kpagecount", "kpageflags", "kpagecgroup", "sysrq-trigger", "self", "thread-self",
        "mem", "pagemap", "clear_refs", "fd", "fdinfo", "task", "map_files", "ns", "cwd", "root", "exe",
        "attr", "mounts", "mountinfo", "mountstats"}
child = os.fork()
if child == 0:
    time.sleep(3600)
    os._exit(0)

def walk(path, key, out, depth=0):
    try:
        names = os.listdir(path)
    except OSError:
        return
    for name in names:
        if name in SKIP or (depth == 0 and name.isdigit()) or name.startswith("sysrq"):
            continue
        p, k = f"{path}/{name}", f"{key}{name}"
        if os.path.islink(p):
            continue
        if os.path.isdir(p):
            if depth < 6:
                walk(p, k + "/", out, depth + 1)
            continue
        try:
            fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            out[k] = hashlib.sha1(os.read(fd, 1 << 16)).hexdigest()
        except OSError:
            pass
        finally:
            os.close(fd)

print(json.dumps({"child": child}), flush=True)
for line in sys.stdin:
    out = {}
    walk("/proc", "", out)
    walk(f"/proc/{child}", "PID/", out, 1)
    print(json.dumps(out), flush=True)
"""

BUSY = r"""
import ctypes, os, signal, socket, time
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
libc = ctypes.CDLL(None, use_errno=True)
for _ in range(3):  # before the memory: forked children count what they share with it
    if os.fork() == 0:
        while True:
            pass
for n in range(300):
    open(f"f{n}", "w").close()
for n in range(200):
    try:
        os.stat(f"/usr/nonexistent-{n}")
    except OSError:
        pass
open("big", "wb").write(os.urandom(4 << 20))
held = bytearray(48 << 20)
for i in range(0, len(held), 4096):
    held[i] = 1
pipes = [os.pipe() for _ in range(10)]
pairs = [socket.socketpair() for _ in range(10)]
for a, b in pairs:
    a.send(b"x" * 60000)
for family in (socket.AF_INET, socket.AF_INET6):
    try:
        pairs.append((socket.socket(family), socket.socket(family, socket.SOCK_DGRAM)))
    except OSError:
        pass
libc.shmget(0, 1 << 20, 0o1600)
libc.msgget(0, 0o1600)
libc.prctl(15, TOKEN, 0, 0, 0)  # PR_SET_NAME: the test sees that the sandbox is busy
signal.sigtimedwait({signal.SIGUSR1}, 60)
"""


def _probe_namespace():
    """The probe: a user, PID, network and mount namespace with a whole procfs of its own, as the sandbox
    had before its /proc was an allowlist. Answers one JSON snapshot {entry: hash} per line it reads."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no unshare(1) here")
    probe = subprocess.Popen(
        [unshare, "-Urnpf", "--mount-proc", sys.executable, "-c", PROBE],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
    )  # fmt: skip
    line = probe.stdout.readline()
    if not line:
        probe.kill()
        pytest.skip("unshare -Urnpf --mount-proc failed here")
    return probe


def _snapshot(probe) -> dict:
    probe.stdin.write("snap\n")
    return json.loads(probe.stdout.readline())


def _pids_named(token: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() == token:
                    found.append(int(pid))
        except OSError:
            pass
    return found


def _while_busy(probe) -> tuple[dict, dict]:
    """Snapshots before another sandbox starts and while it holds files, memory, processes burning CPU,
    pipes, sockets and SysV objects (it names itself once it holds them all)."""
    token = "gk" + uuid.uuid4().hex[:10]
    before = _snapshot(probe)
    code = f"TOKEN = {token.encode()!r}\n" + BUSY
    done = threading.Thread(target=run, args=(code,), kwargs={"memory_mb": 256}, daemon=True)
    done.start()
    deadline = time.monotonic() + 60
    while not _pids_named(token) and done.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    busy = _pids_named(token)
    assert busy, "the busy sandbox never became busy"
    during = _snapshot(probe)
    for pid in busy:
        os.kill(pid, signal.SIGUSR1)
    done.join(60)
    return before, during


def test_no_proc_entry_that_moves_while_another_sandbox_works_is_readable():
    """The list is derived, not written down: every entry of a whole procfs (seen from a namespace like the
    sandbox's: its own pid and network namespaces) whose content changed while another sandbox worked, in
    either of two rounds; a sleeping process's own entries as PID/... . The test fails if a sandbox can
    read any of them, at their path or under /proc/self and a process of its own. Before the allowlist,
    the sandbox read /proc/sys/fs/inode-nr, dentry-state, meminfo, stat, loadavg, vmstat, ... (all moved)."""
    probe = _probe_namespace()
    try:
        moved = set()
        for _ in range(2):
            before, during = _while_busy(probe)
            moved |= {k for k in before.keys() & during.keys() if before[k] != during[k]}
    finally:
        probe.kill()
        probe.wait()
    assert {"meminfo", "stat"} <= moved  # the derivation sees what a busy sandbox moves
    paths = sorted(
        p
        for k in moved
        for p in ([f"/proc/self/{k[4:]}", f"/proc/2/{k[4:]}"] if k.startswith("PID/") else [f"/proc/{k}"])
    )
    check = (
        f"import json, os\nreadable = []\nfor p in {paths!r}:\n    try:\n        with open(p, 'rb') as f:\n"
        "            f.read(1)\n        readable.append(p)\n    except OSError:\n        pass\nprint(json.dumps(readable))\n"
    )
    result = run(check)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []
