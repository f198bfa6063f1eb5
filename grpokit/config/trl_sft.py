"""TRL's SFTConfig (and the TrainingArguments it extends) in grpokit's terms: ``from_trl_sft(values)``, the SFT
twin of grpokit.config.trl.from_trl.

    SFTTrainer(model="Qwen/Qwen2.5-0.5B", args=trl.SFTConfig(output_dir="out", max_length=512), train_dataset=ds)
    values, notes = from_trl_sft(trl.SFTConfig(...))       # or its to_dict(), or a flat mapping (a YAML file's)

Every SFTConfig field with a grpokit counterpart is mapped, with TRL 1.16's default for those left out (so the
run is TRL's run, not grpokit's defaults: learning rate 2e-5, AdamW beta2 0.999, the linear schedule, seed 42,
3 epochs, gradient checkpointing); the TrainingArguments fields that change nothing in what is trained are
accepted and listed in the notes; every other field set to anything but its default is refused by name, with the
reason. What the loss trains on follows TRL's two switches:

| completion_only_loss | assistant_only_loss | prompt/completion rows | messages rows | sft.loss_on |
|---|---|---|---|---|
| None (default) or True | False (default) | the completion | every token | ``trl`` |
| None or True | True | the completion | the assistant turns | ``auto`` |
| False | False | every token | every token | ``all`` |

Text rows train on every token under all three. (False with True has no grpokit counterpart: refused.)
The batch: TRL's optimizer step is per_device_train_batch_size x gradient_accumulation_steps x the processes'
examples; grpokit's ``sft.batch_size`` is the same count (WORLD_SIZE read from the environment, as torchrun
sets it), its micro-batches TRL's per-device size (``optim.micro_batch_size``). ``max_length`` cuts longer
examples on the right (``data.truncate``, TRL's ``truncation_mode="keep_start"``).
"""

from __future__ import annotations

import os
from typing import Any

from grpokit.config.trl import (
    ARGS_INERT,
    REFUSED_UNLESS_DEFAULT,
    SAME_AS_DEFAULT,
    SCRIPT_KEYS,
    cadence_values,
    inert_note,
    model_init_values,
    optimiser_values,
    report_targets,
)
from grpokit.config.trl_fields import _is_default, trl_mapping
from grpokit.core.errors import ConfigError

SFT_DEFAULTS: dict[str, Any] = {
    "learning_rate": 2e-5, "per_device_train_batch_size": 8, "gradient_accumulation_steps": 1,
    "num_train_epochs": 3.0, "max_steps": -1, "weight_decay": 0.0, "adam_beta1": 0.9, "adam_beta2": 0.999,
    "adam_epsilon": 1e-8, "max_grad_norm": 1.0, "lr_scheduler_type": "linear", "warmup_steps": 0, "seed": 42,
    "logging_steps": 10, "save_steps": 500, "save_total_limit": None, "eval_strategy": "no", "eval_steps": None,
    "save_strategy": "steps", "gradient_checkpointing": True, "bf16": None, "report_to": "none", "output_dir": "trainer_output",
    "max_length": 1024, "truncation_mode": "keep_start", "packing": False, "packing_strategy": "bfd",
    "padding_free": False, "completion_only_loss": None, "assistant_only_loss": False,
    "dataset_text_field": "text", "shuffle_dataset": False, "loss_type": "nll", "model_init_kwargs": None,
    "trust_remote_code": False,
}  # fmt: skip
"""TRL 1.16's SFTConfig defaults of the fields mapped (tests check them against trl.SFTConfig)."""

SFT_INERT = ARGS_INERT | {"dataset_num_proc", "eval_packing", "pad_to_multiple_of"}
"""Fields that change nothing in what is trained here (grpokit.config.trl.ARGS_INERT; dataset preparation workers;
padding is grpokit's own): accepted, ignored."""

SFT_REFUSED_UNLESS_DEFAULT: dict[str, tuple[Any, str]] = {
    "loss_type": ("nll", "the SFT loss is the token-mean negative log-likelihood (TRL's nll)"),
    "activation_offloading": (False, "activations stay where they are computed; use gradient_checkpointing"),
    "eos_token": (None, "the tokenizer's own EOS ends every example; set it on the tokenizer you pass"),
    "pad_token": (None, "padding is grpokit's own (never trained on); set it on the tokenizer you pass"),
    "chat_template_path": (None, "the tokenizer's chat template is used; set tokenizer.chat_template on the "
                                 "tokenizer you pass"),
    "dataset_kwargs": (None, "the rows are always tokenized by grpokit.data.sft (no skip_prepare_dataset)"),
    **{key: REFUSED_UNLESS_DEFAULT[key] for key in (
        "router_aux_loss_coef", "fp16", "gradient_checkpointing_kwargs", "data_seed", "lr_scheduler_kwargs", "optim",
        "torch_compile",
    )},
}  # fmt: skip
"""SFTConfig fields grpokit cannot honour (its own, and those GRPOConfig's conversion refuses too): refused by name,
with why, when set to anything but TRL's default."""

SFT_KEYS = (
    frozenset(SFT_DEFAULTS) | SFT_INERT | frozenset(SFT_REFUSED_UNLESS_DEFAULT) | frozenset(SCRIPT_KEYS)
    | {"warmup_ratio"}  # mapped when set (transformers 5 folds it into warmup_steps: no default of its own)
)


def loss_on(completion_only_loss: bool | None, assistant_only_loss: bool) -> str:
    """sft.loss_on for TRL's two switches (the module doc's table)."""
    if completion_only_loss is False and assistant_only_loss:
        raise ConfigError(
            "TRL completion_only_loss=False with assistant_only_loss=True (every token of prompt/completion rows, "
            "the assistant turns of messages) has no grpokit setting; set sft.loss_on in a grpokit config: auto "
            "(completions and assistant turns) or all"
        )
    if completion_only_loss is False:
        return "all"
    return "auto" if assistant_only_loss else "trl"


def is_sft_file(values: Any) -> bool:
    """Whether a flat TRL file is an SFTConfig's: it has fields only SFTConfig has (max_length, packing,
    dataset_text_field, ...) and none only GRPOConfig has (num_generations, beta, ...). A file of shared fields
    alone is read as a GRPOConfig, as ``grpokit config --from-trl`` always did."""
    from grpokit.config.trl import TRL_KEYS

    keys = set(values) if isinstance(values, dict) else set()
    return bool(keys & (SFT_KEYS - TRL_KEYS)) and not keys & (TRL_KEYS - SFT_KEYS)


def from_trl_sft(args: Any) -> tuple[dict[str, Any], list[str]]:
    """TRL SFTConfig fields -> (grpokit's nested SFT config values, notes for the user). ``args``: a flat mapping, a
    ``trl.SFTConfig`` or its ``to_dict()``. Raises ConfigError naming the first field grpokit cannot honour."""
    values, inert = trl_mapping(args, SFT_KEYS, SFT_DEFAULTS, trl_class="SFTConfig")
    for key, (default, why) in SFT_REFUSED_UNLESS_DEFAULT.items():
        value = values.get(key, default)  # _is_default: to_dict() writes an unset eos_token as "<EOS_TOKEN>"
        if not _is_default(value, default) and str(value) not in SAME_AS_DEFAULT.get(key, ()):
            raise ConfigError(f"TRL {key}={value!r} is not supported: {why}; remove it")
    v = {**SFT_DEFAULTS, **values}
    notes: list[str] = inert_note(inert)
    out: dict[str, dict[str, Any]] = {s: {} for s in ("model", "data", "sft", "optim", "eval", "train")}

    # the batch: TRL's optimizer step over every process, its micro-batches per device
    B, GA = int(v["per_device_train_batch_size"]), int(v["gradient_accumulation_steps"])
    world = int(os.environ.get("WORLD_SIZE", "1"))
    out["sft"]["batch_size"] = B * GA * world
    out["optim"]["micro_batch_size"] = B
    notes.append(
        f"sft.batch_size={B * GA * world}: per_device_train_batch_size {B} x gradient_accumulation_steps {GA} x "
        f"{world} process(es); micro-batches of {B} (optim.micro_batch_size)"
    )

    # what is trained on, and the examples' length
    out["sft"]["loss_on"] = loss_on(v["completion_only_loss"], bool(v["assistant_only_loss"]))
    if v["truncation_mode"] != "keep_start":
        raise ConfigError(
            f"TRL truncation_mode={v['truncation_mode']!r}: grpokit cuts a long example on the right (keep_start) "
            "or refuses it (data.truncate=false); use keep_start"
        )
    out["data"]["text_column"] = str(v["dataset_text_field"])
    if v["max_length"] is None:  # no limit: nothing is cut; the model's positions bound an example (named)
        out["data"].update(max_length=None, truncate=False)
        notes.append("max_length=None: data.max_length=null, nothing cut; an example past the model's positions is refused")
    else:
        out["data"].update(max_length=int(v["max_length"]), truncate=True)
        notes.append(
            f"data.max_length={v['max_length']} with data.truncate=true: longer examples are cut on the right"
        )
    packed = bool(v["packing"]) or bool(v["padding_free"])
    out["sft"]["packing"] = packed
    if v["packing"] and v["packing_strategy"] != "bfd":
        raise ConfigError(
            f"TRL packing_strategy={v['packing_strategy']!r} cuts examples into fixed-length rows (a different "
            "loss); grpokit packs whole examples padding-free, as TRL's bfd: use packing_strategy: bfd"
        )
    if packed:
        notes.append("packing: whole examples of a micro-batch in one row, attention kept inside each (TRL's bfd / "
                     "padding_free: the same gradient as unpacked)")  # fmt: skip
    notes.append(
        "shuffle_dataset: the rows are reshuffled each pass (data.shuffle), as TRL's data loader does"
    )

    # optimisation, the model, the run
    out["optim"].update(optimiser_values(v, notes))
    out["model"]["gradient_checkpointing"] = bool(v["gradient_checkpointing"])
    out["model"].update(model_init_values(v, notes))
    max_steps = int(v["max_steps"])
    if max_steps > 0:
        out["train"]["steps"] = max_steps
    else:
        out["train"]["num_train_epochs"] = float(v["num_train_epochs"])
        notes.append(f"max_steps unset: num_train_epochs={v['num_train_epochs']} passes over the rows")
    out["train"]["seed"] = int(v["seed"])
    out["train"]["output_dir"] = str(v["output_dir"])
    train, evaluation, cadence_notes = cadence_values(v)
    out["train"].update(train)
    out["eval"].update(evaluation)
    notes += cadence_notes
    out["train"]["report_to"] = report_targets(v["report_to"])
    notes.append("logging_steps: grpokit logs every step")
    for key, dotted in SCRIPT_KEYS.items():
        if v.get(key) is not None:
            section, name = dotted.split(".")
            out[section][name] = v[key]
    return {key: section for key, section in out.items() if section}, notes
