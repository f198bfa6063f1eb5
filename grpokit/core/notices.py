"""Where the training parts' one-line messages go (an OOM retry, a skipped step, a warning)."""

from __future__ import annotations

import sys
from typing import Protocol


class Printer(Protocol):
    def print(self, message: str) -> None: ...


class Notices:
    """The run's log (``grpokit.run.log.RunLogger.print``, which keeps the progress bar intact) while ``log``
    is set, stderr otherwise."""

    def __init__(self) -> None:
        self.log: Printer | None = None

    def __call__(self, message: str) -> None:
        if self.log is not None:
            self.log.print(message)
        else:
            print(message, file=sys.stderr)
