"""A full disk named as such (grpokit.core.files) and the free-space check before a run starts
(grpokit.run.preflight): hand-computed sizes and counts, and the exception chains writers raise."""

import errno
import shutil
from pathlib import Path

import pytest
import torch

from grpokit.core.errors import TrainingError
from grpokit.core.files import disk_full_message, no_space, size_text
from grpokit.model.precision import PRECISIONS
from grpokit.run.preflight import check_free_space, checkpoint_bytes, checkpoints_at_peak


def test_no_space_finds_a_full_disk_in_the_chain_or_the_text():
    full = OSError(errno.ENOSPC, "No space left on device", "/data/run/x")
    try:
        try:
            raise full
        except OSError as inner:
            raise RuntimeError("file write failed") from inner
    except RuntimeError as outer:
        assert no_space(outer) is full  # the OSError itself, for its file name
    assert no_space(OSError(errno.EDQUOT, "Disk quota exceeded"))
    # safetensors' and tokenizers' own types: only the text says so
    assert no_space(Exception("Error while serializing: I/O error: No space left on device (os error 28)")) is True
    assert not no_space(OSError(errno.EACCES, "Permission denied", "/data/run/x"))
    assert not no_space(ValueError("bad value"))


def test_the_disk_full_line_names_the_path_its_free_space_and_the_need(tmp_path):
    e = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "run" / "metrics.jsonl"))
    line = disk_full_message(e, needed=3 * 2**20)
    assert line.startswith(f"disk full: no space left on the disk writing {tmp_path / 'run' / 'metrics.jsonl'} (")
    assert "free on its disk; about 3.0 MiB needed; OSError: [Errno 28]" in line
    assert "train.output_dir" in line and "--resume" in line and "\n" not in line
    nameless = OSError(errno.ENOSPC, "No space left on device")  # os.write and friends name no file
    line = disk_full_message(nameless, folder=tmp_path)
    assert f"train.output_dir={str(tmp_path)!r}: " in line and "free on its disk" in line
    quota = disk_full_message(OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert quota.startswith("disk full: disk quota exceeded")
    sizes = [size_text(n) for n in (812, 3.5 * 2**20, 12 * 2**30, None)]
    assert sizes == ["812 bytes", "3.5 MiB", "12.0 GiB", "unknown"]


def test_a_checkpoints_size_is_weights_and_optimizer_states_of_the_trainable_parameters():
    model = torch.nn.Sequential(torch.nn.Linear(10, 4), torch.nn.Linear(4, 2))  # 44 + 10 = 54 parameters
    # fp32: 16 bytes a parameter (weight 4, gradient 4, two AdamW moments 8), the gradient not saved: 12
    assert checkpoint_bytes(model, PRECISIONS["fp32"].bytes_per_param) == 54 * 12
    model[0].requires_grad_(False)  # frozen (LoRA's base): not in the checkpoint
    assert checkpoint_bytes(model, PRECISIONS["fp32"].bytes_per_param) == 10 * 12
    half = torch.nn.Linear(10, 4).to(torch.bfloat16)  # bf16_kahan: 10 bytes, the 2-byte gradient not saved
    assert checkpoint_bytes(half, PRECISIONS["bf16_kahan"].bytes_per_param) == 44 * 8


def test_checkpoints_on_the_disk_at_once():
    assert checkpoints_at_peak(100, 10, 0, 0) == 10  # keep all: one every 10 steps, step 100's the last
    assert checkpoints_at_peak(105, 10, 0, 0) == 11  # and one more at the end
    assert checkpoints_at_peak(100, 0, 0, 0) == 1  # only the last
    assert checkpoints_at_peak(100, 10, 2, 0) == 3  # the third is written before the oldest goes
    assert checkpoints_at_peak(100, 10, 2, 2) == 1  # two on the disk already (a resume): one more at a time
    assert checkpoints_at_peak(5, 10, 3, 0) == 1  # no save before the end


def test_a_run_whose_first_checkpoint_cannot_fit_is_refused_and_one_whose_later_ones_may_not_is_warned(tmp_path):
    free = shutil.disk_usage(tmp_path).free
    with pytest.raises(TrainingError, match=r"disk full: train.output_dir='.*' has .* free on its disk and one"):
        check_free_space(tmp_path / "run", free + 2**30, 1)
    warning = check_free_space(tmp_path / "run", free // 2 + 1, 2)
    assert warning is not None and "2 checkpoints of about" in warning and "train.keep_checkpoints" in warning
    assert check_free_space(tmp_path / "run", 1, 3) is None
    assert check_free_space(Path("/no/such/folder/run"), 1, 1) is None  # read on the nearest existing folder, /
