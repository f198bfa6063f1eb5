"""Built-in reward functions by name, and `resolve_reward` for config strings."""

from __future__ import annotations

import difflib
import importlib
import importlib.util
from collections.abc import Callable
from pathlib import Path

from grpokit.rewards.accuracy import make_math_accuracy, math_accuracy
from grpokit.rewards.code import code_tests, make_code_tests
from grpokit.rewards.format import format_lenient, format_strict
from grpokit.rewards.language import language_consistency, make_language_consistency
from grpokit.rewards.length import length_penalty, overlong_penalty

BUILTINS: dict[str, Callable] = {
    "math_accuracy": math_accuracy,
    "format_strict": format_strict,
    "format_lenient": format_lenient,
    "format": format_strict,
    "code_tests": code_tests,
    "language_consistency": language_consistency,
    "overlong_penalty": overlong_penalty,  # factory: overlong_penalty(max_len, buffer_len)
    "length_penalty": length_penalty,  # factory: length_penalty(max_len, min_len=0, scale=1.0)
}
"""name -> reward function, or factory (marked `_grpokit_factory`) that builds one from parameters."""

_CONFIGURABLE: dict[str, Callable[..., Callable]] = {
    "math_accuracy": make_math_accuracy,  # answer_column, timeout_s
    "code_tests": make_code_tests,  # tests_column, timeout_s, memory_mb, workers, isolation, ...
    "language_consistency": make_language_consistency,  # target
}

_FORMS = "a builtin name, 'package.module:function' or 'path/to/file.py:function'"


def is_factory(obj: object) -> bool:
    return bool(getattr(obj, "_grpokit_factory", False))


def resolve_reward(spec: str, **kwargs) -> Callable:
    """The reward function named by `spec`: a key of BUILTINS, 'module:function' or 'file.py:function'.

    kwargs go to a factory: the parameterised builtins (overlong_penalty(max_len=..., buffer_len=...)),
    the configurable ones (math_accuracy(answer_column=...), code_tests(timeout_s=...),
    language_consistency(target=...)), or a user 'module:factory' that returns the reward function.
    Raises ValueError for an unknown name (naming the nearest builtin), ImportError/AttributeError
    for a user function that cannot be found, TypeError for bad parameters.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"reward spec must be {_FORMS}; got {spec!r}")
    spec = spec.strip()
    if spec in BUILTINS:
        obj = BUILTINS[spec]
        if is_factory(obj):
            return obj(**kwargs)
        if kwargs:
            if spec.startswith("format"):
                raise TypeError(f"reward {spec!r} takes no parameters, got {sorted(kwargs)}")
            return _CONFIGURABLE[spec](**kwargs)
        return obj
    if ":" not in spec:
        near = difflib.get_close_matches(spec, list(BUILTINS), n=1, cutoff=0.0)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        raise ValueError(f"unknown reward {spec!r}{hint} Use {_FORMS}. Builtins: {sorted(BUILTINS)}")
    target, name = spec.rsplit(":", 1)
    if target.endswith(".py") or "/" in target:
        path = Path(target).expanduser()
        if not path.is_file():
            raise ImportError(f"reward {spec!r}: no file {path}")
        module_spec = importlib.util.spec_from_file_location(f"grpokit_user_reward_{path.stem}", path)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    if not hasattr(module, name):
        raise AttributeError(f"reward {spec!r}: {target} has no attribute {name!r}")
    obj = getattr(module, name)
    if kwargs:
        obj = obj(**kwargs)
    if not callable(obj):
        raise TypeError(f"reward {spec!r} is not callable: {obj!r}")
    return obj
