"""Where a GRPO step's time goes, phase by phase: torch.profiler over one step, each phase's top kernels (operators
on a CPU) and the gaps between them (scripts/profile_step.py runs it on the bench's model and shape).

The phases are record_function ranges around the trainer's own calls (MARKS): the engine's generate (generation),
the log-probs taken before the update (reference: the reference's, and the old policy's when the run needs them)
and the update. On CUDA the kernels and the ranges are read on the device's clock (the profiler's device-side copy
of each range); on a CPU the operators (aten::*) of the thread that ran the step. For each phase (phase_report):

    wall     the phase's time
    busy     the time some kernel runs (on a CPU: some top-level operator, one no other operator called)
    gaps     wall - busy: the device waiting on the host (launches, Python, synchronisation), with the largest
             gaps named by the kernels on either side
    top      the kernels (operators) that took the most time in the phase (an operator's self time on a CPU)
"""

from __future__ import annotations

import functools
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

MARKS: dict[str, tuple[str, str]] = {
    "generation": ("sampler.generator", "generate"),
    "reference": ("updater", "rollout_logprobs"),
    "update": ("updater", "update"),
}
"""phase -> (the trainer's part, its method) whose calls the phase's range wraps."""
PREFIX = "phase: "


@dataclass(frozen=True)
class Span:
    """One kernel or operator: its name, start and end (microseconds on one clock) and its own time in them."""

    name: str
    start: float
    end: float
    self_us: float


def mark_phases(trainer: Any) -> None:
    """Wrap each MARKS method of ``trainer``'s parts in a profiler range named ``phase: NAME`` (on the instance)."""
    from torch.profiler import record_function

    for phase, (part_path, method) in MARKS.items():
        part = trainer
        for attr in part_path.split("."):
            part = getattr(part, attr, None)
        fn = getattr(part, method, None)
        if fn is None:
            raise AttributeError(f"the trainer has no {part_path}.{method} to mark as the {phase} phase; update MARKS")

        def marked(*args, _fn=fn, _label=PREFIX + phase, **kwargs):
            with record_function(_label):
                return _fn(*args, **kwargs)

        setattr(part, method, functools.wraps(fn)(marked))


def merged(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of ``intervals`` as sorted, disjoint (start, end) pairs."""
    out: list[list[float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]


def phase_report(phases: dict[str, list[tuple[float, float]]], top_level: list[Span], timed: list[Span], *,
                 top: int = 10, largest_gaps: int = 5) -> dict[str, dict[str, Any]]:  # fmt: skip
    """Per phase (its ranges, microseconds): wall, busy and gap seconds, the number of gaps, the largest gaps with the
    spans before and after, and the ``top`` spans of ``timed`` by summed self time (seconds, calls). ``top_level``:
    spans that do not overlap one another's work (kernels; top-level operators), for busy and gaps; a span belongs
    to the phase its start falls in."""
    report: dict[str, dict[str, Any]] = {}
    for phase, ranges in phases.items():
        def inside(span: Span, ranges: list[tuple[float, float]] = ranges) -> bool:
            return any(a <= span.start < b for a, b in ranges)

        level = sorted((s for s in top_level if inside(s)), key=lambda s: s.start)
        wall = sum(b - a for a, b in ranges)
        busy_intervals = merged([(s.start, min(s.end, next(b for a, b in ranges if a <= s.start < b))) for s in level])
        busy = sum(b - a for a, b in busy_intervals)
        gaps = []  # (length, before, after): the idle time between consecutive kernels, and at the phase's ends
        for a, b in ranges:
            inner = [s for s in level if a <= s.start < b]
            edge, before = a, "(phase start)"
            for s in inner:
                if s.start > edge:
                    gaps.append((s.start - edge, before, s.name))
                if s.end > edge:
                    edge, before = min(s.end, b), s.name
            if b > edge:
                gaps.append((b - edge, before, "(phase end)"))
        totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
        for s in timed:
            if inside(s):
                totals[s.name][0] += s.self_us
                totals[s.name][1] += 1
        ranked = sorted(totals.items(), key=lambda kv: -kv[1][0])[:top]
        report[phase] = {
            "wall_s": wall / 1e6,
            "busy_s": busy / 1e6,
            "gap_s": (wall - busy) / 1e6,
            "gaps": len(gaps),
            "largest_gaps": [{"s": g / 1e6, "after": x, "before": y} for g, x, y in sorted(gaps, reverse=True)[:largest_gaps]],
            "top": [{"name": name, "s": t / 1e6, "calls": int(n)} for name, (t, n) in ranked],
        }  # fmt: skip
    return report


def profile_spans(prof: Any, cuda: bool) -> tuple[dict[str, list[tuple[float, float]]], list[Span], list[Span]]:
    """(phase ranges, top-level spans, timed spans) of a finished torch.profiler ``prof`` (phase_report's input):
    on CUDA the device's kernels and the device-side ranges; on a CPU the operators of the step's thread."""
    from torch.autograd import DeviceType

    events = list(prof.events())
    annotations = [e for e in events if e.is_user_annotation and e.name.startswith(PREFIX)]
    phases: dict[str, list[tuple[float, float]]] = defaultdict(list)
    if cuda:
        on_device = [e for e in annotations if e.device_type == DeviceType.CUDA]
        for e in on_device or annotations:  # no device-side copy of the ranges: the host's (kernels run later)
            phases[e.name[len(PREFIX):]].append((e.time_range.start, e.time_range.end))
        kernels = [Span(e.name, e.time_range.start, e.time_range.end, e.time_range.end - e.time_range.start)
                   for e in events if e.device_type == DeviceType.CUDA and not e.is_user_annotation]  # fmt: skip
        return dict(phases), kernels, kernels
    threads = {e.thread for e in annotations}
    for e in annotations:
        phases[e.name[len(PREFIX):]].append((e.time_range.start, e.time_range.end))
    ops = [e for e in events if e.device_type == DeviceType.CPU and not e.is_user_annotation and e.thread in threads]

    def nested(e) -> bool:
        parent = e.cpu_parent
        while parent is not None:
            if not parent.is_user_annotation:
                return True
            parent = parent.cpu_parent
        return False

    timed = [Span(e.name, e.time_range.start, e.time_range.end, e.self_cpu_time_total) for e in ops]
    top_level = [Span(e.name, e.time_range.start, e.time_range.end, e.self_cpu_time_total) for e in ops if not nested(e)]
    return dict(phases), top_level, timed


def format_report(report: dict[str, dict[str, Any]], kernel: str = "kernel") -> list[str]:
    """phase_report as lines of text: each phase's wall, busy and gaps, its largest gaps and top kernels."""
    lines = []
    for phase, r in report.items():
        share = r["gap_s"] / r["wall_s"] if r["wall_s"] else 0.0
        lines.append(f"{phase}: {r['wall_s']:.4f} s; {kernel}s busy {r['busy_s']:.4f} s; gaps {r['gap_s']:.4f} s "
                     f"({share:.0%} of the phase, {r['gaps']} gaps)")  # fmt: skip
        for g in r["largest_gaps"]:
            lines.append(f"    gap {g['s'] * 1e3:9.3f} ms  after {g['after'][:60]}  before {g['before'][:60]}")
        lines.append(f"  top {kernel}s by time:")
        for t in r["top"]:
            lines.append(f"    {t['s'] * 1e3:10.3f} ms  {t['calls']:6d} calls  {t['name'][:90]}")
    return lines
