"""The built-in ``python`` tool: model-written code run in grpokit.rewards.sandbox (the same isolation as
the code rewards, as root and non-root: namespaces, no network, a private /tmp, rlimits, a wall clock).

The isolation is resolved when the tool is made (before any worker forks), so `auto` on a host without
user namespaces is a named error at start, never a silent fallback.
"""

from __future__ import annotations

from collections.abc import Callable

from grpokit.rollout.tools.results import Stopped
from grpokit.sandbox import SandboxLimits, resolve_isolation, run_program

TOOL_LIMITS = SandboxLimits(wall_s=5.0, cpu_s=5.0, max_output_bytes=1 << 16)
"""The python tool's default limits: shorter than the code rewards' (a call happens inside a rollout)."""


def make_python_tool(limits: SandboxLimits = TOOL_LIMITS, isolation: str = "auto") -> Callable[[str], str]:
    """A ``python(code) -> str`` tool: what the program prints (stdout, then stderr), or why it stopped
    (past its wall clock: a :class:`~grpokit.rollout.tools.results.Stopped` result, counted as a timeout).
    Its time budget in the ToolRunner (rollout.tool_timeout) should exceed ``limits.wall_s``."""
    resolve_isolation(isolation)  # raises now where `auto`/`namespaces` cannot be honoured

    def python(code: str) -> str:
        """Run a Python 3 program in a sandbox and return what it prints. Nothing persists between calls.

        Args:
            code: the complete program; print() every value you want to see
        """
        run = run_program(code, limits=limits, isolation=isolation)
        out = run.stdout
        if run.stderr:
            out += ("\n" if out else "") + run.stderr.strip()[-2000:]
        if run.timed_out:  # Stopped: the call counts in tools/timeouts
            return Stopped((out + f"\n[stopped: the program ran past {limits.wall_s:g} s]").strip())
        elif run.output_exceeded:
            out += f"\n[stopped: the program printed more than {limits.max_output_bytes} bytes]"
        elif run.returncode not in (0, None):
            out += f"\n[exit code {run.returncode}]"
        return out.strip() or "(no output)"

    return python
