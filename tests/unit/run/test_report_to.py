"""train.report_to: TensorBoard, W&B (offline) and MLflow (file store) through their own libraries.

The W&B and MLflow tests skip when the package is not installed (they are extras, not in `dev`)."""

import glob
import sys
import time

import pytest

from grpokit.config.checks import check_report_to
from grpokit.config.schema import ConfigError, load_config
from grpokit.run.log import RunLogger


def test_check_report_to_names_and_order():
    assert check_report_to("tensorboard") == ["tensorboard"]
    assert check_report_to("none") == []
    assert check_report_to(["tensorboard", "none", "tensorboard"]) == ["tensorboard"]
    with pytest.raises(ValueError, match=r"train.report_to='wandbb' is not one of \['tensorboard', 'wandb'"):
        check_report_to(["tensorboard", "wandbb"])


@pytest.mark.parametrize("tracker", ["wandb", "mlflow"])
def test_missing_package_is_a_config_error_with_the_pip_command(monkeypatch, tracker):
    monkeypatch.setitem(sys.modules, tracker, None)  # how Python marks a module as not importable
    with pytest.raises(ConfigError) as e:
        load_config(None, [f"train.report_to=[tensorboard,{tracker}]"])
    assert str(e.value) == (
        f"train.report_to='{tracker}' needs the {tracker} package, which is not installed: "
        f"pip install 'grpokit[{tracker}]'"
    )


def test_tensorboard_false_drops_it_from_report_to(tmp_path):
    with RunLogger(tmp_path, total_steps=1, console=False, tensorboard=False, report_to="tensorboard") as log:
        assert log.report_to == []
    assert not (tmp_path / "tensorboard").exists()


def test_wandb_offline(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_PROJECT", "grpokit-test")
    config = {"optim": {"lr": 1e-6}}
    with RunLogger(tmp_path, total_steps=2, console=False, report_to=["wandb"], config=config) as log:
        assert log.report_to == ["wandb"]
        log.log_step(1, {"reward/total/mean": 0.25, "kl": None})
        log.log_step(2, {"reward/total/mean": 0.75})
        log.log_eval(2, {"accuracy": 0.5})
    assert not (tmp_path / "tensorboard").exists()
    (run_file,) = glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "run-*.wandb"))
    # protobuf records, where keys and JSON values appear as bytes; W&B's service process may still be
    # writing them after finish() returns
    deadline = time.monotonic() + 20
    while b"eval/accuracy" not in (data := open(run_file, "rb").read()) and time.monotonic() < deadline:
        time.sleep(0.1)
    for expected in (b"reward/total/mean", b"0.75", b"eval/accuracy", b"grpokit-test", b"optim", b"lr"):
        assert expected in data, expected
    assert b'"kl"' not in data  # None is left out, as for TensorBoard


def test_mlflow_file_store(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    uri = f"file:{tmp_path / 'mlruns'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps the file store behind this
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "grpokit-test")
    config = {"optim": {"lr": 1e-6}, "rewards": [{"name": "my.py:fn"}]}
    out = tmp_path / "run1"
    with RunLogger(
        out, total_steps=2, console=False, report_to=["tensorboard", "mlflow"], config=config
    ) as log:
        log.log_step(1, {"reward/total/mean": 0.25, "reward/my.py:fn/mean": 1.0})
        log.log_step(2, {"reward/total/mean": 0.75})
        log.log_eval(2, {"accuracy": 0.5, "maj_at_4": 0.25, "maj_at_4/no_answer": 0.5})  # a name and its "folder"
    assert (out / "tensorboard").is_dir()
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("grpokit-test").experiment_id])
    assert run.info.run_name == "run1"
    assert run.data.params["optim.lr"] == "1e-06"
    history = client.get_metric_history(run.info.run_id, "reward.total.mean")  # "/" is "." in MLflow
    assert [(m.step, m.value) for m in history] == [(1, 0.25), (2, 0.75)]
    assert client.get_metric_history(run.info.run_id, "eval.accuracy")[0].value == 0.5
    assert client.get_metric_history(run.info.run_id, "reward.my.py_fn.mean")[0].value == 1.0
    assert client.get_metric_history(run.info.run_id, "eval.maj_at_4")[0].value == 0.25
    assert client.get_metric_history(run.info.run_id, "eval.maj_at_4.no_answer")[0].value == 0.5
