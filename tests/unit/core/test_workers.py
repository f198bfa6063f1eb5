"""WorkerPool (grpokit.core.workers): the lifecycle the tool runner and the environment pool share, on real
forked processes: kept until retired, every one killed by close(), nothing killed by a fork of the owner,
and closed when the pool is collected."""

import gc
import os
import signal

from grpokit.core.workers import WorkerPool, fork_worker


class Sleeper:
    """A real worker: a forked child that waits for its request pipe to close."""

    def __init__(self):
        self.pid, self.to_child, self.from_child = fork_worker(lambda parent, req, rep: os.read(req, 1), ())
        self.kills = 0

    def kill(self) -> None:
        self.kills += 1
        os.killpg(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        os.close(self.to_child)
        os.close(self.from_child)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_spawn_keeps_retire_kills_one_and_close_kills_the_rest():
    pool = WorkerPool("test")
    a, b, c = (pool.spawn(Sleeper) for _ in range(3))
    assert pool.live == [a, b, c] and all(alive(w.pid) for w in (a, b, c))
    pool.retire(b)
    assert pool.live == [a, c] and not alive(b.pid) and alive(a.pid)
    pool.close()
    assert pool.live == [] and not alive(a.pid) and not alive(c.pid)
    assert (a.kills, b.kills, c.kills) == (1, 1, 1)  # each killed once


def test_a_fork_of_the_owner_closes_nothing_and_a_collected_pool_closes_itself():
    pool = WorkerPool("test")
    worker = pool.spawn(Sleeper)
    child = os.fork()
    if child == 0:  # a fork of the owner (as a tool worker is): its close() must leave the parent's workers
        pool.close()
        os._exit(0 if alive(worker.pid) else 1)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and alive(worker.pid)
    pid = worker.pid
    del pool, worker
    gc.collect()
    assert not alive(pid)  # killed and reaped by the collected pool's close
