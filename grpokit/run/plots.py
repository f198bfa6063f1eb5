"""Training curves of a run, drawn from the ``metrics.jsonl`` that :class:`grpokit.run.log.RunLogger` writes.

The figure is made with ``matplotlib.figure.Figure`` and saved through the Agg canvas: no display, no
``pyplot`` global state, so it is safe on a headless server and inside a notebook alike.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from grpokit.run.log import read_metrics, reward_metric_name

# Noisy per-step curves are drawn faintly and overlaid with an exponential moving average of this weight
# (TensorBoard's smoothing slider), once a curve has at least SMOOTH_MIN_POINTS points.
SMOOTHING = 0.9
SMOOTH_MIN_POINTS = 20

TIME_KEYS = ("time/generation", "time/scoring", "time/update")
COMPLETION_LEN_KEYS = {
    "completion_len/mean": "all",
    "completion_len/correct": "correct",
    "completion_len/incorrect": "incorrect",
}


def plot_training_curves(
    metrics_path: str | Path,
    out_png: str | Path,
    *,
    eval_path: str | Path | None = None,
    title: str | None = None,
) -> Path:
    """Draw a grid of the main training curves against step and save it as a PNG.

    Panels: reward (``reward/total/mean`` and every per-function ``reward/<name>/mean``), accuracy
    (``accuracy``; evaluation ``accuracy`` from ``eval_path`` as markers), KL (``kl``), completion length
    (``completion_len/mean``, ``/correct``, ``/incorrect``; y-axis from 0), clip fraction (``clip_frac``), entropy
    (``entropy``), grad norm (``grad_norm``) and the time split of a step (``time/generation``,
    ``time/scoring``, ``time/update``, stacked). A panel whose keys never appear says so instead of
    drawing; null values (NaN, inf) are skipped. When a step was logged twice (a resumed run), its last
    line wins. Returns ``Path(out_png)``.
    """
    fig = training_curves_figure(metrics_path, eval_path=eval_path, title=title)
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=100)
    return out_png


def training_curves_figure(
    metrics_path: str | Path, *, eval_path: str | Path | None = None, title: str | None = None
) -> Figure:
    """The figure ``plot_training_curves`` saves (eight axes, in the order its docstring lists them)."""
    series = _series_by_key(read_metrics(metrics_path))
    eval_series = _series_by_key(read_metrics(eval_path)) if eval_path is not None else {}

    fig = Figure(figsize=(20, 8.5), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, 4, sharex=True).ravel()
    fig.suptitle(title if title is not None else Path(metrics_path).parent.name or str(metrics_path))

    reward_keys = ["reward/total/mean"] + sorted(
        k for k in series if k.startswith("reward/") and k.endswith("/mean") and k != "reward/total/mean"
    )
    # the name between "reward/" and "/mean" may be a path ("reward/lib/my.py:brevity/mean" in older runs)
    _lines_panel(
        axes[0],
        "reward",
        series,
        {k: reward_metric_name(k[len("reward/") : -len("/mean")]) for k in reward_keys},
    )
    _accuracy_panel(axes[1], series, eval_series)
    _lines_panel(axes[2], "KL to reference", series, {"kl": "kl"})
    _lines_panel(axes[3], "completion length (tokens)", series, COMPLETION_LEN_KEYS, from_zero=True)
    _lines_panel(axes[4], "clip fraction", series, {"clip_frac": "clip_frac"})
    _lines_panel(axes[5], "entropy", series, {"entropy": "entropy"})
    _lines_panel(axes[6], "grad norm", series, {"grad_norm": "grad_norm"})
    _time_panel(axes[7], series)
    for ax in axes[4:]:
        ax.set_xlabel("step")
    return fig


# --------------------------------------------------------------------------------------------------
Series = tuple[list[int], list[float]]  # (steps, values), sorted by step, finite values only


def _series_by_key(records: Iterable[dict[str, Any]]) -> dict[str, Series]:
    """``[{"step": 1, "kl": 0.1}, {"step": 2, "kl": None}]`` -> ``{"kl": ([1], [0.1])}``."""
    by_key: dict[str, dict[int, float]] = {}
    for record in records:
        step = record.get("step")
        if not isinstance(step, int):
            continue
        for key, value in record.items():
            if key == "step" or isinstance(value, bool) or not isinstance(value, int | float):
                continue
            if math.isfinite(value):
                by_key.setdefault(key, {})[step] = float(value)  # a later line for the same step wins
            else:
                by_key.setdefault(key, {}).pop(step, None)
    return {
        key: (sorted(points), [points[s] for s in sorted(points)]) for key, points in by_key.items() if points
    }


def _ema(values: list[float], weight: float = SMOOTHING) -> list[float]:
    """Debiased exponential moving average, as TensorBoard draws it."""
    smoothed, last, norm = [], 0.0, 0.0
    for v in values:
        last = weight * last + (1 - weight) * v
        norm = weight * norm + (1 - weight)
        smoothed.append(last / norm)
    return smoothed


def _plot(ax: Axes, series: Series, label: str, linewidth: float = 1.2) -> None:
    steps, values = series
    if len(values) >= SMOOTH_MIN_POINTS:
        (raw,) = ax.plot(steps, values, alpha=0.25, linewidth=0.8)
        ax.plot(steps, _ema(values), color=raw.get_color(), label=label, linewidth=linewidth)
    else:
        ax.plot(steps, values, marker=".", label=label, linewidth=linewidth)


def _no_data(ax: Axes, message: str) -> None:
    ax.text(
        0.5,
        0.5,
        message,
        transform=ax.transAxes,
        ha="center",
        va="center",
        color="gray",
    )


def _missing_note(keys: Iterable[str]) -> str:
    return "no data for\n" + "\n".join(keys)


def _lines_panel(
    ax: Axes, title: str, series: dict[str, Series], labels: dict[str, str], from_zero: bool = False
) -> None:
    """One line per key present. ``from_zero``: the y-axis starts at 0, so a quantity that only drifts a
    few percent (completion length: 187 -> 191 tokens) is drawn as the near-flat line it is, not
    stretched over the whole panel by auto-scaling."""
    ax.set_title(title)
    present = [k for k in labels if k in series]
    if not present:
        _no_data(ax, _missing_note(labels))
        return
    for key in present:
        _plot(ax, series[key], labels[key], linewidth=2.0 if key == "reward/total/mean" else 1.2)
    if from_zero:
        top = max(max(series[k][1]) for k in present)
        ax.set_ylim(bottom=0, top=max(top * 1.1, 1.0))
    if len(present) > 1:
        ax.legend(fontsize="small")
    ax.grid(alpha=0.3)


def _accuracy_panel(ax: Axes, series: dict[str, Series], eval_series: dict[str, Series]) -> None:
    ax.set_title("accuracy")
    train = series.get("accuracy")
    evaluation = eval_series.get("accuracy", eval_series.get("eval/accuracy"))
    if train is None and evaluation is None:
        _no_data(ax, _missing_note(["accuracy"]))
        return
    if train is not None:
        _plot(ax, train, "train")
    if evaluation is not None:
        ax.plot(*evaluation, marker="o", linestyle="--", color="black", label="eval")
    ax.legend(fontsize="small")
    ax.grid(alpha=0.3)


def _time_panel(ax: Axes, series: dict[str, Series]) -> None:
    """Seconds per step, stacked generation / scoring / update, at the steps where every part is known."""
    ax.set_title("time per step (s)")
    present = [k for k in TIME_KEYS if k in series]
    if not present:
        _no_data(ax, _missing_note(TIME_KEYS))
        return
    values = {k: dict(zip(*series[k])) for k in present}
    steps = sorted(set.intersection(*(set(v) for v in values.values())))
    if not steps:
        _no_data(ax, "no step has all of\n" + "\n".join(present))
        return
    ax.stackplot(
        steps,
        [[values[k][s] for s in steps] for k in present],
        labels=[k.split("/")[1] for k in present],
        alpha=0.8,
    )
    ax.legend(fontsize="small", loc="upper left")
    ax.grid(alpha=0.3)
