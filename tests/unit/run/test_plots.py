import json

import matplotlib.image
import pytest

from grpokit.run.log import RunLogger
from grpokit.run.plots import _ema, _series_by_key, plot_training_curves

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _assert_png(path):
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert len(data) > 20_000  # eight panels with axes and text, not a blank image
    height, width, _ = matplotlib.image.imread(path).shape
    assert (width, height) == (2000, 850)  # figsize (20, 8.5) at 100 dpi


def test_plot_from_a_synthetic_run_with_missing_keys_and_nulls(tmp_path):
    records = []
    for step in range(1, 31):
        records.append(
            {
                "step": step,
                "reward/total/mean": 0.1 + step / 40,
                "reward/math_accuracy/mean": step / 40,
                "reward/format/mean": 0.1,
                "accuracy": step / 40,
                "kl": None if step == 5 else 0.001 * step,  # NaN written as null
                "completion_len/mean": 300 - step,
                "completion_len/correct": 250 - step,
                "grad_norm": 1.0,
                "time/generation": 2.0,
                "time/update": 1.0,
                # no clip_frac, entropy, completion_len/incorrect, time/scoring
            }
        )
    metrics = _write_jsonl(tmp_path / "metrics.jsonl", records)
    evals = _write_jsonl(
        tmp_path / "eval.jsonl", [{"step": 10, "accuracy": 0.2}, {"step": 30, "accuracy": 0.7}]
    )

    out = plot_training_curves(metrics, tmp_path / "plots" / "curves.png", eval_path=evals, title="synthetic")

    assert out == tmp_path / "plots" / "curves.png"
    _assert_png(out)


def test_plot_of_an_empty_run_has_a_note_in_every_panel(tmp_path):
    metrics = _write_jsonl(tmp_path / "metrics.jsonl", [])
    out = plot_training_curves(str(metrics), str(tmp_path / "empty.png"))
    _assert_png(out)


def test_plot_from_run_logger_files_after_a_resume(tmp_path):
    with RunLogger(tmp_path, total_steps=4, tensorboard=False, console=False) as log:
        for step in (1, 2, 3):
            log.log_step(step, {"reward/total/mean": 0.1 * step, "kl": float("nan")})
    with RunLogger(tmp_path, total_steps=4, tensorboard=False, console=False, resume=True) as log:
        for step in (3, 4):  # resumed from the checkpoint of step 2
            log.log_step(step, {"reward/total/mean": 1.0 * step, "time/generation": 1.0})
        log.log_eval(4, {"accuracy": 0.5})
    out = plot_training_curves(
        tmp_path / "metrics.jsonl", tmp_path / "curves.png", eval_path=tmp_path / "eval.jsonl"
    )
    _assert_png(out)


def test_series_skip_nulls_keep_the_last_line_of_a_step_and_sort_by_step():
    records = [
        {"step": 2, "kl": 0.2, "note": "text is ignored"},
        {"step": 1, "kl": 0.1, "accuracy": None},
        {"step": 3, "kl": None},
        {"step": 2, "kl": 0.25},  # logged again after a resume: this one wins
        {"kl": 9.0},  # no step: ignored
    ]
    assert _series_by_key(records) == {"kl": ([1, 2], [0.1, 0.25])}


def test_ema_is_debiased():
    # weight 0.5: after 1.0 the average is 0.5 / 0.5 = 1.0; after 0.0 it is 0.25 / 0.75 = 1/3
    assert _ema([1.0, 0.0], weight=0.5) == pytest.approx([1.0, 1 / 3], abs=1e-12)
    assert _ema([4.0, 4.0, 4.0]) == pytest.approx([4.0, 4.0, 4.0], abs=1e-12)
