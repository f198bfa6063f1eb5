"""Tools: definitions checked before any model loads, calls parsed from text, each call run in a killable
worker with a time budget; whatever the tool or the model does, the model reads an error and the run goes on."""

import os
import time

import pytest
from tool_runners import hang, multiply, tool_runner

from grpokit.rollout.tools import ToolCall, ToolDefinitionError, get_parser, hermes, load_tools


def boom(x: int) -> int:
    """Always raises.

    Args:
        x: anything
    """
    raise RuntimeError(f"bad {x}")


def huge(n: int) -> str:
    """Returns n megabytes.

    Args:
        n: megabytes
    """
    return "x" * (n << 20)


def die(code: int) -> str:
    """Exits its process.

    Args:
        code: the exit code
    """
    os._exit(code)


def no_doc(a: int) -> int:
    return a


def untyped(a):
    """Untyped.

    Args:
        a: something
    """
    return a


def test_schema_from_type_hints_and_docstring():
    (tool,) = load_tools([multiply])
    assert tool.name == "multiply"
    assert tool.schema["function"]["description"] == "Multiply two integers."
    assert tool.schema["function"]["parameters"]["properties"]["a"] == {
        "type": "integer",
        "description": "the first factor",
    }
    assert tool.schema["function"]["parameters"]["required"] == ["a", "b"]


@pytest.mark.parametrize(
    "spec, words",
    [
        (no_doc, ["no_doc", "docstring"]),
        (untyped, ["untyped", "type hint"]),
        ("grpokit.nope:f", ["grpokit.nope:f", "loading it failed"]),
        ("multiply", ["not a tool name"]),
        (42, ["give a function"]),
    ],
)
def test_bad_tool_definitions_are_named_errors(spec, words):
    with pytest.raises(ToolDefinitionError) as e:
        load_tools([spec])
    assert all(w in str(e.value) for w in words), str(e.value)


@pytest.mark.parametrize(
    "body, words",
    [("import os\nos._exit(7)\n", "exit code 7"), ("raise ValueError('bad config')\n", "ValueError")],
)
def test_a_tool_file_that_ends_or_raises_at_import_is_a_named_error(tmp_path, body, words):
    """The tool file is imported in a child first (grpokit.core.user_code), as reward files are: os._exit at
    import does not end the trainer, it names the file."""
    path = tmp_path / "exits.py"
    path.write_text(
        body + 'def f(x: int) -> int:\n    """Id.\n\n    Args:\n        x: x\n    """\n    return x\n'
    )
    with pytest.raises(ToolDefinitionError) as e:
        load_tools([f"{path}:f"])
    assert f"running {path} failed" in str(e.value) and words in str(e.value), str(e.value)


def test_duplicate_tool_names():
    with pytest.raises(ToolDefinitionError, match="two tools are named 'multiply'"):
        load_tools([multiply, multiply])


def test_hermes_parser():
    text = 'Let me.<tool_call>\n{"name": "multiply", "arguments": {"a": 12, "b": 34}}\n</tool_call> and <tool_call>{"name": "m", "arguments": "{\\"x\\": 1}"}</tool_call>'
    calls = hermes(text)
    assert [(c.name, c.arguments, c.error) for c in calls] == [
        ("multiply", {"a": 12, "b": 34}, None),
        ("m", {"x": 1}, None),
    ]
    assert hermes("no call here") == []
    unclosed = hermes('<tool_call>{"name": "f", "arguments": {}}')  # stopped at EOS right after the JSON
    assert [(c.name, c.error) for c in unclosed] == [("f", None)]
    (bad,) = hermes("<tool_call>{not json</tool_call>")
    assert bad.name is None and "not valid JSON" in bad.error
    (bad,) = hermes('<tool_call>["multiply"]</tool_call>')
    assert "JSON object" in bad.error
    (bad,) = hermes('<tool_call>{"name": "f", "arguments": [1]}</tool_call>')
    assert bad.error == "the arguments of a tool call must be a JSON object"
    many = hermes('<tool_call>{"name": "f", "arguments": {}}</tool_call>' * 10)
    assert [c.error is None for c in many] == [True] * 8 + [False] * 2
    assert get_parser("hermes") is hermes
    with pytest.raises(ToolDefinitionError, match="choose one of"):
        get_parser("mistral")


async def fetch_square(x: int) -> int:
    """An async tool (TRL takes them): awaits, then squares.

    Args:
        x: the number
    """
    import asyncio

    await asyncio.sleep(0.01)
    return x * x


async def async_boom(x: int) -> int:
    """An async tool that raises after awaiting.

    Args:
        x: anything
    """
    import asyncio

    await asyncio.sleep(0)
    raise ValueError(f"async bad {x}")


def test_an_async_tool_answers_with_its_awaited_result_not_a_coroutine():
    """Before, an async def tool's reply was the text of a coroutine object (and the coroutine never ran)."""
    with tool_runner([fetch_square, async_boom], timeout_s=5.0, workers=1) as runner:
        assert runner.call(ToolCall("fetch_square", {"x": 7})).content == "49"
        failed = runner.call(ToolCall("async_boom", {"x": 2}))
        assert failed.error and failed.content.startswith("Error: ValueError: async bad 2")


@pytest.mark.slow
def test_runner_turns_every_failure_into_a_message_and_goes_on():
    with tool_runner(
        [multiply, boom, hang, huge, die], timeout_s=2.0, max_result_chars=100, workers=2
    ) as runner:
        cases = [
            (ToolCall("multiply", {"a": 1234, "b": 5678}), "7006652", False, False),
            (ToolCall("boom", {"x": 3}), "Error: RuntimeError: bad 3", True, False),
            (ToolCall("hang", {"seconds": 30}), "Error: hang did not finish within 2 s", True, True),
            (ToolCall("die", {"code": 3}), "Error: die crashed (its process exited)", True, False),
            (
                ToolCall("nope", {}),
                "Error: there is no tool 'nope'; the tools are ['boom', 'die', 'hang', 'huge', 'multiply']",
                True,
                False,
            ),
            (
                ToolCall("multiply", {"a": "12", "b": 3}),
                "Error: argument 'a' of multiply must be of type integer, got '12'",
                True,
                False,
            ),
            (
                ToolCall("multiply", {"a": True, "b": 3}),
                "Error: argument 'a' of multiply must be of type integer, got True",
                True,
                False,
            ),
            (ToolCall("multiply", {"a": 1}), "Error: multiply needs the argument 'b'", True, False),
            (
                ToolCall("multiply", {"a": 1, "b": 2, "c": 3}),
                "Error: multiply has no argument 'c'; its arguments are ['a', 'b']",
                True,
                False,
            ),
            (
                hermes("<tool_call>{oops</tool_call>")[0],
                "Error: the tool call is not valid JSON",
                True,
                False,
            ),
            (ToolCall("multiply", {"a": 2, "b": 3}), "6", False, False),  # workers replaced after the kill
        ]
        for call, expected, error, timed_out in cases:
            t0 = time.monotonic()
            result = runner.call(call)
            assert result.content.startswith(expected), (call, result)
            assert (result.error, result.timed_out) == (error, timed_out), (call, result)
            assert time.monotonic() - t0 < 10.0  # the 2 s timeout, not the 30 s hang
        # a worker first used from a thread that has exited since still serves (PR_SET_PDEATHSIG is per thread)
        import threading

        with tool_runner([multiply], timeout_s=5.0, workers=1) as runner2:
            thread = threading.Thread(target=runner2.call, args=(ToolCall("multiply", {"a": 1, "b": 1}),))
            thread.start()
            thread.join()
            time.sleep(0.2)
            assert runner2.call(ToolCall("multiply", {"a": 3, "b": 4})).content == "12"
        big = runner.call(ToolCall("huge", {"n": 10}))  # 10 MB: cut in the worker, with a note
        assert not big.error and big.content == "x" * 100 + f"... [cut: {(10 << 20) - 100} more characters]"
        assert runner.counts["calls"] == len(cases) + 1 and runner.counts["timeouts"] == 1
        assert runner.counts["errors"] == sum(e for _, _, e, _ in cases)


@pytest.mark.slow
def test_python_tool_under_the_hostile_programs():
    """Each hostile program (tests/hostile_programs.py), its functions called, through the python tool on a
    ToolRunner (hostile_programs.run_tool_suite, in this process as root; as user nobody in
    tests/unit/rewards/test_sandbox_hostile.py): every call answers, the runner and this process survive, nothing is left
    behind (files, processes, connections), and honest programs still get their output."""
    import uuid

    import hostile_programs as hp

    from grpokit.sandbox import isolation_report

    if not isolation_report()["namespaces"]:
        pytest.skip(f"no user namespaces here: {isolation_report()['reason']}")
    token = "gk" + uuid.uuid4().hex[:10]
    result = hp.run_tool_suite(token)
    answers = result["answers"]
    assert len(answers) >= 40
    assert {name: a for name, a in answers.items() if not (isinstance(a, str) and a)} == {}
    assert result["controls"] == {"print": "42", "add": "5", "secret": hp.SECRET}
    assert result["connections"] == 0
    assert result["files_left"] == [] and [p for p in hp.marks(token) if os.path.exists(p)] == []
    assert result["processes_left"] == [] and hp.leftover_processes(token) == []
