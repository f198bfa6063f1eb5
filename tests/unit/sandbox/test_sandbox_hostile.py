"""The hostile-program suite (`tests/hostile_programs.py`) as root and as an unprivileged user:
at least 40 programs, none rewarded, none able to leave a file, a process or a connection behind
or to harm the process that scores them."""

import ast
import json
import os
import subprocess
import sys
import uuid

import hostile_programs as hp
import pytest

from grpokit.sandbox import isolation_report

NOBODY = 65534
pytestmark = pytest.mark.skipif(
    not isolation_report()["namespaces"],
    reason=f"no user namespaces here, code_tests refuses to run: {isolation_report()['reason']}",
)


def check(result: dict, token: str) -> None:
    scores = result["scores"]
    assert result["controls"] == {row[0]: 1.0 for row in hp.CONTROLS}
    assert len(result["controls"]) >= 13
    assert len(scores) >= 40
    assert {name: s for name, s in scores.items() if s != 0.0} == {}
    assert result["files_left"] == []
    assert result["processes_left"] == [] and hp.leftover_processes(token) == []
    assert result["connections"] == 0
    assert [p for p in hp.marks(token) if os.path.exists(p)] == []


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="runs as root only; the unprivileged run is the other test")
def test_hostile_suite_as_root():
    token = "gk" + uuid.uuid4().hex[:10]
    result = hp.run_suite(token)
    assert result["uid"] == 0
    check(result, token)


def _python_for(uid: int) -> str | None:
    """An interpreter (>= 3.10) that `uid` may run: the current one, else the system's."""
    for exe in (sys.executable, "/usr/bin/python3"):
        try:
            ok = subprocess.run(
                [exe, "-c", "import sys; assert sys.version_info >= (3, 10)"],
                user=uid,
                group=uid,
                extra_groups=[],
                capture_output=True,
                timeout=30,
                cwd="/",
            )
        except (OSError, subprocess.SubprocessError):
            continue
        if ok.returncode == 0:
            return exe
    return None


def _as_unprivileged_user(token: str, *mode: str) -> dict:
    """`hostile_programs.py TOKEN *mode` as user nobody (a torch-less interpreter may be the one that runs)."""
    if os.geteuid() != 0:  # this process is the unprivileged user
        suites = {("tool",): hp.run_tool_suite, ("quota",): hp.trainer_quotas}
        return suites.get(mode, hp.run_suite)(token)
    exe = _python_for(NOBODY)
    if exe is None:
        pytest.skip("no Python interpreter that user nobody (65534) can run")
    if not os.access(hp.HERE, os.R_OK | os.X_OK) or os.stat(hp.HERE).st_mode & 0o005 != 0o005:
        pytest.skip("the repository is not readable by other users")
    proc = subprocess.run(
        [exe, "-B", os.path.join(hp.HERE, "hostile_programs.py"), token, *mode],
        user=NOBODY,
        group=NOBODY,
        extra_groups=[],
        capture_output=True,
        timeout=300,
        cwd="/",
        env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"},
    )
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    return json.loads(proc.stdout)


@pytest.mark.slow
def test_hostile_suite_as_unprivileged_user():
    token = "gk" + uuid.uuid4().hex[:10]
    result = _as_unprivileged_user(token)
    assert result["uid"] != 0
    check(result, token)


@pytest.mark.slow
def test_python_tool_under_the_hostile_programs_as_unprivileged_user():
    """The multi-turn python tool (grpokit/rollout/tools/python.py) under the same programs as user nobody (the root
    run is tests/unit/rollout/test_tools.py): every call answers, nothing is left behind, honest code still runs."""
    token = "gk" + uuid.uuid4().hex[:10]
    result = _as_unprivileged_user(token, "tool")
    assert result["uid"] != 0
    answers = result["answers"]
    assert len(answers) >= 40
    assert {name: a for name, a in answers.items() if not (isinstance(a, str) and a)} == {}
    assert result["controls"] == {"print": "42", "add": "5", "secret": hp.SECRET}
    assert result["files_left"] == []
    assert result["processes_left"] == [] and hp.leftover_processes(token) == []
    assert result["connections"] == 0
    assert [p for p in hp.marks(token) if os.path.exists(p)] == []


@pytest.mark.slow
def test_a_sandbox_cannot_use_up_the_trainers_per_user_quotas():
    """As user nobody the sandbox's processes count against the trainer's own uid. A program that takes
    every POSIX timer (RLIMIT_SIGPENDING), message queue (RLIMIT_MSGQUEUE) and pipe page it can gets a
    small share (64 timers, no queue, no pipe above 64 KiB): meanwhile the trainer still creates a
    timer, opens a queue and grows a pipe to 1 MiB (before: 96,365 timers taken, timer_create and
    mq_open failed in the trainer)."""
    token = "gk" + uuid.uuid4().hex[:10]
    result = _as_unprivileged_user(token, "quota")
    assert result["uid"] != 0
    assert {k: result[k] for k in ("timer_create", "mq_open", "pipe_1mib")} == {
        "timer_create": True,
        "mq_open": True,
        "pipe_1mib": True,
    }
    taken = ast.literal_eval(result["run"])  # the hog's own count, printed as a dict
    assert taken["timers"] <= 64 and taken["queues"] == 0 and taken["pipe_pages"] <= 16
