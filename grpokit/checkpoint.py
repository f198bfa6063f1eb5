"""Checkpoints: a standard Hugging Face model directory plus the trainer's own state.

    OUTPUT/checkpoints/step_000020/
        config.json, model.safetensors, tokenizer files   <- from_pretrained loads this
        (adapter_config.json, adapter_model.safetensors   <- instead, when training LoRA)
        trainer_state.pt   optimizer, scheduler, data position, step, RNG states

Each checkpoint is written to a temporary sibling directory and renamed into place, so a
crash mid-write never leaves a half checkpoint under the final name.
"""

from __future__ import annotations

import random
import re
import shutil
from pathlib import Path
from typing import Any

import torch

STATE_FILE = "trainer_state.pt"
_STEP_DIR = re.compile(r"^step_(\d+)$")


class CheckpointError(RuntimeError):
    pass


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


def save_checkpoint(directory: Path, model, tokenizer, trainer_state: dict[str, Any]) -> Path:
    """Write model + tokenizer + trainer state atomically to ``directory``. Refuses non-finite weights."""
    for name, param in model.named_parameters():
        if param.requires_grad and not torch.isfinite(param).all():
            raise CheckpointError(f"refusing to save: parameter {name} holds NaN/inf")
    directory = Path(directory)
    tmp = directory.with_name(directory.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp)
    torch.save({**trainer_state, "rng": rng_state()}, tmp / STATE_FILE)
    if directory.exists():
        shutil.rmtree(directory)
    tmp.rename(directory)
    return directory


def list_checkpoints(root: Path) -> list[Path]:
    """Complete step checkpoints under ``root`` (oldest first); temporary ones are ignored."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found) if (p / STATE_FILE).is_file()]


def prune_checkpoints(root: Path, keep: int) -> None:
    for old in list_checkpoints(root)[:-keep] if keep > 0 else []:
        shutil.rmtree(old)


def load_trainer_state(directory: Path) -> dict[str, Any]:
    path = Path(directory) / STATE_FILE
    if not path.is_file():
        raise CheckpointError(f"{directory} has no {STATE_FILE}: not a grpokit checkpoint")
    return torch.load(path, map_location="cpu", weights_only=False)


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
