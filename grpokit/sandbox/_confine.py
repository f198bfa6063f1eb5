"""What the sandbox adds to its namespaces (loaded by file path by `_harness.py`, never imported by
grpokit): a seccomp filter, and pid 1 of the sandbox as a guard that bounds the memory its processes
hold together.

Seccomp (x86_64; any other architecture's system calls fail with EPERM). Refused:
  - the kernel keyrings: keyctl, add_key, request_key (EPERM). The sandbox inherits its caller's
    session keyring; without these calls it can neither read a key nor leave one for the next run
    (/proc/keys, which lists the keys of its uid, is not in its /proc: see `_harness.PROC_SHOWN`);
  - every socket but AF_UNIX (EAFNOSUPPORT), by an allowlist: the network namespace has no interface
    up, so no other family can reach anything, and they are counted kernel-wide (the sockets of each
    protocol allocated, their memory), a channel between sandboxes; AF_VSOCK (the host's or a
    hypervisor's: a Firecracker or QEMU guest talks to its host over it) is not even in a network
    namespace, and the kernel queues AF_NETLINK answers in memory the guard does not count. Without
    isolation (the trainer's network) only AF_VSOCK and AF_NETLINK are refused;
  - counters of the whole machine: sysinfo (free memory, load, number of processes: another sandbox
    moves them; sysconf's _SC_PHYS_PAGES and _SC_AVPHYS_PAGES are then undefined) and syslog (the
    kernel log) (EPERM);
  - extended attributes: setxattr, lsetxattr, fsetxattr, setxattrat (EOPNOTSUPP, what a file system
    without them answers). On /tmp they are kernel memory outside any process (up to 64 KiB each);
  - file locks: flock, and fcntl's F_SETLK/F_SETLKW/F_OFD_SETLK/F_OFD_SETLKW/F_SETLEASE (ENOLCK).
    The read-only files bound from the host are the same inodes as the host's: a lock on one is a
    channel between concurrent sandboxes and can block a host process that locks it too. Programs
    that lock their own files in /tmp (sqlite) fail;
  - watching files: inotify, fanotify and fcntl's F_NOTIFY (EPERM). A watch on a host directory bound
    read-only reports what another completion, or the trainer, reads there; inotify instances are also
    counted per user, the trainer's user too;
  - the page cache as a channel between completions: posix_fadvise and readahead do nothing (they
    return 0: they are advice), so do madvise's MADV_COLD/MADV_PAGEOUT; mincore and cachestat
    (EPERM) and preadv2/pwritev2 with RWF_NOWAIT (EOPNOTSUPP) are refused, so a completion can
    neither evict a page of a shared file nor ask whether one is cached. Timing reads remains
    possible: timing side channels are out of scope;
  - memory outside any process and file system: memfd_create and memfd_secret (EPERM). Files in /tmp
    count against `tmpfs_mb`;
  - pipes larger than 64 KiB: fcntl's F_SETPIPE_SZ (EPERM). Pipe pages are counted per user, and
    as an unprivileged user the sandbox's user is the trainer's;
  - io_uring (its operations bypass this filter), bpf, userfaultfd, perf_event_open (EPERM).

Memory: RLIMIT_AS bounds each process at `memory_mb`; pid 1 (`guard`) forks the candidate, then
adds up what the processes of the sandbox hold (`_resident_bytes` + `unmapped_bytes`, read through a
procfs of its own that the candidate cannot reach) and kills them all (by exiting: the kernel kills the
namespace with its init, after a line on the sandbox's stderr that names memory_mb) when the sum passes
`memory_mb`; resident memory is counted every 10 ms, the rest every 50 ms (its count costs more):
  - the resident memory (RSS) of every process; RSS counts pages shared by forked processes once per
    process (conservative);
  - the pipes they hold open, at their largest size (64 KiB each); more than MAX_PIPES pipes kills
    the sandbox whatever its memory (a quota on the pipe pages of the uid);
  - SysV IPC objects, which outlive the processes that made them: shared memory segments no process
    has attached (their rss + swap; attached ones are in RSS), the bytes queued in message queues,
    semaphore sets. The sandbox has an IPC namespace of its own, so /proc/sysvipc lists its objects
    and only its objects, and they are all freed when its last process ends;
  - the data queued in its Unix sockets (sock_diag's sk_rmem_alloc + sk_wmem_alloc of every socket of
    its network namespace: sockets no process holds any more and sockets in flight as passed
    descriptors included);
  - the kernel's memory for their address spaces: page tables (VmPTE) and VMA_BYTES per mapping
    (`_kernel_bytes`): 65,530 one-page mappings a process fit in RLIMIT_AS and hold ~20 MiB.
A process that makes itself undumpable (its descriptors can no longer be counted) kills the sandbox.
So the completion as a whole holds at most `memory_mb` MiB plus what it can allocate in 10 ms (50 ms
outside its processes' memory), plus /tmp: its files' data (`tmpfs_mb`) and their metadata (at most
`tmpfs_inodes` files, directories, links and symlinks together, ~1 KiB of kernel memory each with a
name of up to 255 bytes; extended attributes refused). Not counted, bounded elsewhere: tasks (at most
`max_processes`, ~30 KiB of kernel memory each), descriptors (64 per process: sockets, epoll, eventfd,
timerfd; descriptors in flight in Unix sockets are bounded per uid by the kernel). Not bounded:
reclaimable caches, which the kernel frees under memory pressure: the page cache of the host files the
sandbox reads, and the dentries of names it looks up that do not exist (a lookup per microsecond).
For all sandboxes running at once the bound is the sum over them: at most 64 per scoring process
(`sandbox.take_slot`), as many as `workers` (code_tests) or the tool workers. POSIX message queues are refused
(RLIMIT_MSGQUEUE 0) and queued signals and POSIX timers are limited to 64 (RLIMIT_SIGPENDING; both
are charged to the trainer's uid as well), see `_harness.py`. A memory cgroup would be exact, but
needs a writable, delegated cgroup tree that unprivileged users and containers rarely have; this
works for root and non-root alike. pid 1 is not dumpable, so the candidate (same uid, no
capabilities) can neither ptrace it nor read its memory, and signals from inside the namespace do not
reach it (it installs no handlers).
"""

import ctypes
import os
import select
import signal
import socket
import struct

AUDIT_ARCH_X86_64 = 0xC000003E
SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO = 0x7FFF0000, 0x00050000
EPERM, ENOLCK, EAFNOSUPPORT, EOPNOTSUPP = 1, 37, 97, 95
PR_SET_DUMPABLE, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 4, 22, 2
DENIED = {  # x86_64 system call numbers: EPERM
    "mincore": 27,
    "flock": 73,
    "add_key": 248,
    "request_key": 249,
    "keyctl": 250,
    "inotify_init": 253,
    "inotify_init1": 294,
    "perf_event_open": 298,
    "fanotify_init": 300,
    "memfd_create": 319,
    "bpf": 321,
    "userfaultfd": 323,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "memfd_secret": 447,
    "cachestat": 451,
    "sysinfo": 99,
    "syslog": 103,
}
NO_XATTRS = {"setxattr": 188, "lsetxattr": 189, "fsetxattr": 190, "setxattrat": 463}  # EOPNOTSUPP
NO_OPS = {"readahead": 187, "fadvise64": 221}  # advice only: "done" (0), and nothing happens
SOCKET, FCNTL, MADVISE, PREADV2, PWRITEV2 = 41, 72, 28, 327, 328
AF_UNIX, AF_NETLINK, AF_VSOCK = 1, 16, 40
FCNTL_CMDS = (  # F_SETLK, F_SETLKW, F_OFD_SETLK, F_OFD_SETLKW, F_SETLEASE; F_NOTIFY; F_SETPIPE_SZ
    *((cmd, ENOLCK) for cmd in (6, 7, 37, 38, 1024)),
    (1026, EPERM),
    (1031, EPERM),
)
MADV_NO_OPS = (20, 21)  # MADV_COLD, MADV_PAGEOUT: "done" (0), and nothing happens
RWF_NOWAIT = 0x8
POLL_S = 0.01
FULL_COUNT_EVERY = 5
"""Resident memory is counted every POLL_S, the rest (`unmapped_bytes`) every 5th poll (50 ms)."""
MAX_PIPES = 256
"""Pipes one sandbox may hold open (each at most 64 KiB: F_SETPIPE_SZ is refused)."""
PIPE_BYTES = 16 * 4096
VMA_BYTES = 512
"""Kernel memory charged per mapping of a process (vm_area_struct, its anon_vma links and maple tree
share; about 320 bytes measured on Linux 6.18, rounded up)."""
MAX_MAP_COUNT = 65530  # vm.max_map_count's default; the guard reads the host's
MAPS_READ = 1 << 18
"""Bytes of /proc/<pid>/maps read per count (about 3,500 mappings); a longer list counts as MAX_MAP_COUNT."""
SEM_BYTES, IPC_OBJECT_BYTES = 64, 256  # kernel memory of one SysV semaphore, of one IPC object


def _filter(unix_only: bool = True) -> bytes:
    """The BPF program (struct sock_filter[]) of the rules above; without `unix_only` (isolation="none",
    where the program keeps the trainer's network) only AF_VSOCK and AF_NETLINK sockets are refused."""
    prog = []  # (code, jt, jf, k); jumps are relative to the next instruction

    def ld(offset):
        return [(0x20, 0, 0, offset)]  # BPF_LD | BPF_W | BPF_ABS

    def ret(value):
        return [(0x06, 0, 0, value)]  # BPF_RET | BPF_K

    def jeq(k, jt=0, jf=0):
        return [(0x15, jt, jf, k)]  # BPF_JMP | BPF_JEQ | BPF_K

    def on_arg(offset, cases):
        """Load the argument at `offset` (its low 32 bits); return value v where it equals k, for each
        (k, v) of cases; else allow."""
        body = ld(offset)
        for k, v in cases:
            body += jeq(k, 0, 1) + ret(v)
        return body + ret(SECCOMP_RET_ALLOW)

    def when(nr, body):  # the body runs only for system call nr, and always returns
        return jeq(nr, 0, len(body)) + body

    prog += ld(4)  # arch
    prog += jeq(AUDIT_ARCH_X86_64, 1, 0) + ret(SECCOMP_RET_ERRNO | EPERM)
    prog += ld(0)  # nr
    prog += [(0x35, 0, 1, 0x40000000)] + ret(SECCOMP_RET_ERRNO | EPERM)  # BPF_JGE: x32 system calls
    for nr in DENIED.values():
        prog += jeq(nr, 0, 1) + ret(SECCOMP_RET_ERRNO | EPERM)
    for nr in NO_XATTRS.values():
        prog += jeq(nr, 0, 1) + ret(SECCOMP_RET_ERRNO | EOPNOTSUPP)
    for nr in NO_OPS.values():
        prog += jeq(nr, 0, 1) + ret(SECCOMP_RET_ERRNO | 0)
    # args[i] is at 16 + 8 * i (the low 32 bits on little-endian x86_64)
    if unix_only:
        sockets = ld(16) + jeq(AF_UNIX, 0, 1) + ret(SECCOMP_RET_ALLOW) + ret(SECCOMP_RET_ERRNO | EAFNOSUPPORT)
    else:
        sockets = on_arg(16, [(d, SECCOMP_RET_ERRNO | EAFNOSUPPORT) for d in (AF_VSOCK, AF_NETLINK)])
    prog += when(SOCKET, sockets)
    prog += when(FCNTL, on_arg(24, [(c, SECCOMP_RET_ERRNO | e) for c, e in FCNTL_CMDS]))
    prog += when(MADVISE, on_arg(32, [(a, SECCOMP_RET_ERRNO | 0) for a in MADV_NO_OPS]))
    nowait = ld(56) + [(0x45, 0, 1, RWF_NOWAIT)]  # BPF_JMP | BPF_JSET: flags & RWF_NOWAIT
    nowait += ret(SECCOMP_RET_ERRNO | EOPNOTSUPP) + ret(SECCOMP_RET_ALLOW)
    prog += when(PREADV2, nowait) + when(PWRITEV2, nowait)
    prog += ret(SECCOMP_RET_ALLOW)
    assert all(jt < 256 and jf < 256 for _, jt, jf, _ in prog)
    return b"".join(struct.pack("<HBBI", *ins) for ins in prog)


def apply_seccomp(libc, unix_only: bool = True) -> None:
    """Install the filter on this process (and all it will start). Needs no_new_privs set."""
    code = _filter(unix_only)
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


def _read(proc: int, path: str, limit: int = 1 << 12) -> bytes:
    """Up to `limit` bytes of `path` under the guard's procfs (its descriptor `proc`), read in pieces of at
    most 1 MiB (a statm costs one small read, a long /proc/sysvipc/msg a few large ones)."""
    fd = os.open(path, os.O_RDONLY, dir_fd=proc)
    try:
        pieces, size = [], 0
        while size < limit:
            piece = os.read(fd, min(limit - size, 1 << 20))
            if not piece:
                break
            pieces.append(piece)
            size += len(piece)
        return b"".join(pieces)
    finally:
        os.close(fd)


def _resident_bytes(page: int, proc: int) -> tuple[int, list[str]]:
    """(resident memory of every process of the namespace, their pids), from /proc/<pid>/statm."""
    total, pids = 0, []
    for name in os.listdir(proc):
        if name.isdigit():
            try:
                total += int(_read(proc, f"{name}/statm").split()[1]) * page
                pids.append(name)
            except (OSError, ValueError, IndexError):
                pass  # gone meanwhile
    return total, pids


def _pipes(pids: list[str], proc: int) -> int:
    """How many pipes the processes `pids` hold open; 1 << 40 when one of them made itself undumpable
    (its descriptors cannot be listed: what it holds cannot be counted)."""
    pipes = set()
    for name in pids:
        try:
            fd_dir = os.open(f"{name}/fd", os.O_RDONLY | os.O_DIRECTORY, dir_fd=proc)
        except PermissionError:  # undumpable, or exiting (its memory already gone: statm is 0)
            if name != "1" and _has_memory(name, proc):
                return 1 << 40
            continue
        except OSError:
            continue  # gone meanwhile
        try:
            for fd in os.listdir(fd_dir):
                target = os.readlink(fd, dir_fd=fd_dir)
                if target.startswith("pipe:"):
                    pipes.add(target)
        except OSError:
            pass  # gone meanwhile
        finally:
            os.close(fd_dir)
    return len(pipes)


def _has_memory(pid: str, proc: int) -> bool:
    try:
        return int(_read(proc, f"{pid}/statm").split()[0]) > 0
    except (OSError, ValueError, IndexError):
        return False


def _kernel_bytes(pids: list[str], proc: int) -> int:
    """Kernel memory the processes `pids` hold for their address spaces: their page tables (VmPTE of
    /proc/<pid>/status) and VMA_BYTES per mapping (the lines of /proc/<pid>/maps; a list longer than
    MAPS_READ bytes counts as vm.max_map_count mappings). RLIMIT_AS does not bound these: 65,530 mappings
    of one page each fit in 256 MiB of address space and hold ~20 MiB of kernel memory per process."""
    total = 0
    for name in pids:
        if name == "1":
            continue  # the guard itself
        try:
            status = _read(proc, f"{name}/status")
            pte = status.split(b"VmPTE:", 1)
            if len(pte) == 2:
                total += int(pte[1].split()[0]) << 10
            maps = _read(proc, f"{name}/maps", MAPS_READ)
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile, or a kernel thread
        total += VMA_BYTES * (MAX_MAP_COUNT if len(maps) >= MAPS_READ else maps.count(b"\n"))
    return total


def _sysv_bytes(page: int, proc: int) -> int:
    """Memory held by the IPC namespace's SysV objects, which no process maps: shared memory segments
    attached by no process (rss + swap; attached ones are in their processes' RSS), queued messages,
    semaphore sets. Read from /proc/sysvipc, which shows the reader's IPC namespace (the sandbox's)."""
    total = 0
    for kind in ("shm", "msg", "sem"):
        try:
            lines = _read(proc, f"sysvipc/{kind}", 1 << 24).decode().splitlines()
        except OSError:
            continue
        header = lines[0].split() if lines else []
        rows = [dict(zip(header, line.split())) for line in lines[1:]]
        for row in rows:
            try:
                if kind == "shm":
                    if int(row["nattch"]) == 0:
                        total += int(row.get("rss", row["size"])) + int(row.get("swap", 0))
                elif kind == "msg":
                    total += int(row["cbytes"]) + IPC_OBJECT_BYTES * (1 + int(row["qnum"]))
                else:
                    total += SEM_BYTES * int(row["nsems"]) + IPC_OBJECT_BYTES
            except (KeyError, ValueError):
                total += IPC_OBJECT_BYTES
    return total


# sock_diag (netlink) for the Unix sockets of the network namespace, with their memory
SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, NLM_F_DUMP, NLMSG_DONE, NLMSG_ERROR = 20, 1, 0x300, 3, 2
UDIAG_SHOW_MEMINFO, UNIX_DIAG_MEMINFO = 0x20, 5


def diag_socket() -> socket.socket:
    """The guard's sock_diag socket, opened before the seccomp filter (which refuses AF_NETLINK)."""
    return socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, 4)  # NETLINK_SOCK_DIAG


def _socket_bytes(diag: socket.socket) -> int:
    """Memory queued in every Unix socket of the namespace (sk_rmem_alloc + sk_wmem_alloc), the ones
    that no process holds any more but whose data is still queued (or in flight as a passed descriptor)
    included: they are all in the namespace's table, which sock_diag dumps."""
    req = struct.pack("<BBHIII8x", socket.AF_UNIX, 0, 0, 0xFFFFFFFF, 0, UDIAG_SHOW_MEMINFO)
    diag.send(
        struct.pack("<IHHII", 16 + len(req), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, 1, 0) + req
    )
    total = 0
    while True:
        data = diag.recv(1 << 16)
        i = 0
        while i + 16 <= len(data):
            length, kind = struct.unpack_from("<IH", data, i)
            if kind in (NLMSG_DONE, NLMSG_ERROR) or length < 16:
                return total
            j, end = i + 16 + 16, i + length  # past nlmsghdr and unix_diag_msg: the attributes
            while j + 4 <= end:
                alen, atype = struct.unpack_from("<HH", data, j)
                if alen < 4:
                    break
                if atype == UNIX_DIAG_MEMINFO and alen >= 4 + 12:
                    rmem, _, wmem = struct.unpack_from("<III", data, j + 4)
                    total += rmem + wmem
                j += (alen + 3) & ~3
            i += (length + 3) & ~3
        if not data:
            return total


def unmapped_bytes(page: int, pids: list[str], diag: socket.socket | None, proc: int) -> int:
    """What the sandbox's processes hold besides their resident memory: pipes (at their largest size,
    64 KiB), SysV objects no process maps, Unix socket buffers, page tables and mappings
    (`_kernel_bytes`); more than MAX_PIPES pipes, or a count that cannot be made, is 1 << 62 (over any
    limit)."""
    pipes = _pipes(pids, proc)
    if pipes > MAX_PIPES:
        return 1 << 62
    total = pipes * PIPE_BYTES + _sysv_bytes(page, proc) + _kernel_bytes(pids, proc)
    if diag is not None:
        try:
            total += _socket_bytes(diag)
        except OSError:
            return 1 << 62
    return total


def guard(child: int, memory_mb: int, libc, diag: socket.socket | None, proc: int, said: int) -> None:
    """pid 1 of the sandbox after forking the candidate `child`: reap every process, bound the memory
    they hold together (resident + `unmapped_bytes`, counted through `proc`, the guard's own procfs),
    and exit with the candidate's status (the kernel then kills the rest). Past the limit it writes why
    to `said` (the sandbox's stderr) and exits as if killed."""
    global MAX_MAP_COUNT
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    limit, page = memory_mb << 20, os.sysconf("SC_PAGE_SIZE")
    try:
        MAX_MAP_COUNT = int(_read(proc, "sys/vm/max_map_count"))
    except (OSError, ValueError):
        pass
    candidate = os.pidfd_open(child)
    unmapped, polls = 0, 0
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
        resident, pids = _resident_bytes(page, proc)
        if polls % FULL_COUNT_EVERY == 0:  # the costlier count (descriptors, IPC, sockets) less often
            unmapped = unmapped_bytes(page, pids, diag, proc)
        polls += 1
        if resident + unmapped > limit:
            _say(said, resident, unmapped, memory_mb)
            os._exit(128 + signal.SIGKILL)  # as if killed: the namespace goes with us
        select.select([candidate], [], [], POLL_S)  # wakes at once when the candidate ends


def _say(fd: int, resident: int, unmapped: int, memory_mb: int) -> None:
    held = "more than 1 TiB" if unmapped >= 1 << 40 else f"{(resident + unmapped) / (1 << 20):.0f} MiB"
    why = (
        f"grpokit sandbox: stopped: its processes held {held} (resident {resident / (1 << 20):.0f} MiB; "
        "pipes, SysV IPC, socket buffers, page tables and mappings the rest) against memory_mb="
        f"{memory_mb} (SandboxLimits.memory_mb: all the sandbox's processes together)\n"
    )
    try:
        os.write(fd, why.encode())
    except OSError:
        pass
