"""`grpokit pipeline`: bad files are one-line errors before any model loads; a pipeline killed in the middle
of a stage continues that stage with --resume and reruns none before it; a finished stage whose config
changed is refused."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from paths import REPO
from tiny_model import save_tiny_model

from grpokit.cli.main import main

ROWS = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(5) for b in range(5)]
REWARDS = (
    "import time\n"
    "def has_seven(prompts, completions, **kw):\n    return [float('7' in c) for c in completions]\n"
    "def slow_seven(prompts, completions, **kw):  # a step lasts >= 0.5 s: the kill lands mid-stage\n"
    "    time.sleep(0.5)\n    return has_seven(prompts, completions)\n"
)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("pipeline")
    model = save_tiny_model(root / "model")
    (root / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    (root / "rewards.py").write_text(REWARDS)
    return root, model


def pipeline_file(root: Path, model: Path, stages: list, **top) -> Path:
    path = root / f"p{len(list(root.glob('p*.yaml')))}.yaml"
    path.write_text(yaml.safe_dump({"name": "t", "model": str(model), **top, "stages": stages}))
    return path


def sample_stage(root: Path, **extra) -> dict:
    settings = {
        "data.train": str(root / "prompts.jsonl"),
        "data.template": "plain",
        "sample.n": 2,
        "sample.limit": 4,
        "sample.max_new_tokens": 3,
        "keep.drop_truncated": False,
        "rewards": [{"name": f"{root / 'rewards.py'}:has_seven", "min": None}],
    }
    return {"kind": "sample", "set": {**settings, **extra}}


def rl_stage(root: Path, steps: int) -> dict:
    settings = {
        "data.train": str(root / "prompts.jsonl"),
        "data.template": "plain",
        "train.steps": steps,
        "train.save_every": 1,
        "train.keep_checkpoints": 0,
        "train.tensorboard": False,
        "train.samples_every": 0,
        "train.stop_after_flat_steps": 0,
        "rollout.group_size": 2,
        "rollout.prompts_per_step": 2,
        "rollout.max_new_tokens": 3,
        "optim.lr": 3e-3,
        "eval.enabled": False,
        "model.device": "cpu",
        "rewards": [{"name": f"{root / 'rewards.py'}:slow_seven"}],
    }
    return {"kind": "rl", "set": settings}


@pytest.mark.parametrize(
    ("stages", "message"),
    [
        ([{"kind": "dpo"}], r"stages\[0\]: unknown stage kind 'dpo'; expected one of sft, rl, sample"),
        ([{"kind": "rl", "modle": "x"}], r"stages\[0\]: unknown key 'modle'; did you mean 'model'\?"),
        (
            [{"kind": "rl", "name": "a", "model": "b"}, {"kind": "sample", "name": "b"}],
            r"stages\[0\] \(a\)\.model='b' reads the output of a later stage \(stages\[1\]\)",
        ),
        (
            [{"kind": "sample", "name": "a", "model": "b"}, {"kind": "rl", "name": "b", "model": "a"}],
            r"the stages read each other in a cycle \(a -> b -> a\)",
        ),
        ([{"kind": "rl", "name": "a", "model": "a"}], r"cycle \(a -> a\)"),
        (
            [{"kind": "rl", "name": "a"}, {"kind": "rl", "data": "a"}],
            r"\.data='a' is a rl stage, which writes no data",
        ),
        (
            [{"kind": "rl", "set": {"rollout.group_sise": 4}}],
            r"stages\[0\] \(rl, rl\): .*unknown config key 'rollout.group_sise'. Did you mean 'group_size'\?",
        ),
        (
            [{"kind": "sample", "set": {"keep.max_per_prompt": -1}}],
            r"stages\[0\] \(sample, sample\): keep.max_per_prompt=-1 is not allowed",
        ),
    ],
)
def test_bad_pipeline_files_are_one_line_errors_before_any_model_loads(
    files, tmp_path, monkeypatch, capsys, stages, message
):
    import grpokit.model.loading
    import grpokit.pipeline.run

    def no(*args, **kwargs):
        raise AssertionError("nothing may load or run for a bad pipeline file")

    monkeypatch.setattr(grpokit.model.loading, "load_policy", no)
    monkeypatch.setattr(grpokit.pipeline.run, "run_child", no)
    root, model = files
    path = pipeline_file(tmp_path, model, stages)
    assert main(["pipeline", str(path), "--output-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("grpokit: pipeline: ")
    assert __import__("re").search(message, err), err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # four processes load torch: about 35 s on a quiet 2-core machine
def test_killed_mid_stage_continues_that_stage_and_reruns_none_before_it(files, tmp_path, capsys):
    root, model = files
    evaluation = {"data": str(root / "prompts.jsonl"), "template": "plain", "max_new_tokens": 3, "limit": 4}
    path = pipeline_file(tmp_path, model, [sample_stage(root), rl_stage(root, steps=6)], eval=evaluation)
    out = tmp_path / "out"
    command = [sys.executable, "-m", "grpokit.cli.main", "pipeline", str(path), "--output-dir", str(out)]
    log = open(tmp_path / "pipeline.log", "w")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(command, cwd=REPO, stderr=log, start_new_session=True)
    checkpoints = out / "02-rl" / "checkpoints"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None and not (checkpoints / "step_000002").is_dir():
        time.sleep(0.05)
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the pipeline and its stage, as a crash would
    except ProcessLookupError:
        pass  # it ended by itself: the assertion below shows why
    proc.wait()
    log.close()
    tail = (tmp_path / "pipeline.log").read_text()[-2000:]
    assert (checkpoints / "step_000002").is_dir(), f"the rl stage never saved its second checkpoint:\n{tail}"
    first = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in (out / "01-sample").rglob("*") if p.is_file()}
    assert json.loads((out / "01-sample" / "stage.json").read_text())["status"] == "done"
    assert json.loads((out / "02-rl" / "stage.json").read_text())["status"] == "running"
    step1 = {p: p.stat().st_mtime_ns for p in (checkpoints / "step_000001").iterdir()}
    killed_at = max(int(p.name.split("_")[1]) for p in checkpoints.iterdir() if not p.name.endswith(".tmp"))

    capsys.readouterr()
    assert (
        main(["pipeline", str(path), "--output-dir", str(out)]) == 2
    )  # a run is there: --resume or --overwrite
    assert "already holds a pipeline run" in capsys.readouterr().err
    assert main(["pipeline", str(path), "--output-dir", str(out), "--resume"]) == 0
    err = capsys.readouterr().err
    assert "01-sample: done before, not rerun" in err and "02-rl: continuing" in err
    assert {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in first} == first  # stage 1 untouched
    state = json.loads((out / "02-rl" / "stage.json").read_text())
    assert state["status"] == "done" and "--resume" in state["command"]
    assert state["summary"]["steps"] == 6
    logged = [json.loads(line)["step"] for line in (out / "02-rl" / "metrics.jsonl").read_text().splitlines()]
    assert logged[-1] == 6 and killed_at in logged
    assert {p: p.stat().st_mtime_ns for p in step1} == step1  # continued from its checkpoints, not restarted
    table = (out / "stages.md").read_text()
    assert [line.split("|")[1].strip() for line in table.splitlines()[2:]] == [
        "00-base",
        "01-sample",
        "02-rl",
    ]
    assert (out / "stages.png").is_file()

    # a finished stage whose settings changed is refused, and nothing runs
    changed = pipeline_file(tmp_path, model, [sample_stage(root, **{"sample.n": 3}), rl_stage(root, steps=6)])
    assert main(["pipeline", str(changed), "--output-dir", str(out), "--resume"]) == 2
    err = capsys.readouterr().err
    assert "stage 01-sample changed since it finished" in err and "--rerun-changed" in err
    assert {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in first} == first
    # asked to: the changed stage runs again, and so does the stage that reads its model (hash chain)
    assert main(["pipeline", str(changed), "--output-dir", str(out), "--resume", "--rerun-changed"]) == 0
    candidates = (out / "01-sample" / "candidates" / "00000000.jsonl").read_text().splitlines()
    assert len(candidates) == 4 * 3  # sample.n=3 now
    rerun = json.loads((out / "02-rl" / "stage.json").read_text())
    assert rerun["status"] == "done" and "--overwrite" in rerun["command"] and rerun["hash"] != state["hash"]


def test_demo_pipeline_file_checks_and_its_chains_score_full_marks(tmp_path, monkeypatch):
    """The demo's pipeline file passes every check; its cold-start chains are what the rewards want."""
    import grpokit.demos.r1 as demo_r1
    from grpokit.pipeline.spec import check_stage_configs, load_pipeline
    from grpokit.rewards import format_lenient, math_accuracy

    assert demo_r1.chain("27+45=") == "<think>27+45</think><answer>72</answer>"
    prompts = ["7+45=", "49+49=", "0+0="]
    chains = [demo_r1.chain(p) for p in prompts]
    assert math_accuracy(prompts, chains, answer=["52", "98", "0"]) == [1.0, 1.0, 1.0]
    assert format_lenient(prompts, chains) == [1.0, 1.0, 1.0]
    paths = {name: tmp_path / f"{name}.jsonl" for name in ("cold_start", "train", "eval")}
    paths["base"] = tmp_path / "base"
    for path in paths.values():
        path.write_text(json.dumps({"prompt": "1+2=", "answer": "3"}) + "\n")
    monkeypatch.setattr(demo_r1, "prepare_r1_demo", lambda log=print: paths)
    pipe = load_pipeline(demo_r1.write_demo_pipeline(tmp_path / "out"))
    check_stage_configs(pipe)
    assert [(s.name, s.kind) for s in pipe.stages] == [
        ("cold_start", "sft"),
        ("reason", "rl"),
        ("rejection", "sample"),
        ("distill", "sft"),
        ("final", "rl"),
        ("rl_alone", "rl"),
    ]
