"""The code sandbox: run model-written Python as hostile, as root or not (`code_tests` and the `python` tool).

With isolation (`isolation="auto"`, the default, or `"namespaces"`), each run gets new user, mount,
PID, network, IPC and UTS namespaces. They need no root: unprivileged user namespaces suffice
(`unshare -Ur true` must work for the user; most distributions allow it). Root and non-root get
the same guarantees:
  - identity: the code runs as uid/gid 1000 inside, mapped to the trainer's own uid outside, or,
    as root, to one unprivileged uid per concurrent sandbox (60000 + slot), with no supplementary
    groups; it holds no capabilities (all dropped, bounding set included, no_new_privs) and
    cannot create nested user namespaces (max_user_namespaces = 0 inside), so it cannot mount
    or unmount anything.
  - filesystem: a new root on a read-only tmpfs holding only /usr, /bin, /sbin, /lib*, the
    interpreter's prefix (and site-packages with `site_packages=True`), all bound read-only,
    /etc/ld.so.cache and five /dev nodes. The host's root is detached, so the datasets, the
    trainer's files and /proc of host processes are not even visible. /proc and /sys show an
    allowlist of what a program needs, which is nothing (`_harness.PROC_SHOWN`: /proc is empty, /sys
    absent), so no counter of the whole machine that another sandbox moves (meminfo, stat, loadavg,
    sys/fs/inode-nr, ...) can be read. The only writable place is /tmp (cwd, HOME, TMPDIR), a tmpfs
    of `tmpfs_mb` MiB and `tmpfs_inodes` entries (files, directories, links: their kernel memory)
    that vanishes with the run.
  - network: a network namespace with no interface up, and sockets of no family but AF_UNIX;
    connecting to anything, the host's loopback included, fails.
  - processes and signals: the code is pid 2 of its own PID namespace (pid 1 is the sandbox's
    guard, which it can neither signal nor trace), in a session of its own; nothing outside is
    visible, so nothing outside can be signalled. When the run ends, or the parent or the trainer dies, the
    harness kills pid 1 and the kernel kills every process of the namespace: no fork, daemon or
    setsid escape outlives the call.
  - resources: memory_mb for what all the sandbox's processes hold together (RLIMIT_AS per process,
    and pid 1 kills the sandbox when their resident memory, their pipes, the SysV shared memory,
    message queues and semaphores of its IPC namespace, the data queued in its Unix sockets and the
    kernel's memory for their mappings and page tables add up to more, and says so on stderr: see
    `_confine.py`, which also says what kernel memory is bounded otherwise and what is not), RLIMIT_CPU (cpu_s), RLIMIT_NPROC (max_processes, counted per
    sandbox), RLIMIT_FSIZE, RLIMIT_NOFILE, no core dumps; per-user quotas it shares with the trainer
    kept small: no POSIX message queue (RLIMIT_MSGQUEUE 0), 64 queued signals and timers
    (RLIMIT_SIGPENDING), 256 pipes of at most 64 KiB; the wall clock is enforced by the parent;
    output beyond max_output_bytes fails the run.
  - system calls (seccomp, `_confine.py`): no kernel keyrings (the inherited session keyring can be
    neither read nor written), no socket but AF_UNIX, no extended attributes, no sysinfo (free
    memory, load and process count of the whole machine) or syslog, no file locks (a lock on a file bound from the host would be a channel between
    sandboxes), no watching files (inotify, fanotify, F_NOTIFY), no evicting or probing the page
    cache (posix_fadvise and readahead do nothing; mincore, cachestat, RWF_NOWAIT refused), no
    memfd, no pipe resizing, io_uring, bpf, userfaultfd.
  - environment: PATH, LANG, HOME, TMPDIR only; the interpreter is the fork server's (`_zygote.py`:
    `python -I -B -S`, no user site, PYTHON* ignored), forked, never a new interpreter start.
Kernel exploits and timing side channels (how long a read of a shared file takes, CPU caches) are
out of scope: use a VM or gVisor for hostile code at scale.

Without isolation (`isolation="none"`, which must be asked for; `auto` refuses to run model-written
code when namespaces are unavailable): rlimits, a new session, a scratch directory, the timeout.
The code then runs as the trainer's user with its network, every file that user can read or
write (datasets with the tests, checkpoints, ~/.ssh), the right to signal or ptrace the user's
processes (the trainer included) and to leave processes running after the call.

Verdicts never depend on the sandbox being honest: see `grpokit.rewards.code` for how tests are run.

Modules: `parent.py` (the parent side: Sandbox, SandboxLimits, run_program, run_tests_job, isolation_report),
`_harness.py` (the child side: namespaces, the new root), `_confine.py` (seccomp and the memory guard),
`_zygote.py` (the fork server), `_driver.py` (code_tests' test driver), `_plain.py` (plain data across the
boundary). The underscore modules are loaded by file path, never imported.
"""

from grpokit.sandbox.parent import (
    ISOLATIONS,
    UNISOLATED,
    ProgramRun,
    SandboxError,
    SandboxLimits,
    isolation_report,
    resolve_isolation,
    run_program,
    run_tests_job,
)

__all__ = [
    "ISOLATIONS",
    "UNISOLATED",
    "ProgramRun",
    "SandboxError",
    "SandboxLimits",
    "isolation_report",
    "resolve_isolation",
    "run_program",
    "run_tests_job",
]
