"""What crosses from the trainer to an asynchronous run's sampler process, and the checks that it can: the policy
pickled once with its shared tensors named, not copied (``_shared_payload`` / ``_load_payload``: a fork maps the
trainer's pages, a spawned process torch's shared memory), the parameters a push carries, and the refusal, before
the model loads, of what a spawned process could not receive (a lambda, a function of a notebook's __main__).

    check_sendable(rewards_fn, max_staleness, "the reward functions")   # ConfigError naming it and what to do
    payload = _shared_payload((recipe, model, reference), shared_tensors(ref_model))
    recipe, model, reference = _load_payload(payload, shared)           # in the process
"""

from __future__ import annotations

import copyreg
import io
import pickle
import sys
import types
from collections import OrderedDict

import torch
from torch.utils.hooks import RemovableHandle

from grpokit.core.errors import (
    ConfigError,
)


def trainable_parameters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The parameters a push carries: those that train (with LoRA the adapter; the frozen base never changes)."""
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


def check_sendable(obj: object, max_staleness: int, what: str) -> None:
    """ConfigError, naming ``what`` and the object, when ``obj`` cannot reach a spawned process: something
    pickle cannot take (a lambda, a nested function) or a function of a __main__ the process cannot import
    (a notebook, an interactive session, ``python -c``). Refused on a CPU-only run too, where the process is a
    fork that could take it (``start_method``): the same config must also run on a GPU or with vLLM, where it
    is spawned."""
    try:
        _SendCheck(io.BytesIO()).dump(obj)
    except Exception as e:  # noqa: BLE001 - pickle raises several kinds; each is reported with its reason
        raise ConfigError(
            f"rollout.max_staleness={max_staleness}: {what} cannot be sent to the sampler process: "
            f"{type(e).__name__}: {e}. That process is a fork of this one on a CPU-only run, but a fresh "
            "interpreter (spawn) with CUDA or vLLM, which receives everything pickled; it is refused on every "
            "run, forked too, so that a config that runs here also runs on a GPU. Define reward functions, "
            "tools and environments at module level in a .py file (importable, or named in the config as "
            "path/file.py:function), not as a lambda, a nested function or in a notebook; or set "
            "rollout.max_staleness=0."
        ) from None


def check_named_code(rollout, max_staleness: int) -> None:
    """ConfigError when a tool, an environment or a tool parser is named "__main__:..." (given as a function of a
    notebook or an interactive session, grpokit.rollout.episodes.name_callables) and the sampler process could
    not import that __main__."""
    named = [*(rollout.tools if isinstance(rollout.tools, (list, tuple)) else []), rollout.environment]
    named.append(rollout.tool_parser)
    here = [name for name in named if isinstance(name, str) and name.startswith("__main__:")]
    if here and not _main_importable():
        raise ConfigError(
            f"rollout.max_staleness={max_staleness}: {', '.join(here)} is defined in __main__ (a notebook or an "
            "interactive session), which the sampler process cannot import when it is a fresh interpreter (spawn, "
            "with CUDA or vLLM; refused on a CPU-only run's fork too, so that the config also runs on a GPU); define "
            "it at module level in a .py file and give it as path/file.py:name or module:name, or set "
            "rollout.max_staleness=0."
        )


def _main_importable() -> bool:
    """Whether a spawned process finds what this process's __main__ defines (multiprocessing runs a main
    script again as __mp_main__; not a notebook, an interactive session or ``python -c``)."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None:
        return not spec.name.endswith("__main__")  # python -m package: its __main__ is not run again
    return bool(getattr(main, "__file__", None))


def _started_by_script() -> bool:
    """Whether this process's __main__ is a script file, which a spawned process runs again (as __mp_main__)."""
    main = sys.modules.get("__main__")
    return getattr(main, "__spec__", None) is None and bool(getattr(main, "__file__", None))


_SCRIPT_HINT = (
    " (The process imports the script that started the run again, as any spawned process does: a script that "
    'trains at its top level must do it under `if __name__ == "__main__":`.)'
)


class _SendCheck(pickle.Pickler):
    """A pickler that also refuses functions and classes of a __main__ a spawned process cannot import."""

    def reducer_override(self, obj):
        if isinstance(obj, (types.FunctionType, type)) and getattr(obj, "__module__", None) == "__main__":
            if not _main_importable():
                raise pickle.PicklingError(
                    f"{obj.__qualname__} is defined in __main__ (a notebook or an interactive session), which "
                    "a spawned process cannot import"
                )
        return NotImplemented


_HOOKS = (
    "_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs", "_backward_hooks", "_backward_pre_hooks",
)  # fmt: skip


class _PolicyPickler(pickle.Pickler):
    """Pickles the policy without its modules' forward and backward hooks: they are the trainer's (gradient
    checkpointing's input-grad hook is a nested function pickle cannot take) and the sampler runs no backward.
    The tensors of ``shared`` (name -> tensor) are pickled as their names (``_load_payload`` puts them back)."""

    def __init__(self, file, protocol: int, shared: dict[str, torch.Tensor] | None = None):
        super().__init__(file, protocol=protocol)
        self._names = {id(t): name for name, t in (shared or {}).items()}

    def persistent_id(self, obj):
        return self._names.get(id(obj)) if self._names else None

    def reducer_override(self, obj):
        if isinstance(obj, torch.nn.Module) and type(obj).__getstate__ is torch.nn.Module.__getstate__:
            state = obj.__getstate__()
            for key in _HOOKS:
                if key in state:
                    state[key] = OrderedDict()
            for key in [k for k, v in state.items() if _holds_handles(v)]:
                del state[key]  # hook handles kept as attributes (transformers' _require_grads_hook(s)) hold the hooks
            return copyreg.__newobj__, (type(obj),), state
        return NotImplemented


def _holds_handles(value: object) -> bool:
    """A hook's RemovableHandle, or a list or tuple of them (transformers 5 keeps gradient checkpointing's input-grad
    hooks' handles so, and a handle pickles the hooks it can remove)."""
    if isinstance(value, (list, tuple)):
        return bool(value) and all(isinstance(v, RemovableHandle) for v in value)
    return isinstance(value, RemovableHandle)


def shared_tensors(module: torch.nn.Module | None) -> dict[str, torch.Tensor]:
    """``module``'s parameters and buffers by name, each tensor once (None: none): what reaches the sampler
    process as itself, not as a copy in the pickled description (``_shared_payload`` names them). A fork maps the
    trainer's pages (copy on write: nothing writes a frozen reference); spawn sends them through the process's
    arguments, which torch moves into shared memory once and maps there."""
    if module is None:
        return {}
    named = [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, t in named:
        if id(t) not in seen:  # tied weights: one tensor, its first name
            seen.add(id(t))
            out[name] = t
    return out


def _shared_payload(obj: object, shared: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
    """``obj`` pickled into a shared-memory byte tensor: it reaches the spawned process without going through
    its start pipe (a large policy there would hold the trainer until the process had imported torch). The
    tensors of ``shared`` are left out, named (``shared_tensors``)."""
    buffer = io.BytesIO()
    _PolicyPickler(buffer, pickle.HIGHEST_PROTOCOL, shared).dump(obj)
    view = buffer.getbuffer()
    payload = torch.empty(len(view), dtype=torch.uint8).share_memory_()
    payload.numpy()[:] = memoryview(view).cast("B")
    return payload


class _Unpickler(pickle.Unpickler):
    """Puts the tensors a payload names (``_PolicyPickler``'s ``shared``) back."""

    def __init__(self, file, shared: dict[str, torch.Tensor]):
        super().__init__(file)
        self._shared = shared

    def persistent_load(self, name):
        return self._shared[name]


class _ViewReader:
    """A file over a memoryview for the unpickler, which copies only what it reads (io.BytesIO would copy the
    whole payload first)."""

    def __init__(self, view: memoryview):
        self.view, self.at = view, 0

    def read(self, n: int = -1) -> bytes:
        end = len(self.view) if n is None or n < 0 else min(len(self.view), self.at + n)
        out, self.at = self.view[self.at : end].tobytes(), end
        return out

    def readinto(self, buffer) -> int:
        n = min(len(buffer), len(self.view) - self.at)
        memoryview(buffer).cast("B")[:n] = self.view[self.at : self.at + n]
        self.at += n
        return n

    def readline(self) -> bytes:  # the text opcodes of protocols 0-1 only: not in a HIGHEST_PROTOCOL payload
        end = self.at
        while end < len(self.view) and self.view[end] != 10:
            end += 1
        return self.read(end + 1 - self.at)


def _load_payload(payload: torch.Tensor, shared: dict[str, torch.Tensor]) -> object:
    """What ``_shared_payload(obj, shared)`` pickled, its named tensors ``shared``'s own."""
    return _Unpickler(_ViewReader(memoryview(payload.numpy()).cast("B")), shared).load()
