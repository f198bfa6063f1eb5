"""Runs that never mix and never lose work: damaged checkpoints are skipped on resume, half-written ones
removed, pruning counts every folder, changed settings need a flag, a torn metrics line is dropped,
an output folder holding a run is refused (and left untouched), signals stop with a checkpoint, and a
full disk is named as such. Tiny real models, real files."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from paths import REPO
from safetensors.torch import load_file
from tiny_model import make_tiny_model, save_tiny_model

from grpokit.cli.main import main
from grpokit.config.schema import ConfigError, load_config
from grpokit.model.checkpoint import list_checkpoints, verify_checkpoint
from grpokit.run.log import read_metrics
from grpokit.trainers.grpo import GRPOTrainer

ROWS = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(5) for b in range(5)]
REWARD_FILE = (
    "def has_seven(prompts, completions, **kw):\n    return [float('7' in c) for c in completions]\n"
)


def has_seven(prompts, completions, **kw):
    """1 when the completion contains a 7: rewards that differ within a group for a random tiny model."""
    return [float("7" in c) for c in completions]


SETTINGS = [
    "train.steps=3",
    "train.save_every=1",
    "train.keep_checkpoints=3",
    "train.samples_every=0",
    "train.tensorboard=false",
    "rollout.group_size=4",
    "rollout.prompts_per_step=2",
    "rollout.max_new_tokens=4",
    "optim.lr=3e-3",
    "data.template=plain",
    "model.device=cpu",
    "eval.enabled=false",
]


def make_trainer(out, *extra, **kwargs):
    model, tok = make_tiny_model("qwen2", seed=0)
    cfg = load_config(None, [*SETTINGS, f"train.output_dir={out}", *extra])
    return GRPOTrainer(
        cfg,
        model=model,
        tokenizer=tok,
        train_rows=ROWS,
        reward_functions=[("has_seven", has_seven, 1.0)],
        **kwargs,
    )


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A 3-step run with a checkpoint after every step: checkpoints/step_000001 .. step_000003."""
    out = tmp_path_factory.mktemp("finished") / "run"
    make_trainer(out).train()
    assert [p.name for p in list_checkpoints(out / "checkpoints")] == [f"step_00000{i}" for i in (1, 2, 3)]
    return out


@pytest.fixture
def run(finished_run, tmp_path):
    """A private copy of the finished run to damage."""
    return Path(shutil.copytree(finished_run, tmp_path / "run"))


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _corrupt(path: Path, where: float) -> None:
    data = bytearray(path.read_bytes())
    at = int(len(data) * where)
    data[at : at + 64] = bytes((b ^ 0xFF) for b in data[at : at + 64])
    path.write_bytes(bytes(data))


DAMAGE = {
    "weights-truncated": lambda d: _truncate(d / "model.safetensors"),
    "weights-empty": lambda d: (d / "model.safetensors").write_bytes(b""),
    "weights-corrupt-header": lambda d: _corrupt(d / "model.safetensors", 0.0),
    "state-truncated": lambda d: _truncate(d / "trainer_state.pt"),
    "state-empty": lambda d: (d / "trainer_state.pt").write_bytes(b""),
    "state-corrupt": lambda d: _corrupt(d / "trainer_state.pt", 0.5),
    "state-missing": lambda d: (d / "trainer_state.pt").unlink(),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_damaged_newest_checkpoint_resumes_from_the_previous_one(run, damage, capsys):
    checkpoints = run / "checkpoints"
    DAMAGE[damage](checkpoints / "step_000003")
    assert verify_checkpoint(checkpoints / "step_000003") is not None
    trainer = make_trainer(run, "train.steps=4", resume=True)
    assert trainer.run.resume_from.name == "step_000002" and trainer.step == 2
    assert "step_000003 is damaged" in capsys.readouterr().err
    saved = load_file(checkpoints / "step_000002" / "model.safetensors")
    params = dict(trainer.model.named_parameters())
    assert len(saved.keys() & params.keys()) == len(params)
    assert all(torch.equal(params[name], value) for name, value in saved.items() if name in params)


def test_the_resumed_run_replaces_the_damaged_checkpoint(run):
    checkpoints = run / "checkpoints"
    DAMAGE["weights-truncated"](checkpoints / "step_000003")
    make_trainer(run, "train.steps=4", resume=True).train()  # redoes step 3, then step 4
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step_000002", "step_000003", "step_000004"]
    assert all(verify_checkpoint(p) is None for p in checkpoints.iterdir())
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [1, 2, 3, 3, 4]


def test_resume_from_an_exact_damaged_checkpoint_stops(run):
    DAMAGE["weights-truncated"](run / "checkpoints" / "step_000003")
    with pytest.raises(ConfigError, match=r"--resume-from step_000003: model.safetensors: .*truncated"):
        make_trainer(run, resume="step_000003")
    assert make_trainer(run, resume="step_000002").step == 2  # an intact one by name


def test_every_checkpoint_damaged_is_a_clear_error(run):
    for step in (1, 2, 3):
        DAMAGE["state-empty"](run / "checkpoints" / f"step_00000{step}")
    with pytest.raises(
        ConfigError, match=r"every checkpoint under .* is damaged \(step_000003: trainer_state"
    ):
        make_trainer(run, resume=True)


def test_half_written_checkpoints_removed_and_pruning_counts_every_folder(run, capsys):
    """The issue's case: .tmp folders never cleaned up, and an old checkpoint surviving pruning after a
    resume (here step_000001, whose state file a kill mid-delete left missing)."""
    checkpoints = run / "checkpoints"
    (checkpoints / "step_000004.tmp").mkdir()
    (checkpoints / "step_000004.tmp" / "model.safetensors").write_bytes(b"half a file")
    (checkpoints / "step_000001" / "trainer_state.pt").unlink()
    trainer = make_trainer(run, "train.steps=5", "train.keep_checkpoints=2", resume=True)
    assert (checkpoints / "step_000004.tmp").exists()  # nothing is touched before the run starts
    trainer.train()
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step_000004", "step_000005"]
    assert "step_000004.tmp, a checkpoint left half-written" in capsys.readouterr().err


def test_changed_settings_are_listed_and_need_the_flag(run, capsys):
    before = snapshot(run)
    changed = ["rollout.group_size=8", "optim.lr=1e-3", "algo.preset=dr_grpo", "train.steps=4"]
    with pytest.raises(ConfigError) as err:
        make_trainer(run, *changed, resume=True)
    message = str(err.value)
    for change in (
        "rollout.group_size: 4 -> 8",
        "optim.lr: 0.003 -> 0.001",
        "algo.preset: 'grpo' -> 'dr_grpo'",
    ):
        assert change in message
    assert "train.steps" not in message and "--allow-changed-config" in message
    assert snapshot(run) == before  # a run that fails to start changes nothing
    trainer = make_trainer(run, *changed, resume=True, allow_changed_config=True)
    assert trainer.step == 3 and "resuming with changed settings" in capsys.readouterr().err


def test_torn_last_metrics_line_is_dropped_on_resume(run, capsys):
    metrics = run / "metrics.jsonl"
    with metrics.open("a") as f:
        f.write('{"step": 4, "reward/total/me')  # a kill in the middle of a write
    make_trainer(run, "train.steps=4", resume=True).train()
    assert "dropped the torn last line" in capsys.readouterr().err
    lines = metrics.read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 3, 4]  # every line parses


def test_sigint_stops_at_the_end_of_the_step_with_a_checkpoint(tmp_path):
    trainer = make_trainer(tmp_path / "run", "train.steps=50", "train.save_every=0")
    # the signal arrives in the middle of step 2 (from its optimizer step), as Ctrl-C would
    trainer.learner.optimizer.register_step_pre_hook(
        lambda *_: os.kill(os.getpid(), signal.SIGINT) if trainer.step == 1 else None
    )
    summary = trainer.train()
    assert summary["stopped_by"] == "SIGINT" and summary["steps"] == 2
    assert (
        Path(summary["checkpoint"]).name == "step_000002" and verify_checkpoint(summary["checkpoint"]) is None
    )
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handlers restored
    assert make_trainer(tmp_path / "run", "train.steps=3", resume=True).step == 2


# ----------------------------------------------------------------------------- through the CLI


@pytest.fixture
def cli_config(tmp_path):
    """A config file for `grpokit train`: the tiny model, 25 prompts, the has_seven reward from a file."""
    model = save_tiny_model(tmp_path / "model")
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    (tmp_path / "rewards.py").write_text(REWARD_FILE)
    settings = {
        "model": {"name_or_path": str(model), "device": "cpu"},
        "data": {"train": str(data), "template": "plain", "max_prompt_tokens": 16},
        "rollout": {"group_size": 4, "prompts_per_step": 2, "max_new_tokens": 4},
        "optim": {"lr": 3e-3},
        "rewards": [{"name": f"{tmp_path / 'rewards.py'}:has_seven"}],
        "eval": {"enabled": False},
        "train": {"tensorboard": False, "samples_every": 0, "output_dir": str(tmp_path / "cli_run")},
    }
    path = tmp_path / "cfg.yaml"
    path.write_text(json.dumps(settings))  # JSON is YAML
    return path


def test_output_folder_holding_a_run_is_refused_and_left_untouched(run, cli_config, capsys):
    before = snapshot(run)
    assert main(["train", str(cli_config), f"train.output_dir={run}", "train.steps=1"]) == 2
    err = capsys.readouterr().err
    assert "already holds a run" in err and "--resume" in err and "--overwrite" in err
    # --overwrite, but the run fails to start: the old run is still whole
    bad_data = f"data.train={run.parent / 'missing.jsonl'}"
    assert main(["train", str(cli_config), f"train.output_dir={run}", bad_data, "--overwrite"]) == 2
    assert snapshot(run) == before
    # --overwrite that starts: the old run's files are replaced, not mixed with the new ones
    assert main(["train", str(cli_config), f"train.output_dir={run}", "train.steps=1", "--overwrite"]) == 0
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step_000001"]
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [1]


@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_and_exits_143(cli_config, tmp_path):
    out = tmp_path / "cli_run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "grpokit.cli.main", "train", str(cli_config), "train.steps=100000"],
        cwd=REPO,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        if (out / "metrics.jsonl").is_file() and len((out / "metrics.jsonl").read_text().splitlines()) >= 1:
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert "Traceback" not in err
    stopped = [line for line in err.splitlines() if line.startswith("grpokit: stopped by SIGTERM after step")]
    assert len(stopped) == 1 and "continue with --resume" in stopped[0]
    steps = len(read_metrics(out / "metrics.jsonl"))
    (checkpoint,) = list_checkpoints(out / "checkpoints")
    assert checkpoint.name == f"step_{steps:06d}" and verify_checkpoint(checkpoint) is None
    assert main(["train", str(cli_config), "--resume", f"train.steps={steps + 1}"]) == 0
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")][-1] == steps + 1


def _can_mount_tmpfs() -> bool:
    if not sys.platform.startswith("linux") or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"], capture_output=True
    )
    return probe.returncode == 0


@pytest.mark.slow
@pytest.mark.skipif(not _can_mount_tmpfs(), reason="needs unshare and user namespaces to mount a small tmpfs")
def test_disk_full_is_named_as_such(cli_config, tmp_path):
    """A 300 KiB filesystem: more than the ~270 KiB the check before the start expects of a checkpoint, so
    the run starts; the weights (94 KB) fit, the trainer state (217 KB) then does not."""
    disk = tmp_path / "small_disk"
    disk.mkdir()
    command = (
        f"mount -t tmpfs -o size=300k tmpfs {disk} && exec {sys.executable} -m grpokit.cli.main train {cli_config} "
        f"train.steps=1 train.output_dir={disk / 'run'}"
    )
    done = subprocess.run(["unshare", "-rm", "sh", "-c", command], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 5, done.stderr  # I/O (issue 48: it was 1, the code of a run that failed)
    assert "grpokit: RunIOError: disk full: no space left" in done.stderr and "Traceback" not in done.stderr


def test_the_summary_is_read_by_rank_0_only_and_written_whole(tmp_path):
    """Under torchrun rank 1 read summary.json while rank 0 was writing it (CI saw JSONDecodeError): only the
    writer reads it, and it is written to a temporary file first and renamed."""
    from types import SimpleNamespace

    from grpokit.config.schema import load_config
    from grpokit.run.state import RunState

    out = tmp_path / "run"
    out.mkdir()
    (out / "summary.json").write_text("")  # as another rank would see it in the middle of a write
    state = RunState(load_config(None, [f"train.output_dir={out}"]), resume=True, curves=False)
    state.dist = SimpleNamespace(is_main=False)
    assert state.previous_summary({}) == {}
    state.dist = SimpleNamespace(is_main=True)
    state.finish({"eval_accuracy_before": 0.25, "steps": 3})
    assert [p.name for p in out.iterdir()] == ["summary.json"]
    assert state.previous_summary({}) == {"eval_accuracy_before": 0.25}
