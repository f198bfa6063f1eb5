"""What ``grpokit bench`` is given, checked before any model is built or process started: which bench (mode) reads
which option (an option another mode reads would do nothing: refused by name), numbers in range, the form and keys
of --set and --trl-set, the folders named. Each check returns why the input cannot run, or None; grpokit.bench.cli
prints it as one line and exits 2."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

MODES = {
    "learn": "--learn",
    "async": "--async",
    "plan": "--plan",
    "memory": "--memory",
    "sft": "--mode sft",
    "grpo": "the GRPO step bench (the default)",
}
"""The bench's modes, each by the flag that chooses it (``mode_of``)."""

FLAG_MODES: dict[str, tuple[str, ...]] = {
    "shape": ("grpo", "sft", "plan"),
    "packing": ("sft",),
    "model_size": ("grpo", "sft"),
    "model_dir": ("grpo", "sft"),
    "steps": ("grpo", "sft", "learn", "async", "memory"),
    "ks": ("async",),
    "reward_latency": ("async",),
    "target": ("async",),
    "seeds": ("learn", "async"),
    "eval_every": ("learn", "async"),
    "quick": ("learn",),
    "task": ("learn",),
    "train_size": ("learn",),
    "lr": ("learn",),
    "arms": ("learn",),
    "trl_set": ("learn",),
    "compare": ("grpo", "sft", "memory"),
    "trl_script": ("grpo", "memory"),  # --memory refuses it with its reason (TRL runs in this Python)
    "trl_python": ("grpo", "sft", "learn", "memory"),
    "dtype": ("grpo", "sft"),
    "precision": ("grpo", "sft"),
    "engine": ("grpo",),
    "kv_cache": ("grpo",),
    "cuda_graphs": ("grpo",),
    "device": ("grpo", "sft"),
    "algos": ("grpo",),
    "set": ("grpo", "learn", "async", "memory"),
    "memory_cap_gib": ("grpo",),
    "beta": ("grpo", "memory"),
    "batch": ("memory",),
    "memory_gib": ("plan",),
    "gradient_checkpointing": ("grpo", "sft"),
    "cache_dir": ("grpo", "sft"),
    "output_dir": ("grpo", "learn", "async"),
}
"""Which modes read each option (by its argparse dest); one given to another mode would do nothing: refused.
EVERY_MODE's are read by every mode (a new option goes in one of the two: tests/unit/bench/test_bench_inputs.py)."""

EVERY_MODE = ("help", "mode", "learn", "async_runs", "plan", "memory", "json")
"""The options every mode reads: the mode flags themselves and --json."""

TRL_ONLY = ("trl_script", "trl_python")
"""Options read only beside TRL: with --compare trl (--learn always runs TRL)."""


def mode_of(args: argparse.Namespace) -> str:
    """The mode ``args`` chooses (a key of MODES), in cmd_bench's order of precedence."""
    if args.learn:
        return "learn"
    if args.async_runs:
        return "async"
    if args.plan:
        return "plan"
    if args.memory:
        return "memory"
    return "sft" if args.mode == "sft" else "grpo"


def unused_flags(args: argparse.Namespace, actions: list[argparse.Action]) -> str | None:
    """Why an option given (a value other than its default, ``actions``: grpokit bench's parser's) would do nothing
    in the chosen mode, or None: the first such option by name, the mode, and what to do. Two mode flags at once
    are refused too."""
    chosen = [flag for flag, on in (("--learn", args.learn), ("--async", args.async_runs), ("--plan", args.plan),
                                    ("--memory", args.memory)) if on]  # fmt: skip
    if args.mode == "sft":
        chosen.append("--mode sft")
    if len(chosen) > 1:
        return f"{' and '.join(chosen)} choose different benches: give one"
    mode = mode_of(args)
    for action in actions:
        dest = action.dest
        if dest not in FLAG_MODES:
            continue
        modes = FLAG_MODES[dest]
        value = getattr(args, dest, action.default)
        if value == action.default:
            continue
        flag = action.option_strings[-1]
        if mode not in modes:
            names = [MODES[m].split(" (")[0] for m in modes]
            readers = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
            return f"{flag} is not read by {MODES[mode]}, only by {readers}: use that, or drop {flag} (it would do nothing)"
        if dest in TRL_ONLY and mode in ("grpo", "sft") and args.compare != "trl":
            return f"{flag} is read only with --compare trl: add that, or drop {flag}"
    return None


def bad_numbers(args: argparse.Namespace) -> str | None:
    """Why a number given is out of its range (NaN and infinities included), or None."""
    checks = [
        ("--memory-gib", args.memory_gib, lambda v: 0 < v < math.inf, "a number of GiB > 0, e.g. 16"),
        ("--memory-cap-gib", args.memory_cap_gib, lambda v: 0 < v < math.inf, "a number of GiB > 0, e.g. 16"),
        ("--beta", args.beta, lambda v: 0 <= v < math.inf, "a number >= 0, e.g. 0.04"),
        ("--reward-latency", args.reward_latency, lambda v: 0 <= v < math.inf, "seconds >= 0, e.g. 0.1"),
        ("--target", args.target, lambda v: 0 <= v <= 1, "a held-out accuracy in [0, 1], e.g. 0.5"),
    ]
    for flag, value, ok, what in checks:
        if value is not None and not ok(value):
            return f"{flag} {value:g}: give {what}"
    if args.cache_dir is not None and Path(args.cache_dir).exists() and not Path(args.cache_dir).is_dir():
        return f"--cache-dir {args.cache_dir} is a file: give a folder (random models are built and kept there)"
    if args.model_dir is not None and not (Path(args.model_dir) / "config.json").is_file():
        where = "no such folder" if not Path(args.model_dir).exists() else "no config.json there"
        return f"--model-dir {args.model_dir}: {where}; give a model folder (e.g. from make_model.py), or --model-size"
    return None


def bad_overrides(args: argparse.Namespace) -> str | None:
    """Why a --set or --trl-set cannot apply, or None: --set's KEY=VALUE form, keys, types and ranges against the
    config tree (the rules between settings are the mode's own config's, checked where it is built); --trl-set's
    KEY=VALUE form. Checked before any run or process starts."""
    from grpokit.config.checks import build_config
    from grpokit.config.declare import check_tree
    from grpokit.config.schema import Config, ConfigError, apply_overrides, config_to_dict

    for text in args.trl_set:
        if "=" not in text or not text.split("=", 1)[0].strip():
            return f"--trl-set {text!r}: give FIELD=VALUE, a TRL GRPOConfig field (e.g. --trl-set adam_beta2=0.99)"
    if args.set:
        try:
            check_tree(build_config(Config, apply_overrides(config_to_dict(Config()), list(args.set))))
        except ConfigError as e:
            return f"--set: {e}"
    return None
