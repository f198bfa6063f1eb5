"""Checks made before anything heavy loads: the output folder, the model's positions, a resume's settings;
and, once the model is loaded and before the run writes anything, the free space its checkpoints need.

Each failure is a ``ConfigError`` whose one line names the key, the value, what is allowed and an
example. Config values themselves are range-checked from their declarations (``grpokit.config.declare``).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from grpokit.config.schema import Config, ConfigError
from grpokit.core.errors import TrainingError
from grpokit.core.files import free_bytes, size_text
from grpokit.run.log import holds_run

# Settings a resumed run may change without --allow-changed-config: how long it runs, what it writes
# and how, where it runs, and how the same computation is split (tested to give the same gradient).
# Everything else (group size, lr, preset, rewards, data, model, ...) changes the run's meaning.
FREE_TO_CHANGE = {
    "train.steps",
    "train.output_dir",
    "train.save_every",
    "train.save_each_epoch",
    "train.keep_checkpoints",
    "train.samples_every",
    "train.tensorboard",
    "train.report_to",
    "train.reward_timeout_s",
    "train.stop_after_flat_steps",
    "eval.every",
    "eval.each_epoch",
    "eval.enabled",
    "eval.num_samples",
    "eval.temperature",
    "eval.max_new_tokens",
    "data.eval",
    "data.eval_limit",
    "data.eval_split",
    "model.device",
    "model.attn_implementation",
    "model.gradient_checkpointing",
    "model.compile",
    "optim.micro_batch_size",
    "optim.logprob_chunk_size",
    "rollout.engine",
    "rollout.kv_cache",
    "rollout.cuda_graphs",
    "rollout.compile",
    "rollout.sampler_timeout_s",
    "rollout.vllm.server_timeout_s",
    "rollout.vllm.sync_timeout_s",
}

# config.json keys that hold a model's number of positions, most common first
_POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")


def check_tracker_login(report_to: str | list[str]) -> None:
    """wandb in train.report_to needs a login the run can use without asking: WANDB_API_KEY, an
    api.wandb.ai entry in ~/.netrc (``wandb login``), or WANDB_MODE=offline / disabled."""
    names = [report_to] if isinstance(report_to, str) else list(report_to)
    if "wandb" not in names:
        return
    mode = os.environ.get("WANDB_MODE", "").lower()
    if os.environ.get("WANDB_API_KEY") or mode in ("offline", "disabled", "dryrun"):
        return
    netrc = Path(os.environ.get("NETRC") or Path.home() / ".netrc")
    try:
        if "api.wandb.ai" in netrc.read_text(errors="replace"):
            return
    except OSError:
        pass
    raise ConfigError(
        "train.report_to includes wandb but no W&B login was found (WANDB_API_KEY, or ~/.netrc from `wandb "
        "login`): log in, set WANDB_MODE=offline to log locally, or drop wandb from train.report_to."
    )


def check_output_dir(out: Path, *, resume: bool, overwrite: bool) -> None:
    """``train.output_dir`` can take this run: a folder (or a path one can be made at), and, unless
    resuming or overwriting, not one that holds another run. Changes nothing on disk."""
    key = f"train.output_dir={str(out)!r}"
    if resume and overwrite:
        raise ConfigError(
            "--resume continues the run in train.output_dir and --overwrite replaces it: give one."
        )
    if out.is_symlink() and not out.exists():
        raise ConfigError(
            f"{key} is a symbolic link to {os.readlink(out)}, which does not exist; make the folder it points "
            "to, remove the link, or choose another path."
        )
    if out.exists() and not out.is_dir():
        raise ConfigError(
            f"{key} is a file, not a folder; choose another path (e.g. train.output_dir=runs/my_run)."
        )
    parent = out
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(f"{key}: {parent} is a file, so the folder cannot be made; choose another path.")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(
            f"{key}: {parent} is not writable; choose another path (e.g. train.output_dir=runs/my_run)."
        )
    found = holds_run(out)
    if found and not resume and not overwrite:
        raise ConfigError(
            f"{key} already holds a run ({', '.join(found)}): continue it with --resume, replace it with "
            f"--overwrite, or choose another folder (e.g. train.output_dir={out}-2)."
        )


def checkpoint_bytes(model, bytes_per_param: int) -> int:
    """A checkpoint's rough size in bytes: per trainable parameter its weight and the optimizer's states,
    ``bytes_per_param`` (grpokit.model.precision: weights + gradients + states) less the gradient, which is
    not saved (fp32: 16 - 4 = 12; bf16_kahan: 10 - 2 = 8). Frozen weights are not counted: with LoRA the
    checkpoint holds the adapter only. Tokenizer files, RNG and data positions add a little more."""
    return sum(p.numel() * (bytes_per_param - p.element_size()) for p in model.parameters() if p.requires_grad)


def checkpoints_at_peak(steps_left: int, save_every: int, keep: int, existing: int) -> int:
    """How many new checkpoints the disk holds at once at worst: one every ``save_every`` steps of the
    ``steps_left`` and one at the end (the same one when the last step is a multiple of ``save_every``); with
    ``keep`` > 0 (train.keep_checkpoints) a new one is written before the oldest are pruned, so keep + 1 at
    once, of which ``existing`` are on the disk already."""
    saves = max(1, -(-steps_left // save_every)) if save_every else 1  # the last step's save is the final one
    if keep <= 0:
        return saves
    return max(1, min(saves, keep + 1 - existing))


def check_free_space(out: Path, one: int, count: int) -> str | None:
    """Refuse a run whose first checkpoint cannot fit on the disk of ``out`` (``one`` bytes, as from
    checkpoint_bytes) with a TrainingError naming the folder, the free space and the need: it would fail
    there after its first steps' work. Returns a warning when ``count`` of them (checkpoints_at_peak) do
    not fit, None when they do or the free space cannot be read."""
    free = free_bytes(out)
    if free is None or free >= one * count:
        return None
    key = f"train.output_dir={str(out)!r}"
    if free < one:
        raise TrainingError(
            f"disk full: {key} has {size_text(free)} free on its disk and one checkpoint of this model needs "
            f"about {size_text(one)} (weights and optimizer state), so the run would fail at its first "
            "checkpoint. Free some space there or set train.output_dir to a folder on another disk."
        )
    return (
        f"{key} has {size_text(free)} free on its disk; {count} checkpoints of about {size_text(one)} each "
        f"({size_text(one * count)}) may be on it at once (train.save_every, train.keep_checkpoints): a later "
        "checkpoint may not fit. Free some space or lower train.keep_checkpoints."
    )


def model_positions(model_config: dict[str, Any] | None) -> tuple[str, int] | None:
    """(key, value) of the model's position limit in its config.json (or its text_config), if it has one."""
    if not model_config:
        return None
    for section in (model_config, model_config.get("text_config") or {}):
        for key in _POSITION_KEYS:
            value = section.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return key, value
    return None


def check_positions(cfg: Config, model_config: dict[str, Any] | None, source: str) -> None:
    """A completion must fit in the model's positions with at least one prompt token before it."""
    found = model_positions(model_config)
    if found is None:
        return
    name, limit = found
    r = cfg.rollout
    episode = (r.max_episode_tokens or r.max_turns * r.max_new_tokens) if (r.tools or r.environment) else None
    for key, value in (
        ("rollout.max_new_tokens", cfg.rollout.max_new_tokens),
        ("eval.max_new_tokens", cfg.eval.max_new_tokens),
        ("rollout.max_episode_tokens", episode),  # multi-turn: every turn and tool answer after the prompt
    ):
        if value is not None and value >= limit:
            raise ConfigError(
                f"{key}={value} is beyond the model's {limit} positions ({name} in {source}'s config.json), which "
                f"prompt and completion share: it must be < {limit} (e.g. {key}={min(256, limit // 2)})."
            )


def check_context(
    cfg: Config,
    prompt_lengths: list[int],
    eval_lengths: list[int],
    model_config: dict[str, Any] | None,
    source: str,
) -> None:
    """Every prompt with its longest completion fits the model's positions:
    prompt tokens + max_new_tokens <= positions, for the training rows (rollout.max_new_tokens) and the
    held-out rows (eval.max_new_tokens); the message names the longest row and what to change."""
    found = model_positions(model_config)
    if found is None:
        return
    name, limit = found
    eval_new = cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens
    for what, lengths, key, new in (
        (f"data.train={cfg.data.train!r}", prompt_lengths, "rollout.max_new_tokens", cfg.rollout.max_new_tokens),
        (f"data.eval={cfg.data.eval!r}", eval_lengths, "eval.max_new_tokens", eval_new),
    ):
        if not lengths:
            continue
        row = max(range(len(lengths)), key=lengths.__getitem__)
        if lengths[row] + new > limit:
            raise ConfigError(
                f"{what}: row index {row} has {lengths[row]} prompt tokens, and with {key}={new} that needs "
                f"{lengths[row] + new} positions, beyond the model's {limit} positions ({name} in {source}'s "
                "config.json). "
                f"Shorten or drop the row (data.max_prompt_tokens={max(1, limit - new)} refuses such rows by "
                f"name), or lower {key} to {max(1, limit - lengths[row])}."
            )


def config_changes(old: dict[str, Any] | None, new: Config) -> list[str]:
    """Settings that differ between the checkpoint's run (``old``, as saved) and ``new``, as
    "key: old -> new", leaving out FREE_TO_CHANGE and keys the old run did not have yet (a setting added since,
    nested sections such as rollout.vllm.* included: a checkpoint of an older grpokit resumes without a flag)."""
    if not old:
        return []
    sections = _sections(new)
    before, after = _flatten(old, sections), _flatten(dataclasses.asdict(new), sections)
    return [
        f"{key}: {before[key]!r} -> {value!r}"
        for key, value in after.items()
        if key in before and key not in FREE_TO_CHANGE and before[key] != value
    ]


def _sections(tree: Any, prefix: str = "") -> set[str]:
    """The dotted names of the config's sections, nested ones too (rollout, rollout.vllm, ...): the dataclasses in
    it, whose settings compare one by one; other mappings (a reward's kwargs) compare whole."""
    out: set[str] = set()
    for field in dataclasses.fields(tree):
        value = getattr(tree, field.name)
        if dataclasses.is_dataclass(value):
            out |= {f"{prefix}{field.name}", *_sections(value, f"{prefix}{field.name}.")}
    return out


def _flatten(values: dict[str, Any], sections: set[str], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in values.items():
        full = f"{prefix}{key}"
        if isinstance(value, dict) and full in sections:
            flat.update(_flatten(value, sections, f"{full}."))
        else:
            flat[full] = value
    return flat
