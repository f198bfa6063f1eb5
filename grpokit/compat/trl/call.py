"""TRL's GRPOTrainer call, taken as it is written (issue 52):

    GRPOTrainer(model="Qwen/Qwen2.5-0.5B-Instruct", reward_funcs=accuracy_reward, train_dataset=dataset)
    GRPOTrainer(model=..., reward_funcs=[f, g], args=GRPOConfig(..., reward_weights=[1.0, 0.2]),
                train_dataset=..., eval_dataset=..., processing_class=tok, peft_config=LoraConfig(...))

What each argument means here:
  - ``args``: a ``trl.GRPOConfig`` or its ``to_dict()`` (or a flat mapping of its fields) is converted by
    grpokit.config.trl.from_trl (its notes printed to stderr), so the run is TRL's; a grpokit ``Config`` (or a
    mapping of grpokit's sections) is grpokit's own, the same call without TRL installed. No ``args`` and no cfg:
    TRL's GRPOConfig defaults (``from_trl({})``), as TRL's trainer takes them, whether TRL is installed or not.
  - ``reward_weights`` (a GRPOConfig field, as in TRL): the weights of ``reward_funcs``, in order.
  - ``train_dataset`` / ``eval_dataset``: a ``datasets.Dataset`` or a list of rows (dicts); an IterableDataset or a
    dict of several evaluation sets is refused by name.
  - ``model`` (or the first positional argument, TRL's place for it): a loaded model, a folder (str or
    ``pathlib.Path``) or a hub id.
  - everything else TRL's GRPOTrainer takes and grpokit has no counterpart for is refused by name, with the fix.
"""

from __future__ import annotations

import copy
import os
import sys
from collections.abc import Mapping
from typing import Any

from grpokit.core.errors import ConfigError

KEYWORDS = (
    "cfg", "args", "model", "tokenizer", "processing_class", "train_rows", "train_dataset", "eval_rows", "eval_dataset",
    "reward_functions", "reward_funcs", "callbacks", "peft_config", "tools", "environment_factory", "resume",
    "overwrite", "allow_changed_config",
)  # fmt: skip
"""GRPOTrainer's keywords a user passes (the part classes sampler/updater/critic aside), for near-miss hints."""


UNSUPPORTED = {
    "reward_weights": "reward weights are a GRPOConfig field in TRL: GRPOTrainer(..., args=GRPOConfig("
    "reward_weights=[...])), or give each reward as (name, function, weight) in reward_funcs",
    "reward_processing_classes": "a reward model given by its folder or hub id in reward_funcs loads its own "
    "tokenizer; drop reward_processing_classes",
    "optimizers": "the optimizer is AdamW with the optim.* settings (optim.lr, optim.adam_beta2, optim.schedule, ...)",
    "quantization_config": "no quantised training; give a float model (model.dtype) or LoRA (peft_config)",
    "rollout_func": "rollouts are grpokit's; multi-turn ones through rollout.tools or rollout.environment "
    "(docs/guides/multi-turn.md)",
    "train_data": "the training rows are train_dataset= (TRL) or train_rows= (grpokit)",
    "dataset": "the training rows are train_dataset= (TRL) or train_rows= (grpokit)",
    "config": "the config is args= (a TRL GRPOConfig or a grpokit Config) or the first argument (a grpokit Config)",
}
"""Keywords of TRL's GRPOTrainer (and near misses) grpokit refuses, with what to do instead."""


def refuse_unexpected(
    unexpected: Mapping[str, Any],
    trainer: str = "GRPOTrainer",
    unsupported: Mapping[str, str] = UNSUPPORTED,
    keywords: tuple[str, ...] = KEYWORDS,
) -> None:
    """A ConfigError naming the first keyword ``trainer`` does not take: one of ``unsupported``, with its fix, or an
    unknown one, with the nearest of ``keywords`` (SFTTrainer's tables: grpokit.compat.trl.sft_call)."""
    for name in sorted(unexpected):
        why = unsupported.get(name)
        if why is not None:
            raise ConfigError(f"{trainer}({name}=...) is not taken: {why}")
    if unexpected:
        import difflib

        name = sorted(unexpected)[0]
        near = difflib.get_close_matches(name, keywords, n=1)
        hint = f"did you mean {near[0]}=? " if near else ""
        raise ConfigError(f"{trainer} got an unknown keyword {name}=; {hint}it takes {', '.join(keywords)}")


def config_from_args(
    cfg: Any, args: Any, tools: list[str] | None = None, environment: Any = None
) -> tuple[Any, list[float] | None]:
    """(the run's Config, TRL's reward_weights or None) from GRPOTrainer's ``cfg`` and ``args`` (module doc).
    ``tools``: TRL's tools= as rollout.tools entries (``tool_specs``), added to the config's own; ``environment``:
    TRL's environment_factory as rollout.environment (``environment_spec``). A TRL config's max_completion_length
    and max_tool_calling_iterations then bound the episodes (grpokit.config.trl.from_trl)."""
    from grpokit.config.schema import Config, config_from_dict
    from grpokit.config.trl import from_trl, looks_like_trl

    tools = tools or []
    if environment is not None and tools:
        raise ConfigError(
            "GRPOTrainer got tools= and environment_factory=: give the tools as methods of the environment class "
            "(grpokit runs an environment's tools on its own instance, and the others apart)"
        )
    if cfg is not None and args is not None:
        raise ConfigError(
            "GRPOTrainer got a config twice (the first argument and args=): give one, a grpokit Config or TRL's GRPOConfig"
        )
    given = args if args is not None else cfg
    if isinstance(given, Config):
        return _with_tools(given, tools, environment), None
    if given is None:  # TRL's call without args: GRPOConfig's defaults
        values, notes = from_trl({}, tools, environment)
        _say(notes, "no args: TRL's GRPOConfig defaults")
        return config_from_dict(values), None
    if type(given).__name__ == "SFTConfig" and callable(getattr(given, "to_dict", None)):
        raise ConfigError("GRPOTrainer got TRL's SFTConfig; give a trl.GRPOConfig (an SFTConfig goes to SFTTrainer)")
    trl_object = type(given).__name__ in ("GRPOConfig", "AsyncGRPOConfig") or callable(getattr(given, "to_dict", None))
    if isinstance(given, Mapping) and not trl_object and not looks_like_trl(given) and given:
        return _with_tools(config_from_dict(dict(given)), tools, environment), None  # grpokit's own sections
    if not trl_object and not isinstance(given, Mapping):
        sft = " (an SFTConfig goes to grpokit.trainers.sft.SFTTrainer)" if type(given).__name__ == "SFTConfig" else ""
        raise ConfigError(
            f"GRPOTrainer's config (args= or the first argument) must be a grpokit Config (load_config builds one) or "
            f"TRL's GRPOConfig (or its to_dict()), got {type(given).__name__}{sft}"
        )
    values = given.to_dict() if trl_object and not isinstance(given, Mapping) else dict(given)
    weights = values.pop("reward_weights", None)
    if values.get("reward_funcs") is not None:  # a file's own list: its weights go with it
        values["reward_weights"] = weights
        weights = None
    values, notes = from_trl(values, tools, environment)
    _say(notes, "TRL's GRPOConfig converted (grpokit.config.trl)")
    return config_from_dict(values), None if weights is None else list(weights)


def _with_tools(cfg: Any, tools: list[str], environment: Any = None) -> Any:
    """A grpokit config with ``tools`` beside its own rollout.tools and ``environment`` as rollout.environment (a
    copy; the config itself when neither); an environment the config names too is refused."""
    if not tools and environment is None:
        return cfg
    cfg = copy.deepcopy(cfg)
    cfg.rollout.tools = [*cfg.rollout.tools, *tools]
    if environment is not None:
        if cfg.rollout.environment:
            raise ConfigError(
                f"GRPOTrainer got environment_factory= and a config with rollout.environment="
                f"{cfg.rollout.environment!r}: give one"
            )
        cfg.rollout.environment = environment
    return cfg


def environment_spec(factory: Any) -> str | dict[str, str]:
    """TRL's ``environment_factory`` as rollout.environment: "trl:module:Env" (grpokit.integrations.trl_environment
    runs it), or for a dict {name: factory} a mapping of such names (each row's ``environment`` column picks one). A
    factory that cannot be found by name (a lambda, a nested class) is refused naming it: each episode's worker and
    the sampler process load it by name."""
    from grpokit.core.user_code import name_of

    if isinstance(factory, Mapping):
        if not factory:
            raise ConfigError("environment_factory: an empty dict; give {name: factory, ...}")
        return {str(k): "trl:" + name_of(f, f"environment_factory[{k!r}]") for k, f in factory.items()}
    if not callable(factory):
        raise ConfigError(f"environment_factory: expected a class or function, got {type(factory).__name__}")
    return "trl:" + name_of(factory, "environment_factory")


def tool_specs(tools: Any) -> list[str]:
    """TRL's ``tools=[fn, ...]`` as rollout.tools entries: each function by the name it is found again under
    (grpokit.core.user_code.name_of: "module:function", "__main__:fn" for one defined in the script itself), so that
    the config names it, the sampler process loads it and a resume finds it; a name ("python", "module:function",
    "file.py:function") as it is. A function that cannot be found by name (a lambda, a nested function, a method)
    is refused naming it: tools run in worker processes, which must load them."""
    from grpokit.core.user_code import name_of

    if isinstance(tools, (str, bytes)) or not isinstance(tools, (list, tuple)):
        raise ConfigError(f"tools: expected a list of functions, got {type(tools).__name__}")
    return [tool if isinstance(tool, str) else name_of(tool, f"tools[{k}]") for k, tool in enumerate(tools)]


def _say(notes: list[str], head: str) -> None:
    print(f"grpokit: {head}:\n" + "\n".join(f"  - {n}" for n in notes), file=sys.stderr)


def rows_of(dataset: Any, name: str) -> list[dict] | None:
    """A dataset given the TRL way as a list of rows (dicts); None stays None."""
    if dataset is None:
        return None
    kind = type(dataset).__name__
    if kind in ("IterableDataset", "IterableDatasetDict"):
        raise ConfigError(
            f"{name}: a streaming {kind} has no length to plan epochs and steps over; load it whole "
            "(load_dataset(..., streaming=False)) or give a list of rows"
        )
    if isinstance(dataset, Mapping) or kind == "DatasetDict":
        if len(dataset) == 1:
            return rows_of(next(iter(dataset.values())), name)
        raise ConfigError(
            f"{name}: a dict of {len(dataset)} datasets ({', '.join(map(str, dataset))}); grpokit evaluates one "
            "held-out set: give one of them"
        )
    if isinstance(dataset, (str, bytes, os.PathLike)):
        raise ConfigError(
            f"{name}: got the path {os.fspath(dataset)!r}; give the rows (datasets.load_dataset(...)) or set "
            f"{'data.train' if name == 'train_dataset' else 'data.eval'} in the config to the file or hub id"
        )
    if kind == "Dataset" or hasattr(dataset, "to_list"):
        return list(dataset.to_list())
    return list(dataset)


def weighted(reward_functions: list[tuple[str, Any, float]] | None, weights: list[float] | None):
    """``reward_functions`` with TRL's reward_weights (from its GRPOConfig) laid on them, in order."""
    if weights is None:
        return reward_functions
    if reward_functions is None:
        raise ConfigError(
            f"args.reward_weights={weights} needs the rewards it weighs: give reward_funcs= to GRPOTrainer, in order"
        )
    if len(weights) != len(reward_functions):
        raise ConfigError(
            f"args.reward_weights has {len(weights)} values for {len(reward_functions)} reward_funcs "
            f"({', '.join(n for n, _, _ in reward_functions)}); give one weight per function, in order"
        )
    out = []
    for (name, fn, own), weight in zip(reward_functions, weights):
        if own != 1.0:
            raise ConfigError(
                f"reward {name!r} has a weight twice: {own} in its (name, function, weight) and {weight} in "
                "args.reward_weights; give one"
            )
        out.append((name, fn, float(weight)))
    return out
