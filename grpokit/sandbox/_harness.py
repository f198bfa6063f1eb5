"""Sandbox side of the code sandbox: runs model-written code. A script started by `parent.py`,
never imported by grpokit. It never sees a test, an expected value or a verdict.

argv[1] is a JSON config: mode, limits, whether to isolate, and the numbers of the pipes it gets:
  ctl    (parent -> here) one byte "g" once the uid/gid maps are written; end of file = stop now
  status (here -> parent) "u" once the namespaces exist, "e" if that failed
  req    (parent -> here) framed JSON: first the code, then (serve mode) one call per message
  resp   (here -> parent, serve mode) one framed JSON answer per call

Processes (isolate=True, root or not):
  outer: drops supplementary groups if root, unshare(user, mount, pid, net, ipc, uts), "u" -> the
    parent writes uid_map/gid_map ("1000 <outside uid> 1": the trainer's own uid, or as root one
    unprivileged uid per concurrent sandbox) -> "g" -> setresuid(1000) -> fork:
  init (pid 1 of the new pid namespace): builds a new root on a small tmpfs with /usr, /lib*, /bin,
    /sbin, the interpreter's prefix (and site-packages if asked) bound read-only, /dev/{null,zero,
    full,random,urandom}, an empty /proc (`PROC_SHOWN`), and a writable tmpfs of `tmpfs_mb` MiB and
    `tmpfs_inodes` entries at /tmp (cwd, HOME, TMPDIR); pivot_root into it and detach the host's root; the new root is remounted read-only;
    max_user_namespaces = 0 in its user namespace (no nested namespaces, hence no new mounts);
    all capabilities dropped, no_new_privs, rlimits, a new session, the seccomp filter of
    `_confine.py`; then it forks the candidate (pid 2) and stays as its guard: it reaps, bounds
    the memory of all the sandbox's processes together, and exits with the candidate's status.
  The outer process waits for init or for end of file on ctl, whichever comes first, and then
  SIGKILLs init, which takes every process of the pid namespace with it (the kernel kills them
  all when pid 1 dies). The candidate cannot see or signal the outer process, its parent's
  processes or anything else outside: they are not in its pid namespace.

serve mode: the code runs once as module `__solution__`; then each request {"name", "args",
"kwargs"} calls that global with plain-data arguments and answers {"ok": value}, {"raise": true}
(whatever it raised: the driver learns nothing more) or {"error": text} (not plain data). stdio mode: the code runs as `__main__` with the parent's stdin,
stdout and stderr; the exit status is relayed.

isolate=False (only with isolation="none"): no namespaces, no uid change; rlimits, a new session
and a scratch directory made by the parent.
"""

import ctypes
import json
import os
import resource
import select
import signal
import sys
from importlib.util import module_from_spec, spec_from_file_location

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC, MS_PRIVATE, MS_RELATIME = (
    1024,
    2048,
    4096,
    16384,
    1 << 18,
    1 << 21,
)
ST_TO_MS = {2: MS_NOSUID, 4: MS_NODEV, 8: MS_NOEXEC, 1024: MS_NOATIME, 2048: MS_NODIRATIME, 4096: MS_RELATIME}
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 24, 38
SANDBOX_ID = 1000
ROOT = "/tmp"  # mount point of the new root's tmpfs, inside the private mount namespace only
HOST_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32")
DEVICES = ("null", "zero", "full", "random", "urandom")
PROC_SHOWN = ()
"""What the candidate's /proc shows (files of the sandbox's procfs, bound read-only): an allowlist, and it is
empty; /sys is not mounted either. An entry belongs here only if no other sandbox can move it. A program
needs nothing there (the interpreter and the C library use system calls: os.cpu_count reads
sched_getaffinity), and almost every file of procfs shows the whole machine (meminfo, stat, loadavg,
sys/fs/inode-nr, ...), which another sandbox moves. Even a procfs of the sandbox's own processes only
(subset=pid) shows, in each /proc/PID/net, kernel-wide protocol counters (sockets allocated, their
memory). The guard counts through a procfs of its own, detached with the host's root (`_guard_proc`)."""
STOP_GRACE_S = 0.05
NOFILE = 64
"""Open descriptors per process (RLIMIT_NOFILE)."""
SIGPENDING = 64
"""Signals queued and POSIX timers of one sandbox together (RLIMIT_SIGPENDING): the count is also charged
to the trainer's uid, whose quota it must not use up."""


def _load(name):
    spec = spec_from_file_location(
        f"_grpokit{name}", os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
    )
    module = module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


plain, confine = _load("_plain"), _load("_confine")
libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
libc.syscall.restype = ctypes.c_long


def _check(ret, what):
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(src, dst, fstype, flags, data=None):
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    _check(libc.mount(enc(src), enc(dst), enc(fstype), flags, enc(data)), f"mount {dst}")


def _bind_ro(src, dst, sources):
    """Bind host path `src` at `dst` read-only, keeping the locked flags of its mount (nosuid, ...).
    The source is reached through an O_PATH descriptor opened before the uid changed: as root,
    the interpreter may live under a directory the sandbox uid cannot enter (/root/.pyenv)."""
    fd = sources[src]
    _mount(f"/proc/self/fd/{fd}", dst, None, MS_BIND | MS_REC)
    keep = 0
    f_flag = os.fstatvfs(fd).f_flag
    for st, ms in ST_TO_MS.items():
        if f_flag & st:
            keep |= ms
    _mount(None, dst, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | keep)


def _open_sources(cfg):
    """O_PATH descriptors of every host path the new root shows (taken before the uid changes)."""
    paths = [d for d in HOST_DIRS if os.path.isdir(d) and not os.path.islink(d)]
    paths += _readonly_paths(cfg["site_packages"])
    paths += [f"/dev/{name}" for name in DEVICES] + [p for p in ("/etc/ld.so.cache",) if os.path.isfile(p)]
    return {p: os.open(p, os.O_PATH | os.O_CLOEXEC) for p in paths}


def _readonly_paths(site_packages):
    """Host paths the interpreter needs: system dirs and its prefix (+ site-packages if asked)."""
    paths = {os.path.realpath(p) for p in (sys.base_prefix, sys.base_exec_prefix)}
    paths.add(os.path.dirname(os.path.realpath(sys.executable)))
    if site_packages:
        paths.update(os.path.realpath(p) for p in sys.path if p and os.path.isdir(p))
    paths = {p for p in paths if not any(p == d or p.startswith(d + "/") for d in HOST_DIRS)}
    return sorted(p for p in paths if not any(p.startswith(q + "/") for q in paths))


def _build_root(cfg, sources):
    """Private mounts and pivot_root into a minimal read-only root with a size-capped /tmp."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("tmpfs", ROOT, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,nr_inodes=512,mode=755")
    for d in HOST_DIRS:
        if os.path.islink(d):
            os.symlink(os.readlink(d), ROOT + d)
        elif os.path.isdir(d):
            os.mkdir(ROOT + d)
            _bind_ro(d, ROOT + d, sources)
    # The interpreter's paths as _open_sources resolved them, before /tmp was covered: resolving them
    # again here would fail for an interpreter or venv that lives under /tmp (its symlinks are hidden).
    for p in sorted(p for p in sources if p not in HOST_DIRS and not p.startswith(("/dev/", "/etc/"))):
        os.makedirs(ROOT + p, exist_ok=True)
        _bind_ro(p, ROOT + p, sources)
    os.makedirs(ROOT + "/etc")
    os.mkdir(ROOT + "/dev")
    for p in sources:
        if p.startswith(("/dev/", "/etc/")):
            open(ROOT + p, "w").close()
            _mount(f"/proc/self/fd/{sources[p]}", ROOT + p, None, MS_BIND)
            if p.startswith("/etc/"):
                _mount(
                    None, ROOT + p, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC
                )
    for fd in sources.values():
        os.close(fd)
    os.mkdir(ROOT + "/proc")  # empty: see PROC_SHOWN
    os.mkdir(ROOT + "/tmp")
    tmp = f"size={int(cfg['tmpfs_mb'])}m,nr_inodes={int(cfg['tmpfs_inodes'])},mode=700"
    _mount("tmpfs", ROOT + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, tmp)
    full_proc = _guard_proc()
    for name in PROC_SHOWN:  # each a file bound read-only from the sandbox's own procfs
        open(f"{ROOT}/proc/{name}", "w").close()
        _mount(f"/proc/{name}", f"{ROOT}/proc/{name}", None, MS_BIND)
        _mount(None, f"{ROOT}/proc/{name}", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.chdir(ROOT)
    _check(libc.syscall(155, b".", b"."), "pivot_root")  # 155: pivot_root on x86_64
    _check(libc.umount2(b".", MNT_DETACH), "detach the host root")
    os.chdir("/")
    _mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    # No nested user namespaces: without them the candidate cannot get back a capability to
    # mount (an unbounded tmpfs, say) or to undo the above.
    fd = os.open("sys/user/max_user_namespaces", os.O_WRONLY, dir_fd=full_proc)
    try:
        os.write(fd, b"0")
    finally:
        os.close(fd)
    return full_proc


def _guard_proc():
    """A descriptor of a whole procfs of the sandbox's pid namespace for the guard, which counts through it
    (/proc/PID/fd, maps, status and /proc/sysvipc, which the candidate's /proc does not show). It is mounted
    over the host's /proc of this mount namespace, so detaching the host's root detaches it too (one
    unmount, not two: each waits for the kernel's RCU); nothing the candidate can reach leads to it (it
    closes its copy of the descriptor when forked)."""
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    return os.open("/proc", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def _drop_capabilities():
    for cap in range(64):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            break
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
    data = (ctypes.c_uint32 * 6)()
    _check(libc.capset(header, data), "capset")
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")


def _limit(cfg):
    def both(which, value):
        resource.setrlimit(which, (value, value))

    cpu = max(1, int(-(-float(cfg["cpu_s"]) // 1)))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    both(resource.RLIMIT_AS, int(cfg["memory_mb"]) << 20)
    both(resource.RLIMIT_FSIZE, int(cfg["file_mb"]) << 20)
    both(resource.RLIMIT_NOFILE, NOFILE)
    both(resource.RLIMIT_CORE, 0)
    both(resource.RLIMIT_NPROC, int(cfg["max_processes"]))
    both(resource.RLIMIT_MSGQUEUE, 0)  # no POSIX message queue: their memory is charged to the uid
    both(resource.RLIMIT_SIGPENDING, SIGPENDING)


def _serve(cfg, req, resp):
    code = plain.recv(req, cfg["max_message_bytes"])
    ns = {"__name__": "__solution__", "__builtins__": __builtins__}
    dumps, send, recv, encode, decode = plain.dumps, plain.write_all, plain.recv, plain.encode, plain.decode
    try:
        exec(compile(code, "<solution>", "exec", dont_inherit=True), ns)
        answer = {"ok": None}
    except BaseException as e:  # noqa: BLE001 - the candidate's top level failed; the driver is told
        answer = {"error": f"top level raised {type(e).__name__}"}
    send(resp, dumps(answer))
    if "error" in answer:
        os._exit(3)
    while True:
        request = recv(req, cfg["max_message_bytes"])
        try:
            args = decode(request["args"])
            kwargs = decode(request["kwargs"])
            fn = ns.get(request["name"])
            if not callable(fn):
                answer = {"raise": True}  # no such function
            else:
                answer = {"ok": encode(fn(*args, **kwargs))}
        except plain.NotPlain as e:
            answer = {"error": str(e)}
        except BaseException:  # noqa: BLE001 - the driver sees one opaque "candidate raised"
            answer = {"raise": True}
        try:
            data = dumps(answer)
        except BaseException:  # noqa: BLE001
            data = dumps({"error": "answer not serialisable"})
        send(resp, data)


def _stdio(cfg, req):
    code = plain.recv(req, cfg["max_message_bytes"])
    os.close(req)
    ns = {"__name__": "__main__", "__builtins__": __builtins__}
    status = 0
    try:
        exec(compile(code, "<solution>", "exec", dont_inherit=True), ns)
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException as e:  # noqa: BLE001
        import traceback

        note = limit_note(e, cfg)
        if note:
            e.add_note(note)
        traceback.print_exc()
        status = 1
    try:
        sys.stdout.flush()
    except BaseException:  # noqa: BLE001
        status = status or 1
    os._exit(status & 0xFF)


def limit_note(e, cfg):
    """The sandbox limit an uncaught error of the program most likely ran into, in words (None when
    none): the kernel's message ("No space left on device") does not say which limit it was."""
    errno = getattr(e, "errno", None)
    if isinstance(e, MemoryError):
        return f"sandbox limit: {cfg['memory_mb']} MiB of address space per process (memory_mb)"
    if errno == 28:  # ENOSPC: /tmp's files or its bytes
        try:
            st = os.statvfs(cfg.get("workdir") or "/tmp")
            out_of_inodes = st.f_favail == 0 and st.f_files > 0
        except OSError:
            out_of_inodes = False
        if out_of_inodes:
            return (
                f"sandbox limit: /tmp holds at most {cfg['tmpfs_inodes']} files, directories and links "
                "together (tmpfs_inodes)"
            )
        return f"sandbox limit: /tmp holds at most {cfg['tmpfs_mb']} MiB (tmpfs_mb)"
    notes = {
        27: f"sandbox limit: a file may hold at most {cfg['file_mb']} MiB (file_mb)",  # EFBIG
        24: f"sandbox limit: at most {NOFILE} open files per process",  # EMFILE
        11: f"sandbox limit: at most {cfg['max_processes']} processes and threads (max_processes)",  # EAGAIN
        95: "sandbox limit: extended attributes (xattrs) are refused in the sandbox",  # EOPNOTSUPP
    }
    if errno in notes:
        return notes[errno]
    if isinstance(e, RuntimeError) and "can't start new thread" in str(e):
        return notes[11]
    return None


def _candidate(cfg, fds, sources):
    """Init of the sandbox (or, without isolation, just the child): set up, then run the code."""
    os.close(fds["ctl"])
    os.close(fds["status"])
    full_proc = None
    if cfg["isolate"]:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        full_proc = _build_root(cfg, sources)
        _drop_capabilities()
        workdir = "/tmp"
    else:
        workdir = cfg["workdir"]
        _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    os.setsid()
    os.chdir(workdir)
    os.environ.clear()
    os.environ.update(PATH="/usr/local/bin:/usr/bin:/bin", LANG="C.UTF-8", HOME=workdir, TMPDIR=workdir)
    _limit(cfg)
    diag = confine.diag_socket() if cfg["isolate"] else None  # before the filter refuses AF_NETLINK
    confine.apply_seccomp(libc, unix_only=cfg["isolate"])
    if cfg["isolate"]:  # pid 1 stays as the guard of the sandbox's memory; the candidate is pid 2
        ready_r, ready_w = os.pipe()
        child = os.fork()
        if child != 0:
            os.close(ready_w)
            said = os.dup(2)  # why the guard stopped the sandbox goes to its stderr (stdio mode)
            null = os.open("/dev/null", os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)  # the pipes are the candidate's (and `said`, the guard's till it exits)
            for fd in (fds["req"], fds["resp"]):
                if fd is not None:
                    os.close(fd)
            os.read(ready_r, 1)  # the candidate is dumpable (or gone)
            os.close(ready_r)
            confine.guard(child, int(cfg["memory_mb"]), libc, diag, full_proc, said)
        diag.close()
        os.close(full_proc)
        os.close(ready_r)
        # The uid change left the process undumpable: the guard (same uid, no capabilities) could not
        # see its descriptors. A process that makes itself undumpable again ends the run (`_confine.py`).
        libc.prctl(confine.PR_SET_DUMPABLE, 1, 0, 0, 0)
        os.close(ready_w)
    sys.setrecursionlimit(10_000)
    sys.set_int_max_str_digits(0)  # printing a 5,000-digit answer costs only the candidate's own CPU
    if cfg["mode"] == "serve":
        _serve(cfg, fds["req"], fds["resp"])
    else:
        _stdio(cfg, fds["req"])


def _unshare(cfg, fds):
    if os.geteuid() == 0:
        os.setgroups([])
    flags = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
    try:
        _check(libc.unshare(flags), "unshare")
    except OSError:
        os.write(fds["status"], b"e")
        raise
    os.write(fds["status"], b"u")
    if os.read(fds["ctl"], 1) != b"g":
        os._exit(1)  # the parent gave up
    sources = _open_sources(cfg)  # in the new mount namespace, still with the caller's access
    os.setresgid(SANDBOX_ID, SANDBOX_ID, SANDBOX_ID)
    os.setresuid(SANDBOX_ID, SANDBOX_ID, SANDBOX_ID)
    return sources


def main(cfg=None):
    """The harness's outer process (never returns): `cfg` as `sandbox.Sandbox` makes it."""
    cfg = cfg if cfg is not None else json.loads(sys.argv[1])
    fds = cfg["fds"]
    sources = {}
    if cfg["isolate"]:
        sources = _unshare(cfg, fds)
    else:
        os.write(fds["status"], b"u")
        if os.read(fds["ctl"], 1) != b"g":
            os._exit(1)
    pid = os.fork()
    if pid == 0:
        try:
            _candidate(cfg, fds, sources)
        except BaseException as e:  # noqa: BLE001 - set-up failed: say why on stderr, never run the code
            os.write(2, f"grpokit sandbox set-up failed: {e!r}\n".encode())
        os._exit(125)
    for fd in [fds["req"], fds["resp"], *sources.values()]:
        if fd is not None:
            os.close(fd)
    # Wait for the candidate to end or the parent to say stop (or die: end of file on ctl).
    child = os.pidfd_open(pid)
    ready, _, _ = select.select([child, fds["ctl"]], [], [])
    if child not in ready:  # a candidate that has just ended is let finish its exit (its status is kept)
        ready, _, _ = select.select([child], [], [], STOP_GRACE_S)
    if child not in ready:
        os.kill(pid, signal.SIGKILL)  # pid 1 of its namespace: the kernel kills all the rest
    if not cfg["isolate"]:
        try:
            os.killpg(pid, signal.SIGKILL)  # its session's group; processes that left it survive
        except OSError:
            pass
    _, status = os.waitpid(pid, 0)
    os._exit(os.waitstatus_to_exitcode(status) & 0xFF if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))


if __name__ == "__main__":
    main()
