"""What a training run shows and writes.
(Over 500 lines: RunLogger and the writers it owns, the metrics files, TensorBoard, W&B, MLflow and the console,
with the number formatting they share.)

Everything lands in one ``output_dir``::

    metrics.jsonl                one JSON object per training step: {"step": 12, "reward/total/mean": 0.5, ...}
    eval.jsonl                   the same, one object per evaluation
    samples/step_000012.jsonl    every completion of a sampled step: prompt, completion, rewards, advantage
    rollouts/step_000012.parquet the same with per-token numbers, for ``grpokit view`` (grpokit.rollout.record)
    tensorboard/                 event files; the tag is the metric key ("reward/math_accuracy/mean"),
                                 evaluations get the prefix "eval/"
    wandb/                       with report_to wandb: the W&B run (offline runs too: WANDB_MODE=offline)

``report_to`` picks the experiment trackers, each through its own library (the same keys, evaluations
under "eval/"): "tensorboard" (the default; torch's SummaryWriter), "wandb" (``wandb.init`` in
``output_dir``, project from WANDB_PROJECT or "grpokit", run name the folder's name, the config as
``config``), "mlflow" (``mlflow.start_run`` on MLflow's tracking URI, MLFLOW_TRACKING_URI or its default,
experiment from MLFLOW_EXPERIMENT_NAME or "grpokit", the config flattened as params), "none". Several may
be given as a list. ``check_report_to`` checks the names and that each package is installed.

NaN and inf are written to the JSON files as ``null``, so every line stays valid JSON for any parser;
TensorBoard receives the float itself. ``step`` is the number of optimizer steps done so far (1 after the
first update), so the console shows ``step/total_steps``.

``holds_run`` tells whether a folder already holds a run (a new run there is refused unless it resumes
or overwrites it) and ``clear_run`` removes such a run's files, and only those. On resume a line cut short
by a crash (the torn last line of ``metrics.jsonl``) is dropped with a warning (``repair_jsonl``).

On a terminal the console shows a live progress bar with a one-line summary; when stderr is not a
terminal (CI, a pipe, a log file) it prints one plain line per step instead, with no control characters::

    step 12/200 | reward 0.512 | acc 0.450 | kl 0.00123 | len 187 | 3.20 s/step | 1234 tok/s | eta 10:01
"""

from __future__ import annotations

import json
import math
import numbers
import operator
import os
import shutil
import sys
import time
import warnings
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Column

# the trackers' names are a config rule (train.report_to), checked with the rest of the config
from grpokit.config.checks import check_report_to
from grpokit.core.files import replace_whole

# The console summary: (metric key, format), in display order. Keys missing from a step are left out.
SUMMARY_FORMATS: tuple[tuple[str, str], ...] = (
    ("reward/total/mean", "reward {:.3f}"),
    ("accuracy", "acc {:.3f}"),
    ("kl", "kl {:.3g}"),
    ("completion_len/mean", "len {:.0f}"),
    ("time/step", "{:.2f} s/step"),
    ("tokens_per_s", "{:.0f} tok/s"),
)
LOSS_FORMAT = "loss {:.4f}"
"""A run without rewards (grpokit sft) shows its loss first, and the last held-out loss beside it (issue 52)."""

_tensorboard_warned = False  # warn once per process, not once per run, when tensorboard is missing

class RunLogger:
    """Writes a run's metrics, evaluations and samples, and shows its progress.

    Usage::

        with RunLogger("runs/gsm8k", total_steps=200) as log:
            for step in range(1, 201):
                ...
                log.log_step(step, {"reward/total/mean": 0.5, "kl": 0.001, "time/step": 3.2})
            log.log_eval(200, {"accuracy": 0.61})

    ``resume=True`` appends to ``metrics.jsonl`` and ``eval.jsonl`` instead of starting them afresh (after
    dropping a line a crash cut short, with a warning); steps logged twice (after resuming from an earlier checkpoint) are both kept, and readers such as
    :func:`grpokit.run.plots.plot_training_curves` take the last line of each step.
    """

    def __init__(
        self,
        output_dir: str | Path,
        *,
        total_steps: int,
        tensorboard: bool = True,
        console: bool = True,
        resume: bool = False,
        report_to: str | list[str] | None = None,
        config: dict[str, Any] | None = None,
    ) -> None:
        """``report_to``: the trackers (see the module docstring; default "tensorboard"); ``tensorboard=False``
        drops TensorBoard from them. ``config`` (the run's settings) goes to W&B and MLflow."""
        if total_steps < 1:
            raise ValueError(f"total_steps must be at least 1, got {total_steps}")
        self.output_dir = Path(output_dir)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self.total_steps = total_steps
        self.metrics_path = self.output_dir / "metrics.jsonl"
        self.eval_path = self.output_dir / "eval.jsonl"
        self.samples_dir = self.output_dir / "samples"

        if resume:
            for path in (self.metrics_path, self.eval_path):
                warning = repair_jsonl(path)
                if warning and console:
                    print(f"grpokit: warning: {warning}", file=sys.stderr, flush=True)
        mode = "a" if resume else "w"
        self._metrics_file: TextIO = open(self.metrics_path, mode, encoding="utf-8")
        self._eval_file: TextIO = open(self.eval_path, mode, encoding="utf-8")
        chosen = check_report_to("tensorboard" if report_to is None else report_to, key="report_to")
        self.report_to = [name for name in chosen if tensorboard or name != "tensorboard"]
        self._writer = (
            _make_summary_writer(self.output_dir / "tensorboard") if "tensorboard" in self.report_to else None
        )
        self._trackers: list[_Tracker] = []
        try:
            if "wandb" in self.report_to:
                self._trackers.append(_WandbTracker(self.output_dir, config or {}, resume))
            if "mlflow" in self.report_to:
                self._trackers.append(_MlflowTracker(self.output_dir, config or {}))
        except BaseException:  # a tracker that cannot start: leave nothing open behind
            self._close_trackers()
            self._metrics_file.close()
            self._eval_file.close()
            if self._writer is not None:
                self._writer.close()
            raise

        self._console = console
        self._eval_loss: float | None = None  # the last held-out loss, shown on a run's step lines without rewards
        # (monotonic time, step) at the first log_step of this process: the ETA is measured from there,
        # so a resumed run does not count the steps it did not do.
        self._eta_origin: tuple[float, int] | None = None
        self._progress: Progress | None = None
        if console and _stderr_is_tty():
            self._progress = Progress(
                TextColumn("[bold]step"),
                MofNCompleteColumn(table_column=Column(no_wrap=True)),
                BarColumn(bar_width=24),
                TimeElapsedColumn(),
                TextColumn("eta {task.fields[eta]}", table_column=Column(no_wrap=True)),
                # the summary takes the rest of the line; on a narrow terminal the bar and clock give way first
                TextColumn(
                    "{task.fields[summary]}",
                    markup=False,
                    table_column=Column(ratio=1, no_wrap=True, overflow="ellipsis"),
                ),
                console=Console(stderr=True),
            )
            self._task = self._progress.add_task("train", total=total_steps, eta="-", summary="")
            self._progress.start()
        self._closed = False

    # ----------------------------------------------------------------------------------------------
    def log_step(self, step: int, metrics: dict[str, float]) -> None:
        """Record one training step: a line of ``metrics.jsonl``, TensorBoard scalars, the console."""
        step = operator.index(step)
        values = _numeric_metrics(metrics)
        _write_jsonl_line(self._metrics_file, {"step": step, **values})
        self._add_scalars("", step, values)
        if self._console:
            self._show_step(step, values)

    def log_eval(self, step: int, metrics: dict[str, float]) -> None:
        """Record one evaluation: a line of ``eval.jsonl``, TensorBoard scalars under "eval/", the console."""
        step = operator.index(step)
        values = _numeric_metrics(metrics)
        _write_jsonl_line(self._eval_file, {"step": step, **values})
        self._add_scalars("eval/", step, values)
        if isinstance(values.get("loss"), numbers.Real):
            self._eval_loss = float(values["loss"])
        if self._console:
            shown = ", ".join(f"{key} {_format_value(value)}" for key, value in values.items())
            self.print(f"eval @ step {step}: {shown}")

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> Path:
        """Write ``samples/step_{step:06d}.jsonl``, one row per line, and return its path.

        A row is whatever helps to read the step later, e.g. ``{"prompt": ..., "completion": ...,
        "reward": 1.0, "rewards": {"math_accuracy": 1.0, "format": 0.0}}``. NaN and inf become null,
        objects JSON cannot hold (a tensor, a path) are written as their ``str``.
        """
        step = operator.index(step)
        self.samples_dir.mkdir(parents=True, exist_ok=True)
        path = self.samples_dir / f"step_{step:06d}.jsonl"
        with open(path, "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(_json_safe(row), ensure_ascii=False, allow_nan=False, default=str) + "\n")
        for tracker in self._trackers:
            tracker.log_table(step, "completions", rows)
        return path

    def print(self, msg: object) -> None:
        """Print a message to the console (stderr) above the progress bar, without breaking it."""
        if not self._console:
            return
        if self._progress is not None:
            self._progress.console.print(str(msg), markup=False, highlight=False)
        else:
            print(msg, file=sys.stderr, flush=True)

    def close(self) -> None:
        """Stop the progress bar and flush and close every file; calling it twice is harmless."""
        if self._closed:
            return
        self._closed = True
        if self._progress is not None:
            self._progress.stop()
        self._metrics_file.close()
        self._eval_file.close()
        if self._writer is not None:
            self._writer.close()
        self._close_trackers()

    def _close_trackers(self) -> None:
        while self._trackers:
            self._trackers.pop().close()

    def __enter__(self) -> RunLogger:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ----------------------------------------------------------------------------------------------
    def _add_scalars(self, prefix: str, step: int, values: dict[str, float | int | None]) -> None:
        given = {prefix + key: value for key, value in values.items() if value is not None}
        if self._writer is not None:
            for key, value in given.items():  # None was given as None; NaN still reaches TensorBoard as NaN
                self._writer.add_scalar(key, value, step)
        for tracker in self._trackers:
            tracker.log(step, given)

    def _show_step(self, step: int, values: dict[str, float | int | None]) -> None:
        shown = [fmt.format(values[key]) for key, fmt in SUMMARY_FORMATS if values.get(key) is not None]
        if values.get("reward/total/mean") is None and values.get("loss") is not None:  # SFT: its loss first
            held_out = [] if self._eval_loss is None else [f"eval {LOSS_FORMAT.format(self._eval_loss)}"]
            shown = [LOSS_FORMAT.format(values["loss"]), *held_out, *shown]
        summary = " | ".join(shown)
        eta = self._eta(step, values.get("time/step"))
        if self._progress is not None:
            self._progress.update(self._task, completed=step, eta=eta, summary=summary)
        else:
            parts = [f"step {step}/{self.total_steps}", summary, f"eta {eta}"]
            print(" | ".join(p for p in parts if p), file=sys.stderr, flush=True)

    def _eta(self, step: int, time_per_step: float | int | None) -> str:
        """Wall-clock seconds per step since the first step seen (this includes evaluation and
        checkpointing); before there are two steps to measure, the reported "time/step"."""
        now = time.monotonic()
        if self._eta_origin is None:
            self._eta_origin = (now, step)
        origin_time, origin_step = self._eta_origin
        if step > origin_step:
            seconds_per_step = (now - origin_time) / (step - origin_step)
        elif time_per_step is not None and math.isfinite(time_per_step):
            seconds_per_step = float(time_per_step)
        else:
            return "-"
        return _format_duration(seconds_per_step * max(self.total_steps - step, 0))


def reward_metric_names(names: list[str]) -> list[str]:
    """The names under which rewards are logged (``reward/<name>/mean``) and plotted: a reward named by
    a file or module (``path/to/my_rewards.py:brevity``, ``pkg.mod:brevity``) goes by its function name
    (``brevity``), as TRL names a reward by its ``__name__``; built-in names stay as they are. Two rewards
    whose function names clash keep their file or module too (``a.score`` and ``b.score``), so a metric
    key never holds a path or a ':' (TensorBoard would split it into folders, MLflow refuses ':')."""
    short = [_function_name(name) for name in names]
    clashes = {n for n in short if short.count(n) > 1}
    qualified = [_qualified_name(name) if s in clashes else s for name, s in zip(names, short)]
    return [q if qualified.count(q) == 1 else name for name, q in zip(names, qualified)]


def reward_metric_name(name: str) -> str:
    """``reward_metric_names`` of one reward: ``"rewards/my_rewards.py:brevity"`` -> ``"brevity"``."""
    return _function_name(name)


def _function_name(name: str) -> str:
    return name.rsplit(":", 1)[1] if ":" in name else name


def _qualified_name(name: str) -> str:
    """``"path/to/a.py:score"`` -> ``"a.score"``; ``"pkg.mod:score"`` -> ``"mod.score"``."""
    if ":" not in name:
        return name
    where, function = name.rsplit(":", 1)
    where = Path(where).stem if where.endswith(".py") else where.rsplit(".", 1)[-1]
    return f"{where}.{function}"


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Read a JSONL file written by :class:`RunLogger` (``metrics.jsonl``, ``eval.jsonl``, samples).

    Blank lines are skipped; so is a final line cut short by a crash mid-write (it has no newline and
    does not parse). Any other malformed line raises ``json.JSONDecodeError``.
    """
    text = Path(path).read_text(encoding="utf-8")
    lines = text.split("\n")
    records = [json.loads(line) for line in lines[:-1] if line.strip()]
    tail = lines[-1]
    if tail.strip():
        try:
            records.append(json.loads(tail))
        except json.JSONDecodeError:
            pass  # the half-written last line of an interrupted run
    return records


# What a run writes into its output folder; the first five mark a folder as holding a run.
RUN_FILES = ("metrics.jsonl", "eval.jsonl", "checkpoints", "config.yaml", "summary.json")
RUN_OUTPUTS = (*RUN_FILES, "samples", "rollouts", "view.html", "tensorboard", "curves.png")


def holds_run(output_dir: str | Path) -> list[str]:
    """The run files present in ``output_dir`` (empty: no run there)."""
    folder = Path(output_dir)
    return [name for name in RUN_FILES if (folder / name).exists()] if folder.is_dir() else []


def clear_run(output_dir: str | Path) -> None:
    """Delete a previous run's files from ``output_dir``; anything else in the folder is left alone."""
    folder = Path(output_dir)
    for name in RUN_OUTPUTS:
        path = folder / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()


def repair_jsonl(path: str | Path) -> str | None:
    """Drop the lines of a JSONL file that do not parse (a line torn by a crash mid-write) and end the
    file with a newline, so that appending to it gives valid lines. Returns a warning, or None when the
    file was fine (or absent)."""
    path = Path(path)
    if not path.is_file():
        return None
    data = path.read_bytes()
    if not data:
        return None
    kept, dropped = [], []
    for number, line in enumerate(data.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            json.loads(line)
            kept.append(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            dropped.append(number)
    if not dropped and data.endswith(b"\n"):
        return None
    replace_whole(path, b"".join(line + b"\n" for line in kept))
    if not dropped:
        return None  # a complete last line that only lacked its newline
    which = "the torn last line" if dropped == [len(data.split(b"\n"))] else f"line(s) {dropped}"
    return f"{path}: dropped {which}, cut short by an interrupted run"


# --------------------------------------------------------------------------------------------------
def _make_summary_writer(log_dir: Path) -> Any:
    global _tensorboard_warned
    try:
        from torch.utils.tensorboard import SummaryWriter  # imported here: it takes about 2 s
    except ImportError as err:
        if not _tensorboard_warned:
            warnings.warn(
                f"TensorBoard logging is off: {err}. Install it with `pip install tensorboard`, or pass "
                "tensorboard=False to RunLogger to silence this warning.",
                stacklevel=3,
            )
            _tensorboard_warned = True
        return None
    return SummaryWriter(log_dir=str(log_dir), flush_secs=30)


class _Tracker:
    """An experiment tracker reached through its own library: ``log(step, {key: number})``, ``close()``."""

    def log(self, step: int, values: dict[str, float | int]) -> None:
        raise NotImplementedError

    def log_table(self, step: int, key: str, rows: list[dict[str, Any]]) -> None:
        """A table of rows (the step's completions); trackers without tables ignore it."""

    def close(self) -> None:
        raise NotImplementedError


class _WandbTracker(_Tracker):
    """``wandb.init`` with the run in ``output_dir/wandb``; WANDB_MODE=offline keeps it local (``wandb sync``
    uploads it later). A resumed grpokit run starts a new W&B run in the same project and group."""

    def __init__(self, output_dir: Path, config: dict[str, Any], resume: bool) -> None:
        import wandb

        self._run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "grpokit"),
            name=output_dir.resolve().name,
            group=output_dir.resolve().name,
            dir=str(output_dir),
            config=config,
            job_type="resume" if resume else "train",
            reinit="finish_previous",
        )

    def log(self, step: int, values: dict[str, float | int]) -> None:
        if values:
            self._run.log(values, step=step)

    def log_table(self, step: int, key: str, rows: list[dict[str, Any]]) -> None:
        """``wandb.Table`` under ``key`` (TRL logs its completions as "completions"); values W&B cannot
        type are written as their str."""
        import wandb

        columns = list(dict.fromkeys(k for row in rows for k in row))
        data = [[_table_value(row.get(c)) for c in columns] for row in rows]
        self._run.log({key: wandb.Table(columns=columns, data=data)}, step=step)

    def close(self) -> None:
        self._run.finish()


# MLflow accepts only these characters in metric and parameter names ("reward/file.py:fn/mean" has a ':').
_MLFLOW_NAME_OK = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-. /")


def _mlflow_name(key: str) -> str:
    """MLflow's name for ``key``: "/" written as "." and characters MLflow refuses as "_". MLflow's file
    store makes a folder of each "/", so "eval/maj_at_4" (a file) and "eval/maj_at_4/no_answer" (inside a
    folder of the same name) could not both be written; with no "/" no name can be another's folder."""
    return "".join(ch if ch in _MLFLOW_NAME_OK else "_" for ch in key.replace("/", "."))


class _MlflowTracker(_Tracker):
    """``mlflow.start_run`` on MLflow's own tracking URI (MLFLOW_TRACKING_URI, else its default), the
    config flattened into params ("optim.lr"), metrics through ``log_metrics``."""

    def __init__(self, output_dir: Path, config: dict[str, Any]) -> None:
        import mlflow

        self._mlflow = mlflow
        experiment = os.environ.get("MLFLOW_EXPERIMENT_NAME", "grpokit")
        try:
            mlflow.set_experiment(experiment)
            self._run = mlflow.start_run(run_name=output_dir.resolve().name)
        except Exception as e:  # MLflow raises its own exception types for a store it cannot open
            raise RuntimeError(
                f"report_to mlflow: cannot open MLflow's tracking store {mlflow.get_tracking_uri()!r} "
                f"({type(e).__name__}: {str(e).splitlines()[0][:200]}); set MLFLOW_TRACKING_URI, e.g. to "
                "http://localhost:5000 or sqlite:///mlflow.db (pip install 'grpokit[mlflow]')."
            ) from e
        params = {_mlflow_name(k): str(v)[:500] for k, v in _flatten(config).items()}
        for start in range(0, len(params), 100):  # MLflow takes at most 100 params per call
            mlflow.log_params(dict(list(params.items())[start : start + 100]))

    def log(self, step: int, values: dict[str, float | int]) -> None:
        if values:
            self._mlflow.log_metrics({_mlflow_name(k): float(v) for k, v in values.items()}, step=step)

    def close(self) -> None:
        self._mlflow.end_run()


def _flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"optim": {"lr": 1e-6}}`` -> ``{"optim.lr": 1e-6}``; lists are kept whole."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def _numeric_metrics(metrics: dict[str, Any]) -> dict[str, float | int | None]:
    """Check that every value is a number (or None) and turn it into a plain ``float``/``int``.

    Accepts Python and NumPy numbers and anything ``float()`` takes, such as a 0-dim tensor.
    """
    if "step" in metrics:
        raise ValueError('"step" is passed as its own argument; remove it from the metrics dict')
    values: dict[str, float | int | None] = {}
    for key, value in metrics.items():
        if not isinstance(key, str):
            raise TypeError(f"metric keys must be strings, got {key!r}")
        if value is None:
            values[key] = None
        elif isinstance(value, numbers.Integral):  # bool included: True -> 1
            values[key] = int(value)
        else:
            try:
                values[key] = float(value)
            except (TypeError, ValueError) as err:
                raise TypeError(f"metric {key!r} must be a number, got {type(value).__name__}") from err
    return values


def _json_safe(value: Any) -> Any:
    """The same structure with NaN/inf replaced by None and NumPy scalars made plain Python numbers."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        value = float(value)
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value  # json.dumps(default=str) deals with the rest


def _table_value(value: Any) -> Any:
    value = _json_safe(value)
    return value if value is None or isinstance(value, bool | int | float | str) else json.dumps(value, default=str)


def _write_jsonl_line(f: TextIO, record: dict[str, Any]) -> None:
    # One write per line, flushed at once: a crash loses at most the line being written.
    f.write(json.dumps(_json_safe(record), allow_nan=False) + "\n")
    f.flush()


def _format_value(value: float | int | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _format_duration(seconds: float) -> str:
    """``61`` -> ``"1:01"``, ``3725`` -> ``"1:02:05"``."""
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def result_console() -> Console:
    """A console for results (tables) on stdout: the terminal's width on a terminal, else wide enough
    that a table in a log file or a pipe is never cut (rich would cut it to 80 columns)."""
    try:
        tty = sys.stdout.isatty()
    except (AttributeError, ValueError):
        tty = False
    return Console(file=sys.stdout, width=None if tty else 200)


def _stderr_is_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced by an object without isatty, or closed
        return False
