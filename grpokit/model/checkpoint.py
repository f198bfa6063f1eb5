"""Checkpoints: a standard Hugging Face model directory plus the trainer's own state.

    OUTPUT/checkpoints/step_000020/
        config.json, model.safetensors, tokenizer files   <- from_pretrained loads this
        (adapter_config.json, adapter_model.safetensors   <- instead, when training LoRA)
        trainer_state.pt   optimizer, scheduler, data position, step, RNG states

Each checkpoint is written to a temporary sibling directory and renamed into place, so a
crash mid-write never leaves a half checkpoint under the final name; leftover ``step_N.tmp``
folders are removed when the next run starts (``remove_partial``). On resume the newest checkpoint
is verified (``verify_checkpoint``: weight headers and sizes, the state file's zip CRCs) and a
damaged one is skipped for the newest complete one (``find_resumable``).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import struct
import sys
import zipfile
from pathlib import Path
from typing import Any

import torch

from grpokit.core.errors import ConfigError, RunIOError
from grpokit.core.files import free_bytes, no_space, size_text

STATE_FILE = "trainer_state.pt"
CHECKSUM_FILE = "checksums.json"
"""SHA-256 of every weight file and the state file, written last at save time (``write_checksums``)."""
STATE_KEYS = ("step", "optimizer", "scheduler", "stream", "rng")
_STEP_DIR = re.compile(r"^step_(\d+)$")
_PARTIAL_DIR = re.compile(r"^step_(\d+)\.tmp$")


class CheckpointError(RuntimeError):
    pass


class CheckpointWriteError(CheckpointError, RunIOError):
    """A checkpoint could not be written (disk full, a quota, a folder gone): I/O, exit 5
    (grpokit.core.errors); the partial folder is removed, earlier checkpoints are intact."""


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_model_folder(directory: Path, model, tokenizer, state_dict: dict | None = None) -> Path:
    """``model`` (safetensors; a PEFT model: its adapter, as PEFT saves it) and ``tokenizer`` as a Hugging Face
    folder, written into ``directory``, which may already hold other files (TRL's ``save_model(args.output_dir)``
    writes into the run's output folder, beside its logs and checkpoints). Written beside it first, then each
    file moved in (a failure before the moves leaves the folder as it was). Refuses non-finite weights, as checkpoints do.
    ``state_dict``: the weights to write instead of the model's own (consolidated from FSDP shards)."""
    _refuse_non_finite(model, state_dict)
    directory = Path(directory)
    tmp = directory.with_name(f".{directory.name}.save_model.tmp")
    moved: list[str] = []  # the files already moved into the folder
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        tmp.mkdir(parents=True)
        model.save_pretrained(tmp, safe_serialization=True, **({"state_dict": state_dict} if state_dict else {}))
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        directory.mkdir(parents=True, exist_ok=True)
        for entry in sorted(tmp.iterdir()):
            target = directory / entry.name
            if target.is_dir() and entry.is_dir():
                shutil.rmtree(target)  # (save_pretrained writes files; a folder of the same name is replaced whole)
            os.replace(entry, target)
            moved.append(entry.name)
    except BaseException as e:
        written = sum(f.stat().st_size for f in tmp.rglob("*") if f.is_file()) if tmp.is_dir() else 0
        shutil.rmtree(tmp, ignore_errors=True)
        if not isinstance(e, Exception):
            raise
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
        raise CheckpointWriteError(
            f"saving the model into {directory} failed ({type(e).__name__}: {first}; {size_text(written)} written, "
            f"{size_text(free_bytes(directory.parent))} free on its disk); the files written beside it were removed, "
            + (f"and {moved} already moved in replaced their old copies" if moved else "and the folder is as it was")
        ) from e
    shutil.rmtree(tmp, ignore_errors=True)
    return directory


def _refuse_non_finite(model, state_dict: dict | None) -> None:
    given = state_dict is not None
    for name, param in state_dict.items() if given else model.named_parameters():
        if param.is_floating_point() and (given or param.requires_grad) and not torch.isfinite(param).all():
            raise CheckpointError(f"refusing to save: parameter {name} holds NaN/inf")


def save_checkpoint(
    directory: Path,
    model,
    tokenizer,
    trainer_state: dict[str, Any],
    state_dict: dict | None = None,
    subfolders: dict[str, Any] | None = None,
    subfolder_states: dict[str, dict | None] | None = None,
) -> Path:
    """Write model + tokenizer + trainer state atomically to ``directory``. Refuses non-finite weights.
    ``state_dict``: the weights to write instead of the model's own (consolidated from FSDP shards).
    ``subfolders``: more models, each saved as a Hugging Face folder of that name (MODEL_SUBFOLDERS: PPO's
    ``critic/``, a moved ``reference/``); ``subfolder_states``: their consolidated weights, by the same names."""
    _refuse_non_finite(model, state_dict)
    directory = Path(directory)
    tmp = directory.with_name(directory.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        tmp.mkdir(parents=True)
        weights = {"state_dict": state_dict} if state_dict else {}
        model.save_pretrained(tmp, safe_serialization=True, **weights)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        for name, extra in (subfolders or {}).items():
            extra_state = (subfolder_states or {}).get(name)
            extra.save_pretrained(
                tmp / name, safe_serialization=True, **({"state_dict": extra_state} if extra_state else {})
            )
        torch.save({**trainer_state, "rng": rng_state()}, tmp / STATE_FILE)
        write_checksums(tmp)
    except BaseException as e:  # every writer (safetensors, tokenizers, torch) raises its own types
        written = sum(f.stat().st_size for f in tmp.rglob("*") if f.is_file()) if tmp.is_dir() else 0
        shutil.rmtree(tmp, ignore_errors=True)
        if not isinstance(e, Exception):
            raise  # KeyboardInterrupt, SystemExit: the half checkpoint is gone, the stop goes on
        raise CheckpointWriteError(_write_failed(directory, e, written)) from e
    if directory.exists():
        shutil.rmtree(directory)
    tmp.rename(directory)
    return directory


def _write_failed(directory: Path, error: BaseException, written: int = 0) -> str:
    """The one-line message of a checkpoint that could not be written: the folder, the free space, why;
    on a full disk also the bytes it needs, more than the ``written`` ones before the disk filled."""
    parent = directory.parent
    free = size_text(free_bytes(parent))
    first = str(error).strip().splitlines()[0][:200] if str(error).strip() else ""
    cause = f"{type(error).__name__}: {first}" if first else type(error).__name__
    if _disk_full(error, parent):
        return (
            f"disk full: no space left on the disk of {parent} while writing checkpoint {directory} ({cause}); "
            f"{free} free there; it needs more than the {size_text(written)} written before the disk filled. "
            "Free some space (or set train.output_dir to another disk) and continue with --resume; earlier "
            "checkpoints are intact and the partial one was removed."
        )
    return (
        f"writing checkpoint {directory} failed ({cause}; {free} free on the disk of {parent}); the partial "
        "checkpoint was removed and earlier ones are intact: fix the cause and continue with --resume."
    )


def _disk_full(error: BaseException, where: Path) -> bool:
    """ENOSPC anywhere in the exception chain or its text (safetensors and tokenizers raise their own
    types, with "No space left on device (os error 28)" in the message), or a device with less than
    64 MiB left (torch's stream writer says only "unexpected pos" / "file write failed")."""
    if no_space(error):
        return True
    try:
        return shutil.disk_usage(where).free < 64 * 2**20
    except OSError:
        return False


def step_dirs(root: Path) -> list[tuple[int, Path]]:
    """Every ``step_N`` folder under ``root``, complete or not, as (N, path), oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(
        (int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name)) and p.is_dir()
    )


def list_checkpoints(root: Path) -> list[Path]:
    """Step checkpoints under ``root`` that hold a state file (oldest first); temporary ones are ignored."""
    return [p for _, p in step_dirs(root) if (p / STATE_FILE).is_file()]


def remove_partial(root: Path) -> list[Path]:
    """Delete the ``step_N.tmp`` folders a run killed mid-save left behind; return them."""
    root = Path(root)
    partial = [p for p in root.iterdir() if _PARTIAL_DIR.match(p.name)] if root.is_dir() else []
    for p in partial:
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    return partial


def prune_checkpoints(root: Path, keep: int, current_step: int | None = None) -> list[Path]:
    """Keep the newest ``keep`` complete checkpoints (0 = all) and delete every other ``step_N`` folder:
    incomplete ones too, and, when ``current_step`` is given, those beyond it (left by a run that was
    resumed from an earlier checkpoint: they belong to a history this run has replaced). Returns the
    deleted folders."""
    dirs = step_dirs(root)
    stale = [p for n, p in dirs if current_step is not None and n > current_step]
    ranked = [p for n, p in dirs if p not in stale]
    complete = [p for p in ranked if (p / STATE_FILE).is_file()]
    kept = set(complete[-keep:] if keep > 0 else complete)
    doomed = stale + [p for p in ranked if p not in kept]
    for p in doomed:
        shutil.rmtree(p)
    return doomed


MODEL_SUBFOLDERS = ("critic", "reference", "ema")
"""Models a checkpoint may hold beside the policy, each a Hugging Face folder of its own: PPO's critic
(grpokit.train.critic), the moved reference of algo.ref_sync_every (grpokit.train.reference), the averaged weights of
train.ema_decay (grpokit.train.weight_average)."""


def verify_checkpoint(directory: Path) -> str | None:
    """What is wrong with a checkpoint, or None when its weights and state are readable.

    Cheap (no tensor is loaded): each safetensors file's header must parse and its tensors must end
    exactly at the end of the file (catches empty, truncated and overwritten files); the state file's
    zip records must match their CRC32 and hold the trainer's keys.
    """
    directory = Path(directory)
    weights = _weight_files(directory)
    if not weights:
        return "no model*.safetensors / adapter_model.safetensors"
    for name in MODEL_SUBFOLDERS:
        folder = directory / name
        if folder.is_dir():
            folder_weights = _weight_files(folder)
            if not folder_weights:
                return f"{name}/: no model*.safetensors / adapter_model.safetensors"
            weights += folder_weights
    for f in weights:
        problem = safetensors_problem(f)
        if problem:
            return f"{f.relative_to(directory)}: {problem}"
    problem = checksum_problem(directory)  # bytes changed inside a tensor: sizes and headers still agree
    if problem:
        return problem
    state = directory / STATE_FILE
    if not state.is_file():
        return f"no {STATE_FILE}"
    try:
        with zipfile.ZipFile(state) as z:
            bad = z.testzip()
        if bad is not None:
            return f"{STATE_FILE}: record {bad} fails its CRC check"
        loaded = torch.load(state, map_location="cpu", weights_only=False, mmap=True)
    except Exception as e:  # any unreadable file is "damaged", whatever the library raises
        return (
            f"{STATE_FILE}: unreadable ({type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''})"
        )
    missing = [k for k in STATE_KEYS if k not in loaded] if isinstance(loaded, dict) else list(STATE_KEYS)
    if missing:
        return f"{STATE_FILE}: lacks {missing}"
    return None


def safetensors_problem(path: Path) -> str | None:
    """What is wrong with a safetensors file's structure (size, header), or None; no tensor is read."""
    size = path.stat().st_size
    if size < 8:
        return f"{size} bytes: empty or truncated"
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        if header_len > size - 8:
            return "header longer than the file: truncated or corrupt"
        try:
            header = json.loads(f.read(header_len))
        except (UnicodeDecodeError, json.JSONDecodeError):
            return "header is not valid JSON: corrupt"
    try:
        end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
    except (TypeError, KeyError, IndexError):
        return "header lacks data offsets: corrupt"
    if 8 + header_len + end != size:
        return f"{size} bytes but the header describes {8 + header_len + end}: truncated or corrupt"
    return None


def _weight_files(folder: Path) -> list[Path]:
    """A saved model's weight files: its LoRA adapter, or its (possibly sharded) full weights."""
    return sorted(folder.glob("adapter_model.safetensors")) or sorted(folder.glob("model*.safetensors"))


def find_resumable(root: Path) -> tuple[Path, list[tuple[Path, str]]]:
    """The newest checkpoint under ``root`` that verifies, and the damaged newer ones as (path, problem).
    Raises CheckpointError when there is none."""
    root = Path(root)
    damaged: list[tuple[Path, str]] = []
    for _, path in reversed(step_dirs(root)):
        problem = verify_checkpoint(path)
        if problem is None:
            return path, damaged
        damaged.append((path, problem))
    if not damaged:
        raise CheckpointError(
            f"--resume: no checkpoint under {root} to resume from (start afresh with --overwrite)"
        )
    listed = "; ".join(f"{p.name}: {why}" for p, why in damaged)
    raise CheckpointError(f"--resume: every checkpoint under {root} is damaged ({listed})")


def load_trainer_state(directory: Path, *, mmap: bool = False) -> dict[str, Any]:
    """The trainer state of a checkpoint; ``mmap=True`` maps its tensors instead of reading them
    (cheap when only the step or the config is wanted)."""
    path = Path(directory) / STATE_FILE
    if not path.is_file():
        raise CheckpointError(f"{directory} has no {STATE_FILE}: not a grpokit checkpoint")
    return torch.load(path, map_location="cpu", weights_only=False, mmap=mmap)


def load_weights_into(model, directory: Path) -> None:
    """Copy a checkpoint's weights into an already built (possibly LoRA-wrapped) model."""
    from safetensors.torch import load_file

    directory = Path(directory)
    if (directory / "adapter_model.safetensors").is_file():
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(model, load_file(directory / "adapter_model.safetensors"))
        return
    files = sorted(directory.glob("model*.safetensors"))
    if not files:
        raise CheckpointError(f"{directory} holds no model*.safetensors")
    state = {}
    for f in files:
        state.update(load_file(f))
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {k for k in missing if k.endswith("lm_head.weight")}
    if set(missing) - tied or unexpected:
        raise CheckpointError(
            f"{directory}: weights do not match the model (missing {sorted(set(missing) - tied)[:5]}, "
            f"unexpected {sorted(unexpected)[:5]})"
        )
    if tied and hasattr(model, "tie_weights"):
        model.tie_weights()


# --- checksums and shapes ---------------------------------------------------------------------------


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def write_checksums(folder: Path) -> None:
    """``folder/checksums.json``: {"sha256": {relative path: hex digest}} of every *.safetensors file
    (the critic's too) and the state file, read back from disk as written."""
    folder = Path(folder)
    files = sorted(folder.rglob("*.safetensors")) + [p for p in [folder / STATE_FILE] if p.is_file()]
    sums = {str(p.relative_to(folder)): _sha256(p) for p in files}
    (folder / CHECKSUM_FILE).write_text(json.dumps({"sha256": sums}, indent=1) + "\n")


def checksum_problem(directory: Path) -> str | None:
    """A file whose bytes differ from the checksum written at save time (None: all match, or a checkpoint
    from before checksums, which is verified by its structure alone)."""
    path = Path(directory) / CHECKSUM_FILE
    if not path.is_file():
        return None
    try:
        listed = json.loads(path.read_text())["sha256"]
        items = list(listed.items())
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError):
        return f"{CHECKSUM_FILE}: unreadable"
    for name, digest in items:
        f = Path(directory) / name
        if not f.is_file():
            return f"{name}: missing (listed in {CHECKSUM_FILE})"
        if _sha256(f) != digest:
            return f"{name}: SHA-256 differs from the one written at save time (bytes torn or corrupted)"
    return None


def header_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    return {k: tuple(v["shape"]) for k, v in header.items() if k != "__metadata__"}


def shape_problem(directory: Path, model) -> str | None:
    """How a checkpoint's policy weights fail to fit ``model`` (tensor names and shapes, read from the
    safetensors headers; nothing is loaded), or None. Another architecture or size fails here."""
    directory = Path(directory)
    adapter = directory / "adapter_model.safetensors"
    if adapter.is_file():
        from peft import get_peft_model_state_dict

        expected = {k: tuple(v.shape) for k, v in get_peft_model_state_dict(model).items()}
        files = [adapter]
    else:
        expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        files = sorted(directory.glob("model*.safetensors"))
    saved: dict[str, tuple[int, ...]] = {}
    for f in files:
        saved.update(header_shapes(f))
    common = [k for k in saved if k in expected]
    if not common:
        some = ", ".join(sorted(saved)[:3])
        return f"none of its {len(saved)} tensors ({some}, ...) is one of the model's: another architecture"
    for k in common:
        if saved[k] != expected[k]:
            return (
                f"tensor {k} has shape {list(saved[k])}, the model's is {list(expected[k])}: another "
                "architecture or size"
            )
    missing = sorted(k for k in set(expected) - set(saved) if not k.endswith("lm_head.weight"))
    if missing:
        return f"lacks {len(missing)} of the model's tensors ({', '.join(missing[:3])})"
    unexpected = sorted(set(saved) - set(expected))
    if unexpected:
        return f"holds {len(unexpected)} tensors the model has not ({', '.join(unexpected[:3])})"
    return None


def resumable_for_model(chosen: Path, model, *, auto: bool) -> Path:
    """``chosen`` when its weights fit ``model``. Otherwise, when the checkpoint was picked automatically
    (--resume), the newest older one that verifies and fits, with a warning for each skipped; a checkpoint
    named with --resume-from, or none that fits, is a ConfigError."""
    chosen = Path(chosen)
    problem = shape_problem(chosen, model)
    if problem is None:
        return chosen
    if not auto:
        raise ConfigError(f"--resume-from {chosen}: its weights do not fit the model: {problem}.")
    skipped = [(chosen, problem)]
    match = _STEP_DIR.match(chosen.name)
    for step, path in reversed(step_dirs(chosen.parent)):
        if match is None or step >= int(match.group(1)):
            continue
        problem = verify_checkpoint(path) or shape_problem(path, model)
        if problem is None:
            for bad, why in skipped:
                warning = f"grpokit: warning: {bad} does not fit the model ({why}); resuming from {path.name}"
                print(warning, file=sys.stderr)
            return path
        skipped.append((path, problem))
    listed = "; ".join(f"{p.name}: {why}" for p, why in skipped)
    raise ConfigError(f"--resume: no checkpoint under {chosen.parent} fits the model ({listed}).")
