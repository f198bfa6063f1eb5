"""What the sandbox adds to its namespaces (loaded by file path by `_harness.py`, never imported by
grpokit): a seccomp filter, and pid 1 of the sandbox as a guard that bounds the memory of all its
processes together.

Seccomp (x86_64; any other architecture's system calls fail with EPERM). Refused:
  - the kernel keyrings: keyctl, add_key, request_key (EPERM). The sandbox inherits its caller's
    session keyring; without these calls it can neither read a key nor leave one for the next run;
  - AF_VSOCK sockets (EAFNOSUPPORT): the network namespace does not cover vsock, the host's or a
    hypervisor's (a Firecracker or QEMU guest talks to its host over it);
  - file locks: flock, and fcntl's F_SETLK/F_SETLKW/F_OFD_SETLK/F_OFD_SETLKW/F_SETLEASE (ENOLCK).
    The read-only files bound from the host are the same inodes as the host's: a lock on one is a
    channel between concurrent sandboxes and can block a host process that locks it too. Programs
    that lock their own files in /tmp (sqlite) fail;
  - inotify and fanotify instances (EPERM): they are counted per user, the trainer's user too, and
    a sandbox could use them all up;
  - io_uring (its operations bypass this filter), bpf, userfaultfd, perf_event_open (EPERM).

Memory: RLIMIT_AS bounds each process at `memory_mb`; pid 1 (`guard`) forks the candidate, then
every 10 ms adds up the resident memory (RSS) of every process of the pid namespace and kills them
all (by exiting: the kernel kills the namespace with its init) when the sum passes `memory_mb`. So
the completion as a whole holds at most `memory_mb` MiB plus what its processes can touch in 10 ms
(each one is capped at `memory_mb` by RLIMIT_AS). RSS counts pages shared by forked processes once
per process (conservative). The writable /tmp (`tmpfs_mb`) comes on top. A memory cgroup would be
exact, but needs a writable, delegated cgroup tree that unprivileged users and containers rarely
have; this works for root and non-root alike. pid 1 is not dumpable, so the candidate (same uid,
no capabilities) can neither ptrace it nor read its memory, and signals from inside the namespace
do not reach it (it installs no handlers).
"""

import ctypes
import os
import signal
import struct
import time

AUDIT_ARCH_X86_64 = 0xC000003E
SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO = 0x7FFF0000, 0x00050000
EPERM, ENOLCK, EAFNOSUPPORT = 1, 37, 97
PR_SET_DUMPABLE, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 4, 22, 2
DENIED = {  # x86_64 system call numbers
    "flock": 73,
    "add_key": 248,
    "request_key": 249,
    "keyctl": 250,
    "inotify_init": 253,
    "inotify_init1": 294,
    "perf_event_open": 298,
    "fanotify_init": 300,
    "bpf": 321,
    "userfaultfd": 323,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
}
SOCKET, FCNTL, AF_VSOCK = 41, 72, 40
LOCK_CMDS = (6, 7, 37, 38, 1024)  # F_SETLK, F_SETLKW, F_OFD_SETLK, F_OFD_SETLKW, F_SETLEASE
POLL_S = 0.01


def _filter() -> bytes:
    """The BPF program (struct sock_filter[]) of the rules above."""
    prog = []  # (code, jt, jf, k); jumps are relative to the next instruction

    def ld(offset):
        prog.append((0x20, 0, 0, offset))  # BPF_LD | BPF_W | BPF_ABS

    def ret(value):
        prog.append((0x06, 0, 0, value))  # BPF_RET | BPF_K

    def jeq(k, jt=0, jf=0):
        prog.append((0x15, jt, jf, k))  # BPF_JMP | BPF_JEQ | BPF_K

    ld(4)  # arch
    jeq(AUDIT_ARCH_X86_64, 1, 0)
    ret(SECCOMP_RET_ERRNO | EPERM)
    ld(0)  # nr
    prog.append((0x35, 0, 1, 0x40000000))  # BPF_JGE: x32 system calls
    ret(SECCOMP_RET_ERRNO | EPERM)
    for nr in DENIED.values():
        jeq(nr, 0, 1)
        ret(SECCOMP_RET_ERRNO | EPERM)
    jeq(SOCKET, 0, 4)
    ld(16)  # args[0] (low 32 bits): the domain
    jeq(AF_VSOCK, 0, 1)
    ret(SECCOMP_RET_ERRNO | EAFNOSUPPORT)
    ret(SECCOMP_RET_ALLOW)
    jeq(FCNTL, 0, 3 + len(LOCK_CMDS))
    ld(24)  # args[1] (low 32 bits): the command
    for i, cmd in enumerate(LOCK_CMDS):
        jeq(cmd, len(LOCK_CMDS) - i, 0)
    ret(SECCOMP_RET_ALLOW)
    ret(SECCOMP_RET_ERRNO | ENOLCK)
    ret(SECCOMP_RET_ALLOW)
    return b"".join(struct.pack("<HBBI", *ins) for ins in prog)


def apply_seccomp(libc) -> None:
    """Install the filter on this process (and all it will start). Needs no_new_privs set."""
    code = _filter()
    buf = ctypes.create_string_buffer(code, len(code))
    prog = struct.pack("<HxxxxxxQ", len(code) // 8, ctypes.addressof(buf))
    fprog = ctypes.create_string_buffer(prog, len(prog))
    ulong = ctypes.c_ulong
    if (
        libc.prctl(
            PR_SET_SECCOMP, ulong(SECCOMP_MODE_FILTER), ulong(ctypes.addressof(fprog)), ulong(0), ulong(0)
        )
        != 0
    ):
        err = ctypes.get_errno()
        raise OSError(err, f"seccomp: {os.strerror(err)}")


def _resident_bytes(page: int) -> int:
    total = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/statm", "rb") as f:
                    total += int(f.read().split()[1]) * page
            except (OSError, ValueError, IndexError):
                pass  # gone meanwhile
    return total


def guard(child: int, memory_mb: int, libc) -> None:
    """pid 1 of the sandbox after forking the candidate `child`: reap every process, bound their
    memory together, and exit with the candidate's status (the kernel then kills the rest)."""
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    limit, page = memory_mb << 20, os.sysconf("SC_PAGE_SIZE")
    while True:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                os._exit(125)
            if pid == 0:
                break
            if pid == child:
                code = os.waitstatus_to_exitcode(status)
                os._exit(code & 0xFF if code >= 0 else 128 - code)
        if _resident_bytes(page) > limit:
            os._exit(128 + signal.SIGKILL)  # as if killed: the namespace goes with us
        time.sleep(POLL_S)
