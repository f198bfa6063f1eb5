"""Memory of a training run, measured and split by role.

Measured: on a GPU the increase of ``torch.cuda.max_memory_allocated`` over what was allocated before
the trainer was built (the peak statistics are reset once the trainer is built, so its loading does not
count; its weights do, being allocated). On CPU the increase of the process's peak resident set size
(``VmHWM``, reset through ``/proc/self/clear_refs`` once the trainer is built) over its resident size
(``VmRSS``) before it was built, freed heap memory being handed back to the system (``malloc_trim``)
at both points. Without ``/proc`` (not Linux) the peak is ``ru_maxrss`` and is not reset.

By role, counted from the tensors themselves, each storage once (a storage two roles share counts for
the first): policy weights (parameters and buffers), its gradients, its optimizer state (every tensor in
``optimizer.state``: AdamW's moments, the Kahan buffer of bf16_kahan), the reference model, and the
critic's weights, gradients and optimizer state when the trainer has a ``critic`` part (PPO:
grpokit.train.critic.Critic, its ``model`` and its learner's optimizer). Gradients are COMPUTED, not read: the numel times
the element size of every trainable parameter (PyTorch keeps a gradient in its parameter's dtype). They
exist during every backward pass, which is where a step's peak is, but the trainer drops them after
the optimizer step, so there is nothing to read once the step is over. Whatever the peak holds beyond
these roles is ``activations_other``: activations, logits, the KV cache, temporaries of the optimizer
step, the allocator's slack and, on CPU, the modules and Python objects the trainer created.
"""

from __future__ import annotations

import ctypes
import gc
import re
import resource
import sys
from collections.abc import Iterable
from pathlib import Path

import torch

ROLES = (
    "policy_weights",
    "policy_gradients",
    "policy_optimizer",
    "reference_model",
    "critic_weights",
    "critic_gradients",
    "critic_optimizer",
)
"""The roles, in the order they are counted (a shared storage counts for the first)."""


def tensor_bytes(tensors: Iterable, seen: set, device: str | None = None) -> int:
    """Bytes of the storages of ``tensors`` not in ``seen`` (which it extends): a view or a tied weight
    counts once, with its whole storage. ``device``: only tensors on that device type ("cuda", "cpu")."""
    total = 0
    for t in tensors:
        if not isinstance(t, torch.Tensor) or t.device.type == "meta":
            continue
        if device is not None and t.device.type != device:
            continue
        storage = t.untyped_storage()
        key = (str(t.device), storage.data_ptr())
        if storage.data_ptr() == 0 or key in seen:
            continue
        seen.add(key)
        total += storage.nbytes()
    return total


def module_tensors(module: torch.nn.Module | None) -> list[torch.Tensor]:
    if module is None:
        return []
    return [*module.parameters(), *module.buffers()]


def gradient_bytes(module: torch.nn.Module | None, device: str | None = None) -> int:
    """numel x element size of every trainable parameter (on ``device`` when given): its gradient's size
    (same dtype, same device)."""
    if module is None:
        return 0
    return sum(
        p.numel() * p.element_size()
        for p in module.parameters()
        if p.requires_grad and (device is None or p.device.type == device)
    )


def optimizer_tensors(optimizer: torch.optim.Optimizer | None) -> list[torch.Tensor]:
    """Every tensor of ``optimizer.state``, and an offloaded optimizer's copy of the weights
    (grpokit.model.offload.OffloadedOptimizer.cpu_params)."""
    if optimizer is None:
        return []
    states = [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
    return [*states, *getattr(optimizer, "cpu_params", [])]


def role_bytes(trainer, device: str | None = None) -> dict[str, int]:
    """Bytes per role (``ROLES``) of a built trainer, from its public attributes: ``model``, ``learner``
    (its ``optimizer``), ``ref_model`` and ``critic`` (None, or PPO's part: its ``model`` and its
    ``learner.optimizer``). Call it once the optimizer has stepped (its state exists from the first step on).
    ``device``: only what lives on that device type (on a GPU run, "cpu" gives what was offloaded)."""
    part = getattr(trainer, "critic", None)
    critic = part.model if part is not None else None
    critic_opt = part.learner.optimizer if part is not None else None
    seen: set = set()
    return {
        "policy_weights": tensor_bytes(module_tensors(trainer.model), seen, device),
        "policy_gradients": gradient_bytes(trainer.model, device),
        "policy_optimizer": tensor_bytes(optimizer_tensors(trainer.learner.optimizer), seen, device),
        "reference_model": tensor_bytes(module_tensors(getattr(trainer, "ref_model", None)), seen, device),
        "critic_weights": tensor_bytes(module_tensors(critic), seen, device),
        "critic_gradients": gradient_bytes(critic, device),
        "critic_optimizer": tensor_bytes(optimizer_tensors(critic_opt), seen, device),
    }


# --- the measured peak ------------------------------------------------------------------------------


def _proc_status_kib(key: str) -> int | None:
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:
        return None
    m = re.search(rf"^{key}:\s+(\d+) kB", text, re.MULTILINE)
    return int(m.group(1)) if m else None


def _release_freed_memory() -> None:
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # glibc keeps freed heap pages otherwise
    except (OSError, AttributeError):
        pass


def _reset_peak_rss() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # Linux >= 4.0: VmHWM := VmRSS
        return True
    except OSError:
        return False


class PeakMeter:
    """``baseline()`` before building the trainer, ``start()`` once it is built, ``peak_bytes()`` after the
    steps: the peak's increase over the baseline (see the module docstring)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        self.base = 0
        self.reset = False

    @property
    def kind(self) -> str:
        if self.cuda:
            return "cuda max_memory_allocated - allocated before the trainer"
        if self.reset:
            return "peak RSS (VmHWM, reset after building) - RSS before the trainer"
        return "peak RSS (ru_maxrss, not reset: includes earlier peaks) - RSS before the trainer"

    def baseline(self) -> None:
        _release_freed_memory()
        if self.cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
            self.base = torch.cuda.memory_allocated(self.device)
        else:
            rss = _proc_status_kib("VmRSS")
            self.base = (rss if rss is not None else _ru_maxrss_kib()) * 1024

    def start(self) -> None:
        _release_freed_memory()
        if self.cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            self.reset = _reset_peak_rss()

    def peak_bytes(self) -> int:
        if self.cuda:
            torch.cuda.synchronize(self.device)
            return torch.cuda.max_memory_allocated(self.device) - self.base
        hwm = _proc_status_kib("VmHWM") if self.reset else None
        return (hwm if hwm is not None else _ru_maxrss_kib()) * 1024 - self.base


def _ru_maxrss_kib() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak // 1024 if sys.platform == "darwin" else peak  # bytes on macOS, KiB on Linux


def memory_report(trainer, meter: PeakMeter) -> dict:
    """The measured peak, the bytes of each role and what the roles leave: activations_other."""
    roles = role_bytes(trainer, "cuda" if meter.cuda else None)  # on a GPU, what the GPU holds
    offloaded = role_bytes(trainer, "cpu") if meter.cuda else {}  # optim.offload_*: in CPU memory instead
    peak = meter.peak_bytes()
    return {
        "peak_bytes": peak,
        "peak_kind": meter.kind,
        "baseline_bytes": meter.base,
        "roles": roles,
        "offloaded_to_cpu": {k: v for k, v in offloaded.items() if v},
        "activations_other_bytes": peak - sum(roles.values()),
        "gradients": "computed: numel x element size of the trainable parameters (held during backward)",
    }
