"""The run explorer: ``grpokit view RUN_DIR [RUN_DIR ...]`` writes one self-contained HTML page of a run's
curves, its sampled steps' groups and tokens, and the objective worked through with the run's numbers.

``data`` reads a run folder into the page's numbers, ``page`` writes the HTML, ``cli`` is the command."""

from grpokit.view.data import RunReadError, read_run
from grpokit.view.page import render_page, write_page

__all__ = ["RunReadError", "read_run", "render_page", "write_page"]
