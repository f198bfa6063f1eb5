"""What the tool-runner tests share (tests/unit/rollout/test_tools.py, test_hostile_tools.py): the tools
they both call and a ToolRunner that is closed however the test ends."""

import time
from collections.abc import Iterator
from contextlib import contextmanager

from grpokit.rollout.tools import ToolRunner, load_tools


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: the first factor
        b: the second factor
    """
    return a * b


def hang(seconds: float) -> str:
    """Sleeps.

    Args:
        seconds: how long
    """
    time.sleep(seconds)
    return "woke"


@contextmanager
def tool_runner(tools: list, **options) -> Iterator[ToolRunner]:
    """A ToolRunner of ``tools`` (functions, checked by load_tools) with ``options`` (timeout_s, workers,
    memory_mb, max_result_chars...); its workers are killed when the block ends, failed or not."""
    runner = ToolRunner(load_tools(tools), **options)
    try:
        yield runner
    finally:
        runner.close()
