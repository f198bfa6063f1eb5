"""The run explorer's one HTML file: the runs' data (``grpokit.view.data``) as JSON, the page's own script
and style, and uPlot, all inline, so the file opens from disk with no network and no build step.

Charts: uPlot 1.6.32 (MIT, https://github.com/leeoniya/uPlot), vendored as its one minified file
(``assets/uPlot.iife.min.js``, 51 kB, from ``npm pack uplot``; licence in ``assets/uPlot.LICENSE``). Chosen
because it is one dependency-free file small enough to inline in every page, draws thousands of points
fast on a canvas, and supports cursor-synced overlays and legends; Plotly (3.5 MB) or a Python-side
renderer (matplotlib PNGs: no hover, no zoom) would not.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

ASSETS = Path(__file__).parent / "assets"


def render_page(runs: list[dict[str, Any]], title: str | None = None) -> str:
    """The self-contained HTML page for ``runs`` (each from ``read_run``)."""
    payload = json.dumps({"runs": runs}, separators=(",", ":"), allow_nan=False, default=_nan_safe)
    payload = payload.replace("</", "<\\/")  # a "</script>" inside a completion must not end the block
    title = title or " vs ".join(run["name"] for run in runs)
    parts = {
        "TITLE": _escape(f"grpokit view: {title}"),
        "UPLOT_CSS": (ASSETS / "uPlot.min.css").read_text(encoding="utf-8"),
        "VIEW_CSS": (ASSETS / "view.css").read_text(encoding="utf-8"),
        "UPLOT_JS": (ASSETS / "uPlot.iife.min.js").read_text(encoding="utf-8"),
        "VIEW_JS": (ASSETS / "view.js").read_text(encoding="utf-8"),
        "DATA": payload,
    }
    html = (ASSETS / "view.html").read_text(encoding="utf-8")
    for key, value in parts.items():
        html = html.replace("{{" + key + "}}", value, 1)
    return html


def write_page(runs: list[dict[str, Any]], out: str | Path) -> Path:
    """Write the page to ``out`` and return its path."""
    out = Path(out)
    out.write_text(render_page(runs), encoding="utf-8")
    return out


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _nan_safe(value: Any) -> Any:
    raise TypeError(f"not JSON: {type(value).__name__}")


def clean(value: Any) -> Any:
    """``value`` with NaN/inf floats replaced by None, so that the page's JSON is strict."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
    return value
