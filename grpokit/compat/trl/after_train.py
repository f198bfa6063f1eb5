"""What a TRL script does with the trainer after ``train()`` (issue 52): open-r1's grpo.py and TRL's own
trl/scripts/grpo.py end

    train_result = trainer.train(resume_from_checkpoint=checkpoint)
    metrics = train_result.metrics
    trainer.log_metrics("train", metrics); trainer.save_metrics("train", metrics); trainer.save_state()
    trainer.save_model(training_args.output_dir)
    if trainer.accelerator.is_main_process:
        trainer.create_model_card(dataset_name=..., tags=[...])

Here those calls do what transformers' Trainer does, from grpokit's own records: ``train()``'s summary is also
read as a TrainOutput (``TrainResult``), ``log_metrics`` prints and ``save_metrics`` writes
OUTPUT/{split}_results.json and all_results.json, ``save_state`` writes OUTPUT/trainer_state.json (a real
transformers TrainerState), ``create_model_card`` OUTPUT/README.md. Written on the main process only, as there.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from grpokit.core.errors import ConfigError


class TrainResult(dict):
    """``train()``'s summary (the dict it always was, also OUTPUT/summary.json), read as transformers'
    TrainOutput too: ``global_step``, ``training_loss`` (the mean of the steps' losses) and ``metrics`` (TRL's
    train_runtime, train_steps_per_second, train_loss and epoch, beside the summary's own numbers)."""

    def __init__(self, summary: dict[str, Any], log_history: list[dict[str, float]], epoch: float):
        super().__init__(summary)
        losses = [m["loss"] for m in log_history if isinstance(m.get("loss"), (int, float))]
        self.training_loss = sum(losses) / len(losses) if losses else math.nan
        self.global_step = int(summary.get("steps", 0))
        seconds = float(summary.get("train_seconds") or 0.0)
        numbers = {k: v for k, v in summary.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        self.metrics = {
            **numbers,
            "train_runtime": seconds,
            "train_steps_per_second": self.global_step / seconds if seconds > 0 else 0.0,
            "train_loss": self.training_loss,
            "epoch": epoch,
        }


def epoch_of(trainer: Any, steps: int | None = None) -> float:
    """Passes over the training prompts in ``steps`` steps (default: those taken; TRL's state.epoch):
    steps x prompts per step / prompts."""
    prompts = max(len(getattr(trainer, "train_rows", ()) or ()), 1)
    rollout = getattr(trainer.cfg, "rollout", None)  # an SFT run's step takes sft.batch_size rows
    per_step = rollout.prompts_per_step if rollout is not None else trainer.cfg.sft.batch_size
    return (trainer.step if steps is None else steps) * per_step / prompts


def trainer_state(trainer: Any, state: Any = None) -> Any:
    """A transformers TrainerState (``state``, updated, or a new one) holding the run as it stands: global_step,
    max_steps, epoch, num_train_epochs, log_history (every step's metrics), logging_steps."""
    from transformers import TrainerState

    s = TrainerState() if state is None else state
    s.global_step, s.max_steps = trainer.step, trainer.cfg.train.steps
    s.epoch, s.num_train_epochs = epoch_of(trainer), epoch_of(trainer, trainer.cfg.train.steps)
    s.log_history = list(getattr(trainer, "log_history", []))
    s.logging_steps = 1
    return s


def save_hf_model(trainer: Any, output_dir: str | Path | None = None) -> Path | None:
    """TRL's (transformers') ``trainer.save_model(output_dir)``, for GRPOTrainer and SFTTrainer: the model as it is now
    and its tokenizer, a Hugging Face folder any HF tool loads (safetensors; a LoRA run: its adapter, as PEFT saves
    it), written into ``output_dir`` (default: train.output_dir) beside what is there. Not a checkpoint:
    ``trainer.save()`` writes one to resume from. Under torchrun every rank calls it (the weights are gathered) and
    rank 0 writes. Returns the folder (None on the other ranks)."""
    from grpokit.model.checkpoint import save_model_folder

    folder = Path(output_dir if output_dir is not None else trainer.cfg.train.output_dir)
    model = trainer.learner.model
    weights = trainer.dist.full_state(model)  # every rank gathers; None in one process
    written = save_model_folder(folder, model, trainer.tokenizer, weights) if trainer.dist.is_main else None
    trainer.dist.barrier()
    return written


def refuse_push_to_hub(trainer: Any) -> None:
    """TRL's ``trainer.push_to_hub(...)``: refused in one line with what to do, never a silent no-op."""
    raise ConfigError(
        "trainer.push_to_hub(): grpokit does not upload to the Hugging Face Hub. trainer.save_model(DIR) writes "
        f"the trained model as a Hugging Face folder (default {trainer.cfg.train.output_dir}); upload it with "
        "`hf upload REPO_ID DIR` (huggingface_hub's CLI)"
    )


def check_resume_request(trainer: Any, resume_from_checkpoint: Any) -> None:
    """``train(resume_from_checkpoint=...)``: grpokit resumes when the trainer is built (its parts load the
    checkpoint's state then), so here the request is only checked against what was resumed: None or False, or
    the checkpoint the trainer was built from (True: any), goes on; anything else is a ConfigError saying how."""
    if resume_from_checkpoint is None or resume_from_checkpoint is False:
        return
    resumed = trainer.run.resume_from
    if resumed is not None and (
        resume_from_checkpoint is True or Path(resume_from_checkpoint).resolve() == Path(resumed).resolve()
    ):
        return
    built = f"it was built from checkpoint {resumed}" if resumed is not None else "it was built without resume"
    raise ConfigError(
        f"train(resume_from_checkpoint={resume_from_checkpoint!r}): grpokit resumes when the trainer is built, and "
        f"{built}. Build it with GRPOTrainer(..., resume={resume_from_checkpoint!r}) (True: the newest checkpoint in "
        "train.output_dir) and call train() as it is"
    )


def with_eval_prefix(metrics: dict[str, Any], prefix: str = "eval") -> dict[str, Any]:
    """``metrics`` under transformers' evaluation names: each key as ``{prefix}_{key}`` (``loss`` ->
    ``eval_loss``), as ``Trainer.evaluate`` returns them and hands them to ``on_evaluate``. An empty prefix: as
    they are."""
    return {f"{prefix}_{key}" if prefix else key: value for key, value in metrics.items()}


def trl_evaluation(
    trainer: Any, held_out: Any, *, rows: int, prefix: str, seconds: float
) -> dict[str, Any]:
    """What ``trainer.evaluate()`` returns to a TRL script: grpokit's held-out metrics ``held_out`` under their own
    names (what grpokit's docs and ``eval.jsonl`` use), and each again under transformers' name (``eval_loss``,
    ``eval_accuracy``), with ``{prefix}_runtime`` (``seconds``), ``{prefix}_samples_per_second`` (``rows`` /
    seconds) and ``epoch``. Not ``{prefix}_steps_per_second``: grpokit's evaluation has no evaluation batches."""
    timing = {"runtime": seconds, "samples_per_second": rows / seconds if seconds > 0 else 0.0}
    return {**held_out, **with_eval_prefix({**held_out, **timing}, prefix), "epoch": epoch_of(trainer)}


def format_metrics(metrics: dict[str, Any]) -> dict[str, str]:
    """Each metric as transformers' log_metrics prints it: seconds as h:mm:ss.ff for *_runtime, floats to 4
    decimals, the rest as they are."""
    out = {}
    for key, value in metrics.items():
        if key.endswith("_runtime") and isinstance(value, (int, float)):
            whole = int(value)
            out[key] = f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}.{int(value % 1 * 100):02d}"
        elif isinstance(value, float):
            out[key] = f"{value:.4f}" if math.isfinite(value) and abs(value) < 1e6 else repr(value)
        else:
            out[key] = str(value)
    return out


def log_metrics(trainer: Any, split: str, metrics: dict[str, Any]) -> None:
    """transformers' ``log_metrics``: a block '***** {split} metrics *****' with one aligned line per metric, on
    the main process."""
    if not trainer.dist.is_main:
        return
    shown = format_metrics(metrics)
    key_width = max((len(k) for k in shown), default=0)
    value_width = max((len(v) for v in shown.values()), default=0)
    print(f"***** {split} metrics *****")
    for key in sorted(shown):
        print(f"  {key: <{key_width}} = {shown[key]:>{value_width}}")


def save_metrics(trainer: Any, split: str, metrics: dict[str, Any], combined: bool = True) -> Path | None:
    """transformers' ``save_metrics``: OUTPUT/{split}_results.json, and (``combined``) the same keys merged into
    OUTPUT/all_results.json; on the main process. The file written, or None on the other ranks."""
    if not trainer.dist.is_main:
        return None
    out = Path(trainer.cfg.train.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{split}_results.json"
    path.write_text(json.dumps(metrics, indent=4, sort_keys=True, default=str))
    if combined:
        merged = out / "all_results.json"
        everything = json.loads(merged.read_text()) if merged.is_file() else {}
        everything.update(metrics)
        merged.write_text(json.dumps(everything, indent=4, sort_keys=True, default=str))
    return path


def save_state(trainer: Any) -> Path | None:
    """transformers' ``save_state``: OUTPUT/trainer_state.json, the TrainerState of ``trainer_state`` (every step's
    metrics in log_history); on the main process. The file, or None on the other ranks."""
    if not trainer.dist.is_main:
        return None
    path = Path(trainer.cfg.train.output_dir) / "trainer_state.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    trainer_state(trainer).save_to_json(str(path))
    return path


def create_model_card(
    trainer: Any, model_name: str | None = None, dataset_name: str | None = None, tags: Any = None
) -> Path | None:
    """TRL's ``create_model_card``: OUTPUT/README.md, a Hugging Face model card (YAML metadata: base_model,
    library_name, datasets, tags; then how the model was trained: grpokit's algorithm and its settings, the steps
    taken, the held-out accuracy when the run measured it); on the main process. The file, or None."""
    if not trainer.dist.is_main:
        return None
    cfg = trainer.cfg
    out = Path(cfg.train.output_dir)
    base = cfg.model.name_or_path
    tag_list = ["grpokit", "grpo", *([tags] if isinstance(tags, str) else list(tags or []))]
    meta = {"base_model": base, "library_name": "transformers", "tags": list(dict.fromkeys(tag_list))}
    if dataset_name:
        meta["datasets"] = [dataset_name]
    import yaml

    algo = trainer.algo.flat()
    summary_file = out / "summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.is_file() else {}
    lines = [
        "---",
        yaml.safe_dump(meta, sort_keys=False).strip(),
        "---",
        "",
        f"# {model_name or out.resolve().name}",
        "",
        f"This model is a fine-tuned version of `{base}`"
        + (f" on [{dataset_name}](https://huggingface.co/datasets/{dataset_name})" if dataset_name else "")
        + f", trained with GRPO by grpokit ({trainer.step} steps).",
        "",
        "## Training",
        "",
        f"- algorithm: `{cfg.algo.preset}` (advantage `{algo['advantage']}`, loss aggregation `{algo['agg']}`, "
        f"KL coefficient {algo['beta']:g})",
        f"- rollouts: {cfg.rollout.prompts_per_step} prompts x {cfg.rollout.group_size} completions a step, up to "
        f"{cfg.rollout.max_new_tokens} new tokens, temperature {cfg.rollout.temperature:g}",
        f"- rewards: {', '.join(f'`{name}` x {w:g}' for name, w in trainer.reward_weights.items())}",
        f"- optimizer: AdamW, learning rate {cfg.optim.lr:g} ({cfg.optim.schedule})",
    ]
    for when in ("before", "after"):
        accuracy = summary.get(f"eval_accuracy_{when}")  # (grpokit.run.loop.eval_summary)
        if isinstance(accuracy, (int, float)):
            lines.append(f"- held-out accuracy {when} training: {accuracy:.1%}")
    lines += ["", "The run's own record, beside this card: `config.yaml` (reloadable: `grpokit train config.yaml`),",
              "`metrics.jsonl`, `summary.json`.", ""]  # fmt: skip
    path = out / "README.md"
    out.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))
    return path
