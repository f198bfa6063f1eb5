"""TRL's SFTTrainer call, taken as it is written:

    SFTTrainer(model="Qwen/Qwen2.5-0.5B", train_dataset=load_dataset("trl-lib/Capybara", split="train"))
    SFTTrainer(model=m, args=SFTConfig(output_dir="out", max_length=512, packing=True), train_dataset=ds,
               eval_dataset=ds_eval, processing_class=tok, peft_config=LoraConfig(...), formatting_func=fmt)

What each argument means here:
  - ``args``: a ``trl.SFTConfig`` or its ``to_dict()`` (or a flat mapping of its fields) is converted by
    grpokit.config.trl_sft.from_trl_sft (its notes printed to stderr), so the run is TRL's; a grpokit
    ``SFTConfig`` (or a mapping of grpokit's sections) is grpokit's own. No ``args`` and no cfg: TRL's SFTConfig
    defaults (``from_trl_sft({})``), as TRL's trainer takes them.
  - ``model`` (or the first positional argument), ``processing_class``, ``train_dataset`` / ``eval_dataset``,
    ``peft_config``, ``callbacks``: as GRPOTrainer takes them (grpokit.compat.trl.call).
  - ``formatting_func``: TRL's: ``formatting_func(row) -> str`` makes each row a text row (every token trained).
  - the rest of TRL's SFTTrainer (a data collator, a loss or metrics function, optimizers) is refused by name,
    with the fix.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from grpokit.compat.trl.call import _say, refuse_unexpected
from grpokit.core.errors import ConfigError

UNSUPPORTED = {
    "data_collator": "examples are tokenized, padded or packed by grpokit.data.sft (sft.packing, sft.loss_on)",
    "compute_loss_func": "the SFT loss is the token-mean negative log-likelihood of the trained tokens",
    "compute_metrics": "held-out evaluation is the loss, and a verifier's accuracy with rewards= (reward_functions)",
    "preprocess_logits_for_metrics": "held-out evaluation is the loss, and a verifier's accuracy with rewards=",
    "optimizers": "the optimizer is AdamW with the optim.* settings (args.learning_rate, args.adam_beta2, ...)",
    "optimizer_cls_and_kwargs": "the optimizer is AdamW with the optim.* settings",
    "model_init": "give the model (a loaded one with processing_class=, a folder or a hub id)",
    "reward_funcs": "an SFT run has no rewards while training; reward_functions= scores the held-out prompts",
}
"""Keywords of TRL's SFTTrainer (and near misses) grpokit refuses unless None, with what to do instead."""


KEYWORDS = (
    "cfg", "args", "model", "tokenizer", "processing_class", "train_rows", "train_dataset", "eval_rows", "eval_dataset",
    "reward_functions", "callbacks", "peft_config", "formatting_func", "resume", "overwrite", "allow_changed_config",
)  # fmt: skip
"""SFTTrainer's keywords a user passes, for near-miss hints."""


def refuse_unsupported(given: Mapping[str, Any]) -> None:
    """A ConfigError naming the first keyword SFTTrainer does not take (grpokit.compat.trl.call.refuse_unexpected with
    SFTTrainer's tables); TRL's keywords of UNSUPPORTED given as None (their default) pass."""
    refuse_unexpected(
        {name: value for name, value in given.items() if not (name in UNSUPPORTED and value is None)},
        "SFTTrainer", UNSUPPORTED, KEYWORDS,
    )  # fmt: skip


def sft_config_from_args(cfg: Any, args: Any) -> tuple[Any, None]:
    """(the run's SFTConfig, None) from SFTTrainer's ``cfg`` and ``args`` (module doc)."""
    from grpokit.config.sft import SFTConfig, looks_like_trl_sft, sft_config_from_dict
    from grpokit.config.trl_sft import from_trl_sft

    if cfg is not None and args is not None:
        raise ConfigError(
            "SFTTrainer got a config twice (the first argument and args=): give one, a grpokit SFTConfig or TRL's "
            "SFTConfig"
        )
    given = args if args is not None else cfg
    if isinstance(given, SFTConfig):
        return given, None
    if given is None:  # TRL's call without args: SFTConfig's defaults
        values, notes = from_trl_sft({})
        _say(notes, "no args: TRL's SFTConfig defaults")
        return sft_config_from_dict(values), None
    trl_object = type(given).__name__ == "SFTConfig" or callable(getattr(given, "to_dict", None))
    if isinstance(given, Mapping) and not trl_object and not looks_like_trl_sft(given) and given:
        return sft_config_from_dict(dict(given)), None  # grpokit's own sections as a mapping
    if not trl_object and not isinstance(given, Mapping):
        rl = " (a grpokit.config.schema.Config goes to GRPOTrainer)" if type(given).__name__ == "Config" else ""
        raise ConfigError(
            f"SFTTrainer's config (args= or the first argument) must be a grpokit SFTConfig (load_sft_config builds "
            f"one) or TRL's SFTConfig (or its to_dict()), got {type(given).__name__}{rl}"
        )
    if type(given).__name__ == "GRPOConfig":
        raise ConfigError(
            "SFTTrainer got TRL's GRPOConfig; give a trl.SFTConfig (a GRPOConfig goes to GRPOTrainer)"
        )
    values, notes = from_trl_sft(given)
    _say(notes, "TRL's SFTConfig converted (grpokit.config.trl_sft)")
    return sft_config_from_dict(values), None


def formatted(
    rows: list[dict] | None, formatting_func: Callable[[dict], Any] | None, name: str
) -> list[dict] | None:
    """TRL's formatting_func: each row -> {"text": formatting_func(row)} (a text row); None stays None."""
    if rows is None or formatting_func is None:
        return rows
    out = []
    for index, row in enumerate(rows):
        text = formatting_func(row)
        if isinstance(text, list) and len(text) == 1:  # TRL's older batched form returned a list per example
            text = text[0]
        if not isinstance(text, str) or not text:
            raise ConfigError(
                f"{name}, row index {index}: formatting_func returned {type(text).__name__} {text!r:.60}; it must "
                "return the example's text (a non-empty string)"
            )
        out.append({"text": text})
    return out
