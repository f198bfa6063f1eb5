"""Numeric ranges written in interval notation, as settings declare them: "[1, inf)", "(0, 1]".

"[" includes the bound, "(" excludes it; "inf" / "-inf" leave a side open. Read by the algorithm's knobs
(grpokit.algos.settings) and the config's declarations (grpokit.config.declare), which check and describe
a value with the same two functions.
"""

from __future__ import annotations


def in_interval(value: float, interval: str) -> bool:
    """`in_interval(0, "[1, inf)")` -> False. NaN is in no interval."""
    lo_text, hi_text = interval[1:-1].split(",")
    lo, hi = float(lo_text), float(hi_text)
    above = value >= lo if interval[0] == "[" else value > lo
    below = value <= hi if interval[-1] == "]" else value < hi
    return above and below


def describe_interval(interval: str) -> str:
    """Words for an interval: "[1, inf)" -> ">= 1"; "(0, 1]" -> "> 0 and <= 1"; "(-inf, inf)" -> "a finite number"."""
    lo_text, hi_text = (t.strip() for t in interval[1:-1].split(","))
    parts = []
    if lo_text != "-inf":
        parts.append(f"{'>=' if interval[0] == '[' else '>'} {lo_text}")
    if hi_text != "inf":
        parts.append(f"{'<=' if interval[-1] == ']' else '<'} {hi_text}")
    return " and ".join(parts) or "a finite number"
