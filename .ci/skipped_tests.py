"""A pytest plugin for .ci/run (loaded with PYTEST_ADDOPTS="-p skipped_tests", so the README's test command runs as
written): the node ids of the tests that skipped, written one a line to $GRPOKIT_SKIPPED_TESTS when the session
ends. CI installs the optional extras only after that run and runs exactly these again, so a test that needs an
extra runs (where it is installed) and the README's install still passes without it. Under pytest-xdist the
controller writes the file (the workers' reports reach it); a module skipped as a whole is its file's path."""

from __future__ import annotations

import os

_skipped: list[str] = []


def _record(report) -> None:
    if report.skipped and not os.environ.get("PYTEST_XDIST_WORKER") and report.nodeid not in _skipped:
        _skipped.append(report.nodeid)


def pytest_runtest_logreport(report) -> None:
    _record(report)


def pytest_collectreport(report) -> None:
    _record(report)


def pytest_sessionfinish(session, exitstatus) -> None:
    path = os.environ.get("GRPOKIT_SKIPPED_TESTS")
    if path and not os.environ.get("PYTEST_XDIST_WORKER"):
        with open(path, "w") as f:
            f.write("".join(f"{nodeid}\n" for nodeid in _skipped))
