"""The first change a newcomer makes after the demo, the model alone (issue 52, item 4): one line that names the model
and says the demo's data goes with the demo's model only (before: 'data.train is empty', the model unnamed even when
its path did not exist)."""

from __future__ import annotations

from grpokit.cli.main import main


def test_the_model_alone_names_the_model_and_the_missing_data(tmp_path, capsys):
    assert main(["train", "model.name_or_path=Qwen/Qwen2.5-0.5B-Instruct", "--output-dir", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "model.name_or_path=Qwen/Qwen2.5-0.5B-Instruct without a config file" in err
    assert "give data.train=FILE" in err and "does not exist" not in err  # a hub id is not checked here
    missing = tmp_path / "my-model"
    assert main(["train", f"model.name_or_path={missing}", "--output-dir", str(tmp_path / "b")]) == 2
    assert f"model.name_or_path={missing} does not exist" in capsys.readouterr().err


def test_print_config_still_prints_the_model_alone(capsys):
    assert main(["train", "model.name_or_path=./m", "--print-config"]) == 0
    assert "name_or_path: ./m" in capsys.readouterr().out


def test_the_demo_tables_change_is_in_points(capsys):
    """The demo's table said '+90.5%' for 5.0% -> 95.5% (issue 52, item 6): a change of accuracy is in points."""
    from grpokit.cli.main import _points, _print_table

    _print_table(0.05, 0.955)
    out = capsys.readouterr().out
    assert "+90.5 points" in out and "+90.5%" not in out
    assert _points(-0.0125) == "-1.2 points"
