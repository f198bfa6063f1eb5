"""A pipeline's run tree is not trusted on stage.json alone (issue 37): a stage recorded as done whose
checkpoint or samples file is gone, or a stage.json that is not valid JSON, is a one-line error before
anything runs (before: reported done / rerun silently); `--check` names local models and data files that
do not exist (before: passed)."""

import json

import pytest
import yaml

import grpokit.pipeline.run
from grpokit.cli.main import main
from grpokit.pipeline.spec import load_pipeline, stage_hash


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """A pipeline file with one rl and one sample stage, an output tree whose stages are both recorded as
    done with their real hashes and existing outputs; running anything fails the test."""

    def no(*args, **kwargs):
        raise AssertionError("nothing may run")

    monkeypatch.setattr(grpokit.pipeline.run, "run_child", no)
    model = tmp_path / "model"
    model.mkdir()
    (tmp_path / "prompts.jsonl").write_text('{"prompt": "1+1="}\n')
    stages = [
        {"name": "rl", "kind": "rl", "set": {"data.train": str(tmp_path / "prompts.jsonl")}},
        {"name": "pick", "kind": "sample", "set": {"data.train": str(tmp_path / "prompts.jsonl")}},
    ]
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({"name": "t", "model": str(model), "stages": stages}))
    pipe = load_pipeline(path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "pipeline.json").write_text("{}")
    hashes = {}
    made = {"rl": {"model": str(out / "01-rl" / "final"), "data": None}}
    made["pick"] = {"model": made["rl"]["model"], "data": str(out / "02-pick" / "samples.jsonl")}
    for stage in pipe.stages:
        hashes[stage.index] = stage_hash(stage, hashes, pipe)
        folder = out / stage.folder
        folder.mkdir()
        state = {"name": stage.name, "kind": stage.kind, "hash": hashes[stage.index], "status": "done"}
        (folder / "stage.json").write_text(json.dumps({**state, "outputs": made[stage.name], "command": []}))
    (out / "01-rl" / "final").mkdir()
    (out / "02-pick" / "samples.jsonl").write_text("")
    return path, out


def run(path, out, capsys, *flags):
    code = main(["pipeline", str(path), "--output-dir", str(out), *flags])
    return code, capsys.readouterr().err.strip()


def test_a_finished_stage_whose_checkpoint_is_gone_is_named(tree, capsys):
    path, out = tree
    (out / "01-rl" / "final").rmdir()
    code, err = run(path, out, capsys, "--resume")
    assert code == 2 and len(err.splitlines()) == 1
    assert (
        f"01-rl: stage.json says the stage finished, but its model {out / '01-rl' / 'final'} is missing"
        in err
    )


def test_a_finished_sample_stage_whose_samples_are_gone_is_named(tree, capsys):
    path, out = tree
    (out / "02-pick" / "samples.jsonl").unlink()
    code, err = run(path, out, capsys, "--resume")
    assert code == 2 and "02-pick: stage.json says the stage finished, but its data" in err


@pytest.mark.parametrize("text", ['{"name": "rl", "status": "do', "[]", "\xff\xfe"])
def test_a_stage_json_that_cannot_be_read_is_an_error_not_a_silent_rerun(tree, capsys, text):
    path, out = tree
    (out / "01-rl" / "stage.json").write_bytes(text.encode("latin-1"))
    code, err = run(path, out, capsys, "--resume")
    assert code == 2 and len(err.splitlines()) == 1
    assert f"{out / '01-rl' / 'stage.json'} is not" in err and "remove it to run the stage again" in err


def test_the_intact_tree_is_done_and_runs_nothing(tree, capsys):
    path, out = tree
    code, err = run(path, out, capsys, "--resume")
    assert code == 0 and "01-rl: done before, not rerun" in err and "02-pick: done before, not rerun" in err


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("model", r"model: .*/no-such-model does not exist"),
        ("set", r"stages\[0\] \(rl\)\.set\.data\.train: .*/missing\.jsonl does not exist"),
        ("data", r"stages\[1\] \(pick\)\.data: .*/gone\.jsonl does not exist"),
    ],
)
def test_check_names_local_models_and_data_files_that_do_not_exist(tmp_path, capsys, where, message):
    model = tmp_path / "model"
    model.mkdir()
    data = tmp_path / "prompts.jsonl"
    data.write_text('{"prompt": "1+1="}\n')
    stages = [
        {"name": "rl", "kind": "rl", "set": {"data.train": str(data)}},
        {"name": "pick", "kind": "sample", "set": {"data.train": str(data)}},
    ]
    top = {"name": "t", "model": str(model), "stages": stages}
    if where == "model":
        top["model"] = str(tmp_path / "no-such-model")
    elif where == "set":
        stages[0]["set"]["data.train"] = str(tmp_path / "missing.jsonl")
    else:
        stages[1]["data"] = str(tmp_path / "gone.jsonl")
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(top))
    assert main(["pipeline", str(path), "--check"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and __import__("re").search(message, err), err
    top.update(model="Qwen/Qwen2.5-0.5B")  # a hub id is not a local path: not checked here
    if where != "model":
        return
    path.write_text(yaml.safe_dump(top))
    assert main(["pipeline", str(path), "--check"]) == 0
