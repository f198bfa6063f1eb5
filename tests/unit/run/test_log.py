import json
import math
import sys

import pytest

from grpokit.run import log as runlog
from grpokit.run.log import RunLogger, read_metrics


def _strict_json_lines(path):
    """Parse with a parser that rejects NaN/Infinity, as JSON parsers outside Python do."""

    def reject(name):
        raise ValueError(f"non-standard JSON constant {name}")

    return [json.loads(line, parse_constant=reject) for line in path.read_text().splitlines()]


def test_metrics_jsonl_round_trip_with_nan_as_null(tmp_path):
    with RunLogger(tmp_path, total_steps=3, tensorboard=False, console=False) as log:
        log.log_step(1, {"reward/total/mean": 0.5, "kl": 0.01, "completion_len/mean": 187})
        log.log_step(2, {"reward/total/mean": float("nan"), "kl": float("inf"), "grad_norm": -float("inf")})
        log.log_step(3, {"accuracy": True, "skipped": None})

    assert _strict_json_lines(tmp_path / "metrics.jsonl") == [
        {"step": 1, "reward/total/mean": 0.5, "kl": 0.01, "completion_len/mean": 187},
        {"step": 2, "reward/total/mean": None, "kl": None, "grad_norm": None},
        {"step": 3, "accuracy": 1, "skipped": None},
    ]
    assert read_metrics(tmp_path / "metrics.jsonl")[0] == {
        "step": 1,
        "reward/total/mean": 0.5,
        "kl": 0.01,
        "completion_len/mean": 187,
    }


def test_each_step_is_flushed_before_close(tmp_path):
    log = RunLogger(tmp_path, total_steps=2, tensorboard=False, console=False)
    log.log_step(1, {"kl": 0.25})
    # another process (a plot, `tail -f`) sees the line while the run is still going
    assert read_metrics(tmp_path / "metrics.jsonl") == [{"step": 1, "kl": 0.25}]
    log.close()
    log.close()  # twice is harmless


def test_resume_appends_and_fresh_run_truncates(tmp_path):
    with RunLogger(tmp_path, total_steps=4, tensorboard=False, console=False) as log:
        log.log_step(1, {"kl": 0.1})
        log.log_eval(1, {"accuracy": 0.2})
    with RunLogger(tmp_path, total_steps=4, tensorboard=False, console=False, resume=True) as log:
        log.log_step(2, {"kl": 0.2})
        log.log_eval(2, {"accuracy": 0.3})
    assert read_metrics(tmp_path / "metrics.jsonl") == [{"step": 1, "kl": 0.1}, {"step": 2, "kl": 0.2}]
    assert read_metrics(tmp_path / "eval.jsonl") == [
        {"step": 1, "accuracy": 0.2},
        {"step": 2, "accuracy": 0.3},
    ]

    with RunLogger(tmp_path, total_steps=4, tensorboard=False, console=False) as log:
        log.log_step(1, {"kl": 0.5})
    assert read_metrics(tmp_path / "metrics.jsonl") == [{"step": 1, "kl": 0.5}]
    assert read_metrics(tmp_path / "eval.jsonl") == []


def test_tensorboard_scalars_are_written_under_the_metric_keys(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with RunLogger(tmp_path, total_steps=2, console=False) as log:
        log.log_step(1, {"reward/math_accuracy/mean": 0.25, "kl": 0.5, "missing": None})
        log.log_step(2, {"reward/math_accuracy/mean": 0.75, "kl": float("nan")})
        log.log_eval(2, {"accuracy": 0.625})

    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert set(events.Tags()["scalars"]) == {"reward/math_accuracy/mean", "kl", "eval/accuracy"}
    reward = events.Scalars("reward/math_accuracy/mean")
    assert [(e.step, e.value) for e in reward] == [(1, 0.25), (2, 0.75)]  # exact in float32
    kl = events.Scalars("kl")
    assert kl[0].value == 0.5 and math.isnan(kl[1].value)  # TensorBoard keeps the NaN itself
    assert [(e.step, e.value) for e in events.Scalars("eval/accuracy")] == [(2, 0.625)]


def test_missing_tensorboard_warns_once_and_logging_goes_on(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # makes the import fail
    monkeypatch.setattr(runlog, "_tensorboard_warned", False)
    with pytest.warns(UserWarning, match="TensorBoard logging is off") as record:
        with RunLogger(tmp_path / "a", total_steps=1, console=False) as log:
            log.log_step(1, {"kl": 0.5})
        with RunLogger(tmp_path / "b", total_steps=1, console=False) as log:
            log.log_step(1, {"kl": 0.5})
    assert len(record) == 1
    assert read_metrics(tmp_path / "b" / "metrics.jsonl") == [{"step": 1, "kl": 0.5}]
    assert not (tmp_path / "a" / "tensorboard").exists()


def test_log_samples_writes_one_row_per_line(tmp_path):
    rows = [
        {"prompt": "2+2?", "completion": "4 ✓", "reward": 1.0, "rewards": {"math": 1.0, "format": 0.0}},
        {"prompt": "3+3?", "completion": "", "reward": float("nan"), "rewards": {"math": 0.0}},
    ]
    with RunLogger(tmp_path, total_steps=10, tensorboard=False, console=False) as log:
        path = log.log_samples(7, rows)
    assert path == tmp_path / "samples" / "step_000007.jsonl"
    assert _strict_json_lines(path) == [rows[0], {**rows[1], "reward": None}]


def test_non_tty_prints_one_plain_line_per_step(tmp_path, capsys):
    # under pytest's capture sys.stderr is not a terminal, as in CI or a pipe
    with RunLogger(tmp_path, total_steps=10, tensorboard=False) as log:
        log.log_step(
            1,
            {
                "reward/total/mean": 0.5,
                "accuracy": 0.25,
                "kl": 0.00123,
                "completion_len/mean": 187.4,
                "time/step": 2.0,
                "tokens_per_s": 1234.4,
                "not_in_summary": 3.0,
            },
        )
        log.log_step(2, {"not_in_summary": 3.0})  # no summary keys: step and eta only
        log.log_step(3, {"kl": float("nan")})
        log.log_eval(3, {"accuracy": 0.6, "reward/total/mean": 0.55})
        log.print("saved checkpoint [step 3]")
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    # first step: eta from "time/step", 2 s * 9 steps left = 18 s
    assert (
        lines[0]
        == "step 1/10 | reward 0.500 | acc 0.250 | kl 0.00123 | len 187 | 2.00 s/step | 1234 tok/s | eta 0:18"
    )
    assert lines[1].startswith("step 2/10 | eta ")
    assert lines[2].startswith("step 3/10 | kl nan | eta ")
    assert lines[3] == "eval @ step 3: accuracy 0.6, reward/total/mean 0.55"
    assert lines[4] == "saved checkpoint [step 3]"
    assert len(lines) == 5
    assert "\x1b" not in err and "\r" not in err


def test_console_false_prints_nothing(tmp_path, capsys):
    with RunLogger(tmp_path, total_steps=2, tensorboard=False, console=False) as log:
        log.log_step(1, {"kl": 0.1})
        log.log_eval(1, {"accuracy": 0.5})
        log.print("hello")
    assert capsys.readouterr() == ("", "")


def test_tty_uses_a_progress_bar(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(runlog, "_stderr_is_tty", lambda: True)
    with RunLogger(tmp_path, total_steps=3, tensorboard=False) as log:
        for step in (1, 2, 3):
            log.log_step(step, {"reward/total/mean": 0.5, "time/step": 1.0})
        log.print("a message [not markup]")
    err = capsys.readouterr().err
    assert "a message [not markup]" in err
    assert "3/3" in err and "reward 0.500" in err
    assert read_metrics(tmp_path / "metrics.jsonl")[-1] == {
        "step": 3,
        "reward/total/mean": 0.5,
        "time/step": 1.0,
    }


def test_bad_metrics_are_rejected(tmp_path):
    with RunLogger(tmp_path, total_steps=2, tensorboard=False, console=False) as log:
        with pytest.raises(ValueError, match="step"):
            log.log_step(1, {"step": 1, "kl": 0.1})
        with pytest.raises(TypeError, match="'note' must be a number"):
            log.log_step(1, {"note": "hello"})
        with pytest.raises(TypeError):
            log.log_step(1.5, {"kl": 0.1})  # a step is an integer


def test_read_metrics_skips_a_half_written_last_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "kl": 0.1}\n\n{"step": 2, "kl": 0.2}\n{"step": 3, "k')
    assert read_metrics(path) == [{"step": 1, "kl": 0.1}, {"step": 2, "kl": 0.2}]
    path.write_text('{"step": 1, "kl": 0.1}\n{"step": 2, "k\n{"step": 3}\n')
    with pytest.raises(json.JSONDecodeError):  # damage in the middle is not silently dropped
        read_metrics(path)


@pytest.mark.parametrize(("seconds", "text"), [(0, "0:00"), (61, "1:01"), (3725, "1:02:05"), (59.6, "1:00")])
def test_format_duration(seconds, text):
    assert runlog._format_duration(seconds) == text
