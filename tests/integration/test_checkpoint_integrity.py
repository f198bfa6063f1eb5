"""Checkpoints that cannot be written or cannot be trusted: a full disk (a real small tmpfs; through the
CLI: test_resume.test_disk_full_is_named_as_such), before the run starts too (too small for a checkpoint,
no room for a file), torn tensor bytes (checksums written at save time) and weights of another architecture
(shapes)."""

import gc
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from tiny_model import ADDITION_ROWS, SMALL_RUN, make_tiny_model, save_tiny_model, small_trainer

from grpokit import GRPOTrainer
from grpokit.cli.main import main
from grpokit.config.schema import ConfigError
from grpokit.core.errors import TrainingError
from grpokit.model.checkpoint import CHECKSUM_FILE, CheckpointError, save_checkpoint, verify_checkpoint

ROWS, SETTINGS = ADDITION_ROWS, SMALL_RUN


def trainer(out: Path, steps: int, **kwargs) -> GRPOTrainer:
    return small_trainer(out, steps, "train.save_every=1", "train.keep_checkpoints=0", **kwargs)


@pytest.fixture
def tmpfs(tmp_path):
    """Mount small tmpfs file systems under tmp_path (root only); unmounted afterwards."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a full-disk test needs root to mount a small tmpfs")
    mounted = []

    def mount(kib: int, inodes: int | None = None) -> Path:
        where = tmp_path / f"disk_{kib}k_{len(mounted)}"
        where.mkdir()
        options = f"size={kib}k" + (f",nr_inodes={inodes}" if inodes else "")
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
        mounted.append(where)
        return where

    yield mount
    gc.collect()  # a failed writer's file may stay open until its exception is collected
    for where in mounted:
        subprocess.run(["umount", "--lazy", str(where)], check=False)  # detached now, freed when unused


def test_any_writer_failing_on_a_full_disk_is_one_named_error_and_leaves_no_tmp(tmpfs):
    """Three disk sizes make three different writers fail: safetensors (SafetensorError), the tokenizers
    library (a bare Exception) and torch.save (RuntimeError); each is the same named error."""
    model, tok = make_tiny_model("qwen2", seed=0)
    state = {"step": 1, "optimizer": {"m": torch.zeros(50_000)}, "scheduler": {}, "stream": {}}
    causes = set()
    for kib in (40, 108, 300):
        disk = tmpfs(kib)
        target = disk / "checkpoints" / "step_000001"
        with pytest.raises(CheckpointError) as e:
            save_checkpoint(target, model, tok, state)
        message = str(e.value)
        assert message.startswith(f"disk full: no space left on the disk of {disk / 'checkpoints'}"), message
        assert (
            f"while writing checkpoint {target}" in message
            and "free there" in message
            and "--resume" in message
        )
        assert sorted(p.name for p in (disk / "checkpoints").iterdir()) == []  # no step_000001.tmp, no step
        causes.add(type(e.value.__cause__).__name__)
    assert len(causes) >= 2, causes  # not one exception type: the rule covers every writer


def test_a_disk_too_small_for_one_checkpoint_is_refused_before_the_first_step(tmpfs):
    """200 KiB free and a checkpoint of the tiny model needs about 270 KiB (weights and AdamW's states; 316
    KiB written): refused before any step or file, naming the folder, the free space and the need. Before,
    the run trained and then failed at its first checkpoint."""
    out = tmpfs(200) / "run"
    with pytest.raises(TrainingError) as e:
        trainer(out, steps=1).train()
    assert str(e.value).startswith(f"disk full: train.output_dir={str(out)!r} has 200.0 KiB free on its disk and ")
    assert "one checkpoint of this model needs about 2" in str(e.value) and "another disk" in str(e.value)
    assert not out.exists()  # nothing written


def test_a_disk_with_no_room_for_a_file_is_one_named_line(tmpfs, tmp_path, capsys):
    """Bytes free but no inode (the disk's root and the run folder use both): the first file the run writes (its
    lock) fails with ENOSPC, before the run starts (exit 2). One line names the file and the disk's state and
    says what to do; before it was "cannot create ... (No space left on device); choose a writable folder"."""
    disk = tmpfs(1024, inodes=2)
    (disk / "run").mkdir()
    model = save_tiny_model(tmp_path / "model")
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    args = [f"model.name_or_path={model}", f"data.train={data}", "rewards=[{name: math_accuracy}]"]
    assert main(["train", *args, "train.steps=1", *SMALL_RUN, f"train.output_dir={disk / 'run'}"]) == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    key = f"train.output_dir={str(disk / 'run')!r}"
    written = f"{disk / 'run'}{os.sep}"
    assert last.startswith(f"grpokit: {key}: disk full: no space left on the disk writing {written}"), last
    assert "free on its disk but no free inodes (df -i)" in last and "train.output_dir" in last
    assert "Traceback" not in err


def test_a_checkpoint_cut_by_a_full_disk_is_never_resumed_from(tmpfs, capsys):
    """480 KiB: warned at the start (two checkpoints of ~270 KiB may not fit), step 1's checkpoint fits and
    step 2's does not. No half of step 2 is left, and a resume takes step 1."""
    out = tmpfs(480) / "run"
    cut = r"disk full: .* while writing checkpoint .*step_000002 .*needs more than"
    with pytest.raises(CheckpointError, match=cut):
        trainer(out, steps=2).train()
    assert "2 checkpoints of about" in capsys.readouterr().err
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_000001"]
    resumed = trainer(out, steps=2, resume=True)
    assert resumed.step == 1 and resumed.run.resume_from.name == "step_000001"
    resumed.run.lock.release()


@pytest.fixture(scope="module")
def two_steps(tmp_path_factory):
    """A run of two steps with a checkpoint after each."""
    out = tmp_path_factory.mktemp("integrity") / "run"
    trainer(out, steps=2).train()
    return out


def copy_run(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_a_torn_tensor_is_caught_by_its_checksum_and_the_previous_checkpoint_is_used(
    two_steps, tmp_path, capsys
):
    out = copy_run(two_steps, tmp_path / "run")
    step2 = out / "checkpoints" / "step_000002"
    assert set(json.loads((step2 / CHECKSUM_FILE).read_text())["sha256"]) == {
        "model.safetensors",
        "ema/model.safetensors",  # the average the policy may take (train.adopt_average, auto: on a CPU)
        "trainer_state.pt",
    }
    weights = step2 / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one byte inside a tensor: header and size unchanged
    weights.write_bytes(bytes(data))
    problem = verify_checkpoint(step2)
    assert problem and "model.safetensors" in problem and "SHA-256" in problem
    resumed = trainer(out, steps=3, resume=True)
    assert resumed.step == 1 and resumed.run.resume_from.name == "step_000001"
    assert "step_000002 is damaged (model.safetensors: SHA-256" in capsys.readouterr().err
    resumed.run.lock.release()
    with pytest.raises(ConfigError, match="--resume-from step_000002: model.safetensors: SHA-256"):
        trainer(out, steps=3, resume="step_000002")


def test_weights_of_another_architecture_are_skipped_like_a_damaged_checkpoint(two_steps, tmp_path, capsys):
    out = copy_run(two_steps, tmp_path / "run")
    step2 = out / "checkpoints" / "step_000002"
    other, _ = make_tiny_model("qwen2", seed=0, hidden_size=48, num_heads=4, intermediate_size=96)
    other.save_pretrained(tmp_path / "other")
    shutil.copy(tmp_path / "other" / "model.safetensors", step2 / "model.safetensors")
    (step2 / CHECKSUM_FILE).unlink()  # structure intact, no checksum: only the shapes can tell
    assert verify_checkpoint(step2) is None
    resumed = trainer(out, steps=3, resume=True)
    assert resumed.step == 1
    err = capsys.readouterr().err
    assert "step_000002 does not fit the model (tensor" in err and "another architecture" in err
    resumed.run.lock.release()
    with pytest.raises(ConfigError, match="--resume-from .*step_000002: its weights do not fit the model"):
        trainer(out, steps=3, resume="step_000002")
