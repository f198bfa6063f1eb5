"""What the model writes is data for the tool path: calls the JSON reader chokes on, echoes of the model's
text cut to their limits, invalid Unicode, tools that print or leak memory, and the sandbox clock counted as a
timeout. Each case ended a step (or reached the trainer's streams) before."""

import os
import time

import pytest
from tool_runners import hang, multiply, tool_runner

from grpokit.rollout.tools import ToolCall, check_arguments, hermes, load_tools
from grpokit.rollout.tools.results import Stopped
from grpokit.rollout.tools.spec import ECHO_CHARS


def echo(text: str) -> str:
    """Gives the text back.

    Args:
        text: any text
    """
    return text


def chatty(n: int) -> str:
    """Prints to stdout and stderr, from Python and from a child process.

    Args:
        n: a number
    """
    import sys

    print(f"CHATTY-STDOUT {n}")
    print(f"CHATTY-STDERR {n}", file=sys.stderr)
    os.system(f"echo CHATTY-SHELL {n}")
    return f"done {n}"


_LEAK: list = []


def leak(mb: int) -> int:
    """Keeps mb MiB more every call, as a cache that never forgets.

    Args:
        mb: megabytes to keep
    """
    _LEAK.append(bytearray(os.urandom(1)) * (mb << 20))
    return len(_LEAK)


def grab(mb: int) -> str:
    """Allocates mb MiB at once.

    Args:
        mb: megabytes
    """
    return str(len(bytearray(mb << 20)))


def clocked(code: str) -> str:
    """Says its own clock stopped it, as the python tool does past its sandbox's wall clock.

    Args:
        code: ignored
    """
    return Stopped("partial output\n[stopped: the program ran past 5 s]")


def test_a_4301_digit_integer_in_a_call_is_an_error_message_not_a_crash():
    big = "9" * 4301  # past Python's int_max_str_digits: json.loads raises ValueError (not a JSONDecodeError)
    (call,) = hermes('<tool_call>{"name": "multiply", "arguments": {"a": ' + big + ', "b": 1}}</tool_call>')
    assert call.name is None and "not valid JSON" in call.error and "4300" in call.error
    (call,) = hermes('<tool_call>{"name": "multiply", "arguments": "{\\"a\\": ' + big + '}"}</tool_call>')
    assert call.name == "multiply" and call.error == "the arguments are a string that is not a JSON object"
    deep = "[" * 100_000 + "]" * 100_000  # nesting past the recursion limit
    (call,) = hermes('<tool_call>{"name": "multiply", "arguments": {"a": ' + deep + "}}</tool_call>")
    assert call.error is not None and len(call.error) < 200


def test_echoes_of_the_models_text_are_cut():
    (tool,) = load_tools([multiply])
    name = "x" * 6101
    problem = check_arguments(tool, {name: 1, "a": 1, "b": 2})
    assert problem.startswith("multiply has no argument 'xxx") and len(problem) < 2 * ECHO_CHARS + 60
    problem = check_arguments(tool, {"a": "7" * 6101, "b": 2})
    assert len(problem) < 2 * ECHO_CHARS + 60
    nested: list = []
    for _ in range(5000):  # repr() of it raises RecursionError on Python 3.11 (not on 3.12): cut either way
        nested = [nested]
    assert len(check_arguments(tool, {"a": nested, "b": 2})) < 2 * ECHO_CHARS + 60

    class Unprintable:
        def __repr__(self):
            raise ValueError("Exceeds the limit (4300 digits) for integer string conversion")

    assert check_arguments(tool, {"a": Unprintable(), "b": 2}).endswith("got <a Unprintable>")


@pytest.fixture
def runner():
    with tool_runner(
        [multiply, echo, chatty, leak, grab, clocked], timeout_s=20.0, workers=1, memory_mb=200
    ) as r:
        yield r


def test_unknown_tool_names_and_surrogates_come_back_as_clean_text(runner):
    result = runner.call(ToolCall("z" * 6101, {}))
    assert result.error and len(result.content) < 200
    result = runner.call(ToolCall("echo", {"text": "a\ud800b"}))  # a lone surrogate, as json.loads gives it
    assert not result.error and result.content == "a\ufffdb"
    result.content.encode("utf-8")  # valid Unicode: the tokenizer, the logs and the record files take it


def test_what_a_tool_prints_never_reaches_the_trainers_streams(runner, capfd):
    result = runner.call(ToolCall("chatty", {"n": 7}))
    assert result.content == "done 7"
    out, err = capfd.readouterr()
    assert "CHATTY" not in out + err
    for line in ("CHATTY-STDOUT 7", "CHATTY-STDERR 7", "CHATTY-SHELL 7"):
        assert line in result.printed  # kept with the result, for whoever wants to look


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / (1 << 20)


@pytest.mark.slow
def test_a_leaking_tool_is_recycled_and_a_huge_allocation_is_refused(runner):
    pids, peak = set(), 0.0
    for _ in range(8):  # 8 x 60 MiB kept: 480 MiB without recycling
        result = runner.call(ToolCall("leak", {"mb": 60}))
        assert not result.error, result.content
        for w in list(runner._all):
            pids.add(w.pid)
            peak = max(peak, _rss_mb(w.pid))
    assert runner.counts["recycled"] >= 2 and len(pids) >= 3
    start = _rss_mb(os.getpid())  # the workers start as forks of this process
    assert peak < start + 100 + 60 + 40  # half the limit, one call's growth, slack
    result = runner.call(ToolCall("grab", {"mb": 4096}))  # past the address-space cap: MemoryError
    assert result.error and result.content.startswith("Error: MemoryError")
    assert runner.call(ToolCall("multiply", {"a": 6, "b": 7})).content == "42"  # a fresh worker serves on


def test_a_call_stopped_by_the_tools_own_clock_counts_as_a_timeout(runner):
    result = runner.call(ToolCall("clocked", {"code": "while True: pass"}))
    assert result.timed_out and result.error and "[stopped" in result.content
    assert runner.counts["timeouts"] == 1


def test_a_budget_shorter_than_the_call_timeout_stops_the_call_and_says_why():
    with tool_runner([hang], timeout_s=30.0, workers=1) as r:
        t0 = time.monotonic()
        result = r.call(ToolCall("hang", {"seconds": 30}), budget_s=0.5)
        assert time.monotonic() - t0 < 5
        assert result.timed_out and result.over_budget and "time for tools ran out" in result.content
        skipped = r.call(ToolCall("hang", {"seconds": 0}), budget_s=0.0)  # nothing left: not started
        assert skipped.over_budget and not skipped.timed_out and "was not run" in skipped.content
        assert r.counts["calls"] == 1 and r.counts["timeouts"] == 1


@pytest.mark.slow
def test_the_python_tools_sandbox_clock_counts_in_tools_timeouts():
    """A model's program that loops is stopped by the sandbox's wall clock, inside the call's budget: before,
    the model read '[stopped ...]' as an ordinary result and tools/timeouts stayed 0."""
    from grpokit.rollout.tools.python import make_python_tool
    from grpokit.sandbox import SandboxLimits, isolation_report

    if not isolation_report()["namespaces"]:
        pytest.skip(f"no user namespaces here: {isolation_report()['reason']}")
    python = make_python_tool(SandboxLimits(wall_s=1.0, cpu_s=5.0, max_output_bytes=1 << 16))
    with tool_runner([python], timeout_s=20.0, workers=1) as r:
        looped = r.call(ToolCall("python", {"code": "print('start')\nwhile True: pass"}))
        assert looped.timed_out and "[stopped: the program ran past 1 s]" in looped.content
        honest = r.call(ToolCall("python", {"code": "print(6 * 7)"}))
        assert honest.content == "42" and not honest.error and not honest.timed_out
        assert r.counts["timeouts"] == 1 and r.counts["errors"] == 1
