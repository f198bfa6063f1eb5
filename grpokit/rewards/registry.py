"""Built-in reward functions by name, and `resolve_reward` / `resolve_reward_specs` for config entries.

Every problem with a reward entry (unknown name, a module that fails to import, a missing file or
attribute, something that is not callable, unknown or bad parameters) is a `RewardConfigError`, a
`grpokit.config.schema.ConfigError` whose one-line message names the entry and says what to do, e.g.
"rewards[1].name='foo.py:bar': file foo.py not found (relative to /work); give the path of an
existing .py file".
"""

from __future__ import annotations

import difflib
import inspect
import math
from collections.abc import Callable, Iterable
from numbers import Real
from pathlib import Path
from typing import Any

from grpokit.config.schema import ConfigError
from grpokit.core.user_code import UserCodeError, describe, load_module
from grpokit.rewards.accuracy import make_math_accuracy, math_accuracy
from grpokit.rewards.code import code_tests, make_code_tests
from grpokit.rewards.format import format_lenient, format_strict
from grpokit.rewards.language import language_consistency, make_language_consistency
from grpokit.rewards.length import length_penalty, overlong_penalty
from grpokit.rewards.reward_model import make_process_reward_model, make_reward_model

BUILTINS: dict[str, Callable] = {
    "math_accuracy": math_accuracy,
    "format_strict": format_strict,
    "format_lenient": format_lenient,
    "format": format_strict,
    "code_tests": code_tests,
    "language_consistency": language_consistency,
    "overlong_penalty": overlong_penalty,  # factory: overlong_penalty(max_len, buffer_len)
    "length_penalty": length_penalty,  # factory: length_penalty(max_len, min_len=0, scale=1.0)
    "reward_model": make_reward_model,  # factory: reward_model(path, batch_size=8, ...)   (reward_model.py)
    "process_reward_model": make_process_reward_model,  # factory: (path, step_separator="\n", ...)
}
"""name -> reward function, or factory (marked `_grpokit_factory`) that builds one from parameters."""

_CONFIGURABLE: dict[str, Callable[..., Callable]] = {
    "math_accuracy": make_math_accuracy,  # answer_column, timeout_s
    "code_tests": make_code_tests,  # tests_column, timeout_s, memory_mb, workers, isolation, ...
    "language_consistency": make_language_consistency,  # target
}

_FORMS = "a builtin name, 'package.module:function' or 'path/to/file.py:function'"


class RewardConfigError(ConfigError):
    """A reward entry of the config cannot be turned into a reward function; the message says why."""


def is_factory(obj: object) -> bool:
    return bool(getattr(obj, "_grpokit_factory", False))


def resolve_reward(spec: str, **kwargs) -> Callable:
    """The reward function named by `spec`: a key of BUILTINS, 'module:function' or 'file.py:function'.

    kwargs go to a factory: the parameterised builtins (overlong_penalty(max_len=..., buffer_len=...)),
    the configurable ones (math_accuracy(answer_column=...), code_tests(timeout_s=...),
    language_consistency(target=...)), or a user 'module:factory' that returns the reward function.
    Raises RewardConfigError (a ConfigError) naming the problem and what to do.
    """
    return _resolve(spec, kwargs, f"reward {spec!r}", "its parameters")


def resolve_reward_specs(specs: Iterable[Any]) -> list[tuple[str, Callable, float]]:
    """[(name, function, weight)] for the config's `rewards` list (RewardSpec objects or dicts with
    name, weight and kwargs); a problem raises RewardConfigError naming the `rewards[i]` entry."""
    out: list[tuple[str, Callable, float]] = []
    seen: dict[str, int] = {}
    for i, spec in enumerate(specs):
        get = (
            spec.get if isinstance(spec, dict) else lambda key, default=None, s=spec: getattr(s, key, default)
        )
        name, weight, kwargs = get("name"), get("weight", 1.0), get("kwargs") or {}
        where = f"rewards[{i}].name={name!r}"
        if not isinstance(weight, Real) or isinstance(weight, bool) or not math.isfinite(weight):
            raise RewardConfigError(f"rewards[{i}].weight={weight!r}: expected a finite number, e.g. 1.0")
        if not isinstance(kwargs, dict):
            raise RewardConfigError(
                f"rewards[{i}].kwargs={kwargs!r}: expected a mapping, e.g. {{max_len: 512}}"
            )
        if name in seen:
            raise RewardConfigError(
                f"{where}: the same reward as rewards[{seen[name]}]; each reward may appear once "
                "(merge the two entries, or wrap one in your own 'file.py:function')"
            )
        fn = _resolve(name, kwargs, where, f"rewards[{i}].kwargs")
        seen[name] = i
        out.append((name, fn, float(weight)))
    return out


def _resolve(spec: object, kwargs: dict, where: str, params: str) -> Callable:
    if not isinstance(spec, str) or not spec.strip():
        raise RewardConfigError(f"{where}: expected {_FORMS}, e.g. math_accuracy")
    spec = spec.strip()
    if spec in BUILTINS:
        obj = BUILTINS[spec]
        if is_factory(obj):
            return _call_factory(obj, spec, kwargs, where, params)
        if not kwargs:
            return obj
        if spec not in _CONFIGURABLE:
            raise RewardConfigError(f"{params}={kwargs!r}: {spec} takes no parameters; remove them")
        return _call_factory(_CONFIGURABLE[spec], spec, kwargs, where, params)
    if ":" not in spec and (Path(spec).expanduser() / "config.json").is_file():
        raise RewardConfigError(
            f"{where}: a model folder; name the kind of reward it gives, with the folder as its path: "
            f"{{name: reward_model, kwargs: {{path: {spec}}}}} (a sequence-classification reward model) or "
            f"{{name: process_reward_model, kwargs: {{path: {spec}}}}} (a process reward model)"
        )
    if ":" not in spec:
        near = difflib.get_close_matches(spec, list(BUILTINS), n=1, cutoff=0.6)
        hint = f"did you mean {near[0]!r}? " if near else ""
        if spec.endswith(".py"):
            hint = f"to name a function in a file write '{spec}:function'. "
        raise RewardConfigError(
            f"{where}: unknown reward; {hint}Use {_FORMS}. Builtins: {', '.join(sorted(BUILTINS))}"
        )
    target, attr = spec.rsplit(":", 1)
    if not target or not attr:
        raise RewardConfigError(f"{where}: expected {_FORMS}; one side of ':' is empty")
    module = _load(target, attr, where)
    if not hasattr(module, attr):
        defined = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))
        listing = f"; it defines: {', '.join(defined[:12])}" if defined else "; it defines no functions"
        raise RewardConfigError(f"{where}: {target} has no attribute {attr!r}{listing}")
    obj = getattr(module, attr)
    if not callable(obj):
        raise RewardConfigError(
            f"{where}: {target}'s {attr} is not a function (a {type(obj).__name__} value); name a function "
            "fn(prompts, completions, **columns) -> list[float | None]"
        )
    if kwargs:
        obj = _call_factory(obj, f"{target}:{attr}", kwargs, where, params)
    return obj


def _load(target: str, attr: str, where: str):
    """The module of 'module:function' or 'file.py:function' (grpokit.core.user_code: probed in a child first)."""
    try:
        return load_module(target, attr, where, prefix="grpokit_user_reward")
    except UserCodeError as e:
        raise RewardConfigError(str(e)) from e


def _call_factory(factory: Callable, label: str, kwargs: dict, where: str, params: str) -> Callable:
    """factory(**kwargs), with unknown, missing and rejected parameters reported as config errors."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        signature = None
    if signature is not None:
        accepted = [
            p.name
            for p in signature.parameters.values()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        ]
        takes = f"{label} takes {', '.join(accepted)}" if accepted else f"{label} takes no parameters"
        if {"prompts", "completions"} <= set(accepted):
            raise RewardConfigError(
                f"{params}={kwargs!r}: {label} is a reward function, not a factory, so it takes no "
                "parameters; remove them, or name a function that returns the reward function"
            )
        try:
            signature.bind(**kwargs)
        except TypeError as e:
            unknown = sorted(set(kwargs) - set(accepted))
            if unknown and not any(p.kind == p.VAR_KEYWORD for p in signature.parameters.values()):
                near = difflib.get_close_matches(unknown[0], accepted, n=1)
                hint = f" (did you mean {near[0]!r}?)" if near else ""
                raise RewardConfigError(f"{params}: unknown parameter {unknown[0]!r}{hint}; {takes}") from e
            raise RewardConfigError(f"{params}={kwargs!r}: {e}; {takes}") from e
    try:
        fn = factory(**kwargs)
    except (Exception, SystemExit) as e:
        raise RewardConfigError(f"{params}={kwargs!r}: {label} rejected them: {describe(e)}") from e
    if not callable(fn):
        raise RewardConfigError(
            f"{where}: {label}(**{params}) returned no function (a {type(fn).__name__} value)"
        )
    return fn
