"""What a tool may hand back besides plain text: a leaf module, so that the tools that make such results
(grpokit.rollout.tools.python) and the worker that reads them (grpokit.rollout.tools.runner) need not import
each other."""

from __future__ import annotations


class Stopped(str):
    """A tool's result saying that the tool's own clock stopped it (the python tool's sandbox clock): the
    model reads it as any result, and the call counts in tools/timeouts."""
