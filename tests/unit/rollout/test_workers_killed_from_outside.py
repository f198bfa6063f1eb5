"""A tool or environment worker killed from outside grpokit is told apart from grpokit's own retirements and never
passed over (grpokit.rollout.tools.runner's Worker, grpokit.scoring._keeper, grpokit.rollout.envs.EnvProcess), on
real forked workers and real signals: a SIGTERM or SIGINT, to the worker or to its keeper, goes to the process's
stop listener (the trainer's StopOnSignals); any other signal is a line naming the worker, its pid and the signal;
grpokit's own retirements (a timeout, the end of an episode, close) say nothing. The whole run's behaviour is
tests/integration/test_worker_signals.py's. Before this change a killed worker was only "crashed (its process
exited)", whatever killed it, and a SIGINT to a keeper left what its worker had started running."""

from __future__ import annotations

import faulthandler
import os
import signal
import subprocess
import time

import pytest
from processes import gone_within

from grpokit.core.workers import listen_for_stops
from grpokit.rollout.envs import EnvFailure, EnvPool, EnvStep, WorkerLost
from grpokit.rollout.tools import ToolCall
from grpokit.rollout.tools.runner import ToolRunner
from grpokit.rollout.tools.spec import load_tools


def whoami(seconds: float = 0.0) -> int:
    """The worker's pid, after ``seconds``.

    Args:
        seconds: how long to wait first
    """
    time.sleep(seconds)
    return os.getpid()


def grpokit_lines(err: str) -> list[str]:
    """grpokit's lines in captured stderr: a warning some other library prints from a thread of its own (torch's
    c10d retrying a connection, say) may land in the same capture, and is no line of ours."""
    return [line for line in err.splitlines() if line.startswith("grpokit")]


def start_daemon() -> int:
    """Start a sleeper in a session of its own (out of the worker's process group); its pid."""
    return subprocess.Popen(["sleep", "300"], start_new_session=True).pid


@pytest.fixture
def heard():
    """The stop signals this process's listener is handed: [(name, where, pid)]."""
    got: list[tuple[str, str, int]] = []
    previous = listen_for_stops(lambda name, where, pid: got.append((name, where, pid)))
    yield got
    listen_for_stops(previous)


@pytest.fixture
def runner():
    r = ToolRunner(load_tools([whoami, start_daemon]), workers=1, timeout_s=20)
    yield r
    r.close()


def pid_of(runner: ToolRunner) -> tuple[int, int]:
    """(the worker's pid, its keeper's) of the runner's one worker, after a call."""
    worker_pid = int(runner.call(ToolCall("whoami", {})).content)
    (worker,) = runner.workers.live
    assert worker.worker_pid == worker_pid
    return worker_pid, worker.pid


@pytest.mark.parametrize("target", ["worker", "keeper"])
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_to_a_tool_worker_or_its_keeper_goes_to_the_stop_listener(runner, heard, capfd, target, signum):
    """Sent while the worker is idle: found by the next call, which fails (the model reads why); the next call after
    it runs on a fresh worker. What the tool had started dies with it (SIGINT to a keeper before: only the keeper
    died, the worker with it, and the daemon lived on under init)."""
    daemon = int(runner.call(ToolCall("start_daemon", {})).content)
    worker_pid, keeper = pid_of(runner)
    os.kill(worker_pid if target == "worker" else keeper, signum)
    assert gone_within(daemon)
    result = runner.call(ToolCall("whoami", {}))
    name = signal.Signals(signum).name
    assert result.error and result.content == f"Error: whoami failed: its worker was killed by {name}"
    assert heard == [(name, f"sent to tool worker {worker_pid} (keeper {keeper})", worker_pid)]
    assert "grpokit" not in capfd.readouterr().err  # the listener's line, not the runner's
    assert int(runner.call(ToolCall("whoami", {})).content) not in (worker_pid, keeper)


def test_a_sigkill_mid_call_is_a_line_naming_the_worker_its_pid_and_the_signal(runner, heard, capfd):
    worker_pid, keeper = pid_of(runner)
    killer = subprocess.Popen(["sh", "-c", f"sleep 0.3; kill -s KILL {worker_pid}"])
    result = runner.call(ToolCall("whoami", {"seconds": 30}))
    killer.wait()
    assert result.content == "Error: whoami failed: its worker was killed by SIGKILL" and not heard
    assert grpokit_lines(capfd.readouterr().err) == [
        f"grpokit: tool worker {worker_pid} (keeper {keeper}) was killed by SIGKILL, not by grpokit; its call failed "
        "(the model reads why) and a fresh worker serves the next call"
    ]
    assert not result.timed_out and result.seconds < 30


def test_a_stop_signal_with_no_listener_is_a_line_and_the_worker_is_replaced(runner, capfd):
    previous = listen_for_stops(None)
    try:
        worker_pid, keeper = pid_of(runner)
        os.kill(worker_pid, signal.SIGTERM)
        assert runner.call(ToolCall("whoami", {})).error
    finally:
        listen_for_stops(previous)
    assert capfd.readouterr().err.startswith(
        f"grpokit: tool worker {worker_pid} (keeper {keeper}) was killed by SIGTERM, not by grpokit; "
    )
    assert not runner.call(ToolCall("whoami", {})).error


def test_grpokits_own_retirements_are_no_signal_from_outside(heard, capfd):
    """A call past its timeout (its worker retired), an episode's end and close: grpokit retires with its own
    signal (RETIRE), so none of these reaches the listener nor prints a line."""
    r = ToolRunner(load_tools([whoami]), workers=1, timeout_s=0.5)
    try:
        assert r.call(ToolCall("whoami", {"seconds": 30})).timed_out
        assert not r.call(ToolCall("whoami", {})).error
    finally:
        r.close()
    pool = EnvPool(Game, timeout_s=20)
    try:
        envs = pool.environments(2)
        for env in envs:
            env.reset({"prompt": "x"})
        pool.end_episodes()
        envs[0].reset({"prompt": "x"})
    finally:
        pool.close()
    assert heard == [] and grpokit_lines(capfd.readouterr().err) == []


class Game:
    """A step on "SIGNAME" sends that signal to its own worker; a reset on the row {"die": path} sends SIGKILL once
    (the file marks it)."""

    def reset(self, row):
        if "die" in row:
            try:
                os.close(os.open(row["die"], os.O_CREAT | os.O_EXCL))
                os.kill(os.getpid(), signal.SIGKILL)
            except FileExistsError:
                pass
        return [{"role": "user", "content": str(os.getpid())}]

    def step(self, text):
        if text.startswith("SIG"):
            faulthandler.disable()  # (pytest's, inherited: no traceback of a SIGSEGV on the test's stderr)
            os.kill(os.getpid(), signal.Signals[text])
            time.sleep(30)
        return EnvStep([{"role": "user", "content": "again"}])


@pytest.fixture
def pool():
    p = EnvPool(Game, timeout_s=20)
    yield p
    p.close()


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM, signal.SIGHUP], ids=["SIGKILL", "SIGTERM", "SIGHUP"])
def test_an_environment_worker_killed_from_outside_cuts_its_episode(pool, heard, capfd, signum):
    """WorkerLost, a TimeoutError: the multi-turn loop ends the episode there as when its time runs out, not as a
    failure of the environment (before: EnvFailure, "its worker process died")."""
    env = pool.environments(1)[0]
    worker_pid = int(env.reset({"prompt": "x"})[0]["content"])
    keeper = env.worker.pid
    name = signal.Signals(signum).name
    with pytest.raises(WorkerLost, match=f"step: its worker was killed by {name}"):
        env.step(name)
    assert env.worker is None and env.finish(None) is None  # nothing left to score
    err = capfd.readouterr().err
    if signum == signal.SIGTERM:
        assert heard == [("SIGTERM", f"sent to environment worker {worker_pid} (keeper {keeper})", worker_pid)]
        assert grpokit_lines(err) == []
    else:
        assert not heard and grpokit_lines(err) == [
            f"grpokit: environment worker {worker_pid} (keeper {keeper}) was killed by {name}, not by grpokit; its "
            "episode ends there, cut (truncated); the run goes on"
        ]


def test_an_environment_worker_that_crashes_fails_its_episode_named(pool, heard, capfd):
    env = pool.environments(1)[0]
    env.reset({"prompt": "x"})
    with pytest.raises(EnvFailure, match="step: its worker process was killed by SIGSEGV"):
        env.step("SIGSEGV")
    assert not heard and "was killed by SIGSEGV, not by grpokit; its episode fails" in capfd.readouterr().err


def test_a_reset_whose_worker_is_killed_is_made_again_on_a_fresh_worker(pool, capfd, tmp_path):
    env = pool.environments(1)[0]
    first = env.reset({"prompt": "x", "die": str(tmp_path / "died")})
    assert (tmp_path / "died").exists() and int(first[0]["content"]) == env.worker.worker_pid
    err = capfd.readouterr().err
    assert "was killed by SIGKILL, not by grpokit; a fresh worker makes it again; the run goes on" in err
    assert env.step("go").messages == [{"role": "user", "content": "again"}]


def test_a_worker_killed_while_idle_is_reported_when_its_episode_ends(pool, heard, capfd):
    """No call finds it dead: the end of the episode (its retirement) does, and says so."""
    envs = pool.environments(2)
    pids = [int(env.reset({"prompt": "x"})[0]["content"]) for env in envs]
    keepers = [env.worker.pid for env in envs]
    os.kill(keepers[0], signal.SIGTERM)  # (its keeper: the worker dies with it)
    os.kill(pids[1], signal.SIGKILL)
    assert gone_within(pids[0]) and gone_within(pids[1])
    # and their keepers (zombies until reaped): a keeper still ending its tree when the episode ends would take the
    # retirement as its own end (a race of a few milliseconds that a loaded machine widens; seen once in 13 runs)
    assert gone_within(keepers[0]) and gone_within(keepers[1])
    pool.end_episodes()
    assert heard == [("SIGTERM", f"sent to environment worker {pids[0]} (keeper {keepers[0]})", pids[0])]
    assert grpokit_lines(capfd.readouterr().err) == [
        f"grpokit: environment worker {pids[1]} (keeper {keepers[1]}) was killed by SIGKILL, not by grpokit; it had "
        "ended before grpokit retired it"
    ]
