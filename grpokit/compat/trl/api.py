"""TRL's habits at GRPOTrainer's door (issue 30): the argument forms a TRL script uses, turned into
grpokit's, or refused in one line that says what to pass instead.

    GRPOTrainer(cfg, model="Qwen/Qwen2.5-0.5B-Instruct")        # a path or hub id: cfg.model.name_or_path
    GRPOTrainer(cfg, model=m, processing_class=tok)             # TRL's name for the tokenizer
    GRPOTrainer(cfg, reward_funcs=[accuracy_reward, "format_strict"])   # bare functions, names, tuples
    GRPOTrainer(cfg, peft_config=peft.LoraConfig(r=8, lora_alpha=16, target_modules=[...]))
    GRPOTrainer(cfg, callbacks=[MyTrainerCallback()])           # transformers.TrainerCallback: its events

A transformers.TrainerCallback gets on_train_begin, on_step_end, on_log (the step's metrics), on_evaluate,
on_save and on_train_end with TrainingArguments-like `args` (output_dir, max_steps, learning_rate, seed,
...), a real transformers TrainerState (global_step, max_steps, epoch, num_train_epochs, log_history)
and TrainerControl; `control.should_training_stop = True` ends the run after that step as a finished run
(final evaluation, checkpoint, summary with `stopped_early`). Plain functions `fn(step, metrics,
trainer)` stay as they were; they can end the run the same way with `trainer.stop("why")`.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple

from grpokit.core.errors import ConfigError

EVENTS = ("on_train_begin", "on_evaluate", "on_save", "on_train_end")
"""Events the trainer fires on callbacks that have them, beside the per-step call."""


def fire(callbacks: Sequence[Any], event: str, trainer: Any, *args: Any) -> None:
    """Call ``callback.<event>(trainer, *args)`` on each callback that has it."""
    for callback in callbacks:
        hook = getattr(callback, event, None)
        if callable(hook):
            hook(trainer, *args)


class ProcessView:
    """What a TRL script reads on ``trainer.accelerator`` (TRL's own scripts print with ``trainer.accelerator.print``
    after training and test ``is_main_process`` before writing), answered from grpokit's process group
    (grpokit.train.distributed): grpokit does not run on accelerate, so these few members are all there is."""

    def __init__(self, dist: Any, device: Any):
        self._dist = dist
        self.device = device
        self.process_index = dist.rank
        self.num_processes = dist.world
        self.local_process_index = int(os.environ.get("LOCAL_RANK", "0")) if dist.world > 1 else 0
        self.is_main_process = dist.is_main
        self.is_local_main_process = self.local_process_index == 0

    def print(self, *args: Any, **kwargs: Any) -> None:
        """print(), on each machine's first process only (accelerate's)."""
        if self.is_local_main_process:
            print(*args, **kwargs)

    def wait_for_everyone(self) -> None:
        """Every rank waits here for the others (torchrun; one process: returns)."""
        self._dist.barrier()

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(
            f"trainer.accelerator.{name}: grpokit does not run on accelerate; trainer.accelerator has only "
            "print, wait_for_everyone, is_main_process, is_local_main_process, process_index, "
            "local_process_index, num_processes and device (grpokit.compat.trl.api.ProcessView)"
        )


class TrainerArguments(NamedTuple):
    """GRPOTrainer's arguments in grpokit's forms."""

    cfg: Any
    model: Any
    tokenizer: Any
    reward_functions: list[tuple[str, Callable, float]] | None
    callbacks: list[Any]
    train_rows: list[dict] | None
    eval_rows: list[dict] | None


def trl_arguments(
    cfg: Any,
    *,
    args: Any = None,
    model: Any = None,
    tokenizer: Any = None,
    processing_class: Any = None,
    reward_functions: Any = None,
    reward_funcs: Any = None,
    callbacks: Sequence[Any] = (),
    peft_config: Any = None,
    train_rows: Any = None,
    eval_rows: Any = None,
    train_dataset: Any = None,
    eval_dataset: Any = None,
    tools: Any = None,
    environment_factory: Any = None,
    unexpected: dict[str, Any] | None = None,
    config_from: Callable[[Any, Any], tuple[Any, list[float] | None]] | None = None,
    trainer: str = "GRPOTrainer",
) -> TrainerArguments:
    """GRPOTrainer's arguments, given grpokit's way or TRL's (grpokit.compat.trl.call), in grpokit's forms; cfg is
    copied when changed. Arguments of the wrong kind, a keyword given under both names, or one GRPOTrainer does not
    take are a ConfigError naming it. ``config_from(cfg, args)``: (the config, reward weights) from the config
    arguments (default: GRPOTrainer's, grpokit.compat.trl.call.config_from_args); ``trainer``: the name errors use
    (SFTTrainer's TRL call comes through here too: grpokit.compat.trl.sft_call)."""
    from grpokit.compat.trl.call import (
        config_from_args,
        environment_spec,
        refuse_unexpected,
        rows_of,
        tool_specs,
        weighted,
    )

    refuse_unexpected(unexpected or {})
    if model is None and (isinstance(cfg, (str, os.PathLike)) or _is_module(cfg)):
        cfg, model = None, cfg  # TRL's first argument is the model
    tokenizer = _one_of("tokenizer", tokenizer, "processing_class", processing_class, trainer)
    reward_functions = _one_of("reward_functions", reward_functions, "reward_funcs", reward_funcs, trainer)
    train_rows = _one_of("train_rows", train_rows, "train_dataset", rows_of(train_dataset, "train_dataset"), trainer)
    eval_rows = _one_of("eval_rows", eval_rows, "eval_dataset", rows_of(eval_dataset, "eval_dataset"), trainer)
    specs = tool_specs(tools) if tools is not None else []
    environment = environment_spec(environment_factory) if environment_factory is not None else None
    if config_from is None:
        cfg, reward_weights = config_from_args(cfg, args, specs, environment)
    elif specs or environment is not None:
        raise ConfigError(f"{trainer} takes no tools or environments; multi-turn rollouts are GRPOTrainer's")
    else:
        cfg, reward_weights = config_from(cfg, args)
    if isinstance(model, os.PathLike):
        model = os.fspath(model)
    if model is not None and not isinstance(model, str) and not _is_module(model):
        raise ConfigError(
            f"model: got {type(model).__name__}; give a loaded transformers model (with tokenizer=), a model "
            "folder or a hub id"
        )
    if tokenizer is not None and (isinstance(tokenizer, (str, bytes)) or not callable(getattr(tokenizer, "encode", None))):
        raise ConfigError(
            f"tokenizer: got {type(tokenizer).__name__}, which cannot encode text; give the model's tokenizer "
            "(AutoTokenizer.from_pretrained(...)), or give model as a folder or hub id and both are loaded"
        )
    if isinstance(model, str):  # TRL: a path or hub id
        cfg = copy.deepcopy(cfg)
        cfg.model.name_or_path, model = model, None
    elif model is not None and tokenizer is None:
        raise ConfigError(
            f"{trainer}(model=<a loaded model>) needs its tokenizer too: pass tokenizer= (or TRL's "
            "processing_class=), or give model as a path or hub id and both are loaded"
        )
    if peft_config is not None:
        cfg = lora_from_peft(copy.deepcopy(cfg), peft_config)
    if environment is not None and reward_functions is None:  # TRL: the environment's get_reward alone
        cfg = copy.deepcopy(cfg)
        cfg.rewards = []
    rewards = weighted(rewards_from(reward_functions), reward_weights)
    adapted = [adapt_callback(c) for c in callbacks]
    return TrainerArguments(cfg, model, tokenizer, rewards, adapted, train_rows, eval_rows)


def _one_of(name: str, value: Any, trl_name: str, trl_value: Any, trainer: str = "GRPOTrainer") -> Any:
    """grpokit's keyword or TRL's name for the same thing; both given is refused."""
    if value is not None and trl_value is not None:
        raise ConfigError(f"{trainer} got both {name}= and {trl_name}= (TRL's name for it): give one")
    return value if value is not None else trl_value


def lora_from_peft(cfg: Any, peft_config: Any) -> Any:
    """cfg with lora.* set from a peft.LoraConfig; its fields grpokit has no setting for are refused by name."""
    if type(peft_config).__name__ != "LoraConfig":
        raise ConfigError(f"peft_config: only a peft.LoraConfig is supported, got {type(peft_config).__name__}")
    from peft import LoraConfig

    default = LoraConfig()
    mapped = {"r": "r", "lora_alpha": "alpha", "lora_dropout": "dropout", "target_modules": "target_modules"}
    ignored = {"task_type", "peft_type", "base_model_name_or_path", "revision", "inference_mode", "auto_mapping"}
    for f in dataclasses.fields(peft_config):
        value = getattr(peft_config, f.name)
        if f.name in mapped or f.name in ignored or value == getattr(default, f.name, value):
            continue
        raise ConfigError(
            f"peft_config.{f.name}={value!r} has no grpokit setting (lora.r, lora.alpha, lora.dropout, "
            "lora.target_modules are mapped); leave it at peft's default"
        )
    targets = peft_config.target_modules
    if targets is None or isinstance(targets, str):
        raise ConfigError(
            f"peft_config.target_modules={targets!r}: give the module names as a list, e.g. "
            "['q_proj', 'k_proj', 'v_proj', 'o_proj']"
        )
    cfg.lora.enabled = True
    cfg.lora.r, cfg.lora.alpha = int(peft_config.r), peft_config.lora_alpha
    cfg.lora.dropout, cfg.lora.target_modules = float(peft_config.lora_dropout), sorted(targets)
    return cfg


def rewards_from(items: Any) -> list[tuple[str, Callable, float]] | None:
    """Rewards as (name, function, weight) from what TRL takes: a function, a list of functions, names of
    grpokit rewards (math_accuracy, module:function) or (name, function[, weight]) tuples."""
    if items is None:
        return None
    if callable(items) or isinstance(items, str):
        items = [items]
    if not isinstance(items, (list, tuple)):
        raise ConfigError(
            f"reward_functions: got {type(items).__name__}; give a function, a grpokit reward name, or a list of them"
        )
    if not items:
        raise ConfigError("reward_functions is empty: give at least one (or None for the config's rewards)")
    out = []
    for i, item in enumerate(items):
        if isinstance(item, (str, os.PathLike)):
            out.append(named_reward(os.fspath(item), i))
        elif isinstance(item, tuple) and len(item) in (2, 3) and isinstance(item[0], str) and callable(item[1]):
            weight = item[2] if len(item) == 3 else 1.0
            if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
                raise ConfigError(
                    f"reward_functions[{i}] ({item[0]!r}): weight {weight!r} is not a finite number (e.g. 1.0)"
                )
            out.append((item[0], item[1], float(weight)))
        elif callable(item) and not _is_module(item):
            out.append((getattr(item, "__name__", type(item).__name__), item, 1.0))
        else:
            what = "a model object" if _is_module(item) else repr(item)[:80]
            raise ConfigError(
                f"reward_functions[{i}]: got {what}; give a function, a grpokit reward name, (name, function"
                "[, weight]), or a sequence-classification reward model's folder or hub id (a loaded one: save it "
                "with save_pretrained(DIR) and give DIR)"
            )
    return out


HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
"""owner/name: a hub id (a local folder of that name comes first)."""


def named_reward(spec: str, i: int) -> tuple[str, Callable, float]:
    """A reward named in reward_funcs, as TRL reads it: a grpokit reward (a built-in name, module:function or
    file.py:function), else a model folder or hub id: a sequence-classification reward model
    (grpokit.rewards.reward_model, named by the folder's or id's last part, as TRL names it). A process reward
    model stays the config's explicit form: rewards: [{name: process_reward_model, kwargs: {path: DIR}}]."""
    from grpokit.rewards import resolve_reward
    from grpokit.rewards.registry import BUILTINS

    folder = Path(spec).expanduser()
    if spec in BUILTINS or ":" in spec or not ((folder / "config.json").is_file() or _hub_id(spec, folder)):
        return spec, resolve_reward(spec), 1.0
    if not folder.is_dir():
        folder = _download(spec, i)
    from grpokit.rewards.reward_model import make_reward_model

    try:
        return spec.rstrip("/").rsplit("/", 1)[-1], make_reward_model(str(folder)), 1.0
    except ValueError as e:
        raise ConfigError(f"reward_funcs[{i}]={spec!r}: {e}") from None


def _hub_id(spec: str, folder: Path) -> bool:
    return bool(HUB_ID.fullmatch(spec)) and not folder.exists() and not spec.endswith(".py")


def _download(spec: str, i: int) -> Path:
    """The hub id's files (as transformers would fetch them); a ConfigError naming the id when it cannot."""
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(spec))
    except Exception as e:  # noqa: BLE001 - offline, unknown id, no access: one line that names the id
        raise ConfigError(
            f"reward_funcs[{i}]={spec!r} is neither a grpokit reward nor a local model folder, and the hub could not "
            f"give it ({type(e).__name__}: {' '.join(str(e).split())[:200]}); give a folder, or a reward function"
        ) from None


def _is_module(obj: Any) -> bool:
    return any(c.__name__ == "Module" and c.__module__.startswith("torch.nn") for c in type(obj).__mro__)


def adapt_callback(callback: Any) -> Any:
    """A transformers.TrainerCallback (instance or class) wrapped so the trainer can run it; else as is."""
    if isinstance(callback, type):
        callback = callback()
    names = {c.__name__ for c in type(callback).__mro__}
    if "TrainerCallback" in names:
        return TrainerCallbackAdapter(callback)
    if not callable(callback):
        raise ConfigError(
            f"callbacks: {type(callback).__name__} is neither a function fn(step, metrics, trainer) nor a "
            "transformers.TrainerCallback"
        )
    return callback


class TrainerCallbackAdapter:
    """Runs a transformers.TrainerCallback's events under grpokit (see the module doc)."""

    def __init__(self, callback: Any) -> None:
        from transformers import TrainerControl, TrainerState

        self.callback = callback
        self.state, self.control = TrainerState(), TrainerControl()
        self.__qualname__ = type(callback).__qualname__

    def _args(self, trainer: Any) -> SimpleNamespace:
        c = trainer.cfg
        rollout = getattr(c, "rollout", None)  # None: an SFT run (SFTTrainer's callbacks come here too)
        return SimpleNamespace(
            output_dir=c.train.output_dir, max_steps=c.train.steps, learning_rate=c.optim.lr, seed=c.train.seed,
            num_train_epochs=self.state.num_train_epochs, num_generations=getattr(rollout, "group_size", None),
            max_completion_length=getattr(rollout, "max_new_tokens", None),
            per_device_train_batch_size=c.optim.micro_batch_size, logging_steps=1, report_to=c.train.report_to,
        )  # fmt: skip

    def _call(self, event: str, trainer: Any, **kwargs: Any) -> None:
        from transformers import TrainerControl

        from grpokit.compat.trl.after_train import trainer_state

        s = trainer_state(trainer, self.state)
        hook = getattr(self.callback, event, None)
        if callable(hook):
            learner = trainer.learner  # the policy's optimizer and schedule (grpokit.train.learner)
            extra = dict(model=trainer.model, processing_class=trainer.tokenizer, optimizer=learner.optimizer,
                         lr_scheduler=learner.scheduler)  # fmt: skip
            out = hook(self._args(trainer), s, self.control, **extra, **kwargs)
            if isinstance(out, TrainerControl):
                self.control = out
        if self.control.should_training_stop and not trainer.stopped_early:
            trainer.stop(f"stopped by {self.__qualname__} (control.should_training_stop) at step {trainer.step}")

    def __call__(self, step: int, metrics: dict[str, float], trainer: Any) -> None:
        self._call("on_step_end", trainer)
        self._call("on_log", trainer, logs=metrics)

    def on_train_begin(self, trainer: Any) -> None:
        self._call("on_train_begin", trainer)

    def on_evaluate(self, trainer: Any, metrics: dict[str, float]) -> None:
        """transformers' event with its names for the held-out metrics (``eval_loss``, ``eval_accuracy``), as
        EarlyStoppingCallback and other callbacks read them."""
        from grpokit.compat.trl.after_train import with_eval_prefix

        self._call("on_evaluate", trainer, metrics=with_eval_prefix(metrics))

    def on_save(self, trainer: Any, path: Any) -> None:
        self._call("on_save", trainer)

    def on_train_end(self, trainer: Any, summary: dict[str, Any]) -> None:
        self._call("on_train_end", trainer)
