"""Offload on request (for a GPU): what a training step keeps in GPU memory but does not need there all the time.

- ``OffloadedOptimizer`` (optim.offload_optimizer): the optimizer's states, and the copy of the weights it
  updates, live in CPU memory; each step copies the gradients to the CPU, steps there and copies the new
  weights back. The GPU then holds weights and gradients only: 4 bytes a parameter in bf16 instead of
  bf16_kahan's 10 (a 1.5B model: 6 GiB instead of 15). The step is the same arithmetic on the same dtypes
  (on a CPU-only run the same numbers exactly; on a GPU torch's AdamW is then not the fused kernel).
  ZeRO-Offload's idea (Ren et al. 2021), without its overlap of copies and compute.
- ``on_device`` (optim.offload_reference): the frozen reference model kept on the CPU and moved to the GPU
  for its log-prob pass only.
- ``activations_on_cpu`` (optim.offload_activations): the tensors autograd saves for the backward pass,
  outside checkpointed regions (with model.gradient_checkpointing: each layer's input), are held in CPU
  memory until the backward pass needs them (``torch.autograd.graph.save_on_cpu``).

None of them changes a number: tests/unit/model/test_offload.py compares each with the plain run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch

CPU = torch.device("cpu")


class OffloadedOptimizer(torch.optim.Optimizer):
    """``make(cpu_params)``'s optimizer stepping CPU copies of ``params``; see the module docstring.

    ``param_groups``, ``state``, ``state_dict()`` and ``load_state_dict()`` are the inner optimizer's, so a
    learning-rate scheduler drives it and its checkpoint is the one the optimizer would save without offload
    (states keyed by parameter order). Loss scaling (float16) is not supported: GradScaler unscales the
    gradients the optimizer holds, which are copied only at step()."""

    def __init__(
        self, params: list[torch.Tensor], make: Callable[[list[torch.Tensor]], torch.optim.Optimizer]
    ):
        # torch.optim.Optimizer.__init__ is not called: this object shares the inner optimizer's groups/state
        self.params = list(params)  # on the training device
        self.cpu_params = [p.detach().to(CPU, copy=True).requires_grad_(True) for p in self.params]
        self.inner = make(self.cpu_params)
        self.defaults = self.inner.defaults
        self._optimizer_step_pre_hooks: dict = {}
        self._optimizer_step_post_hooks: dict = {}

    @property
    def param_groups(self):  # noqa: D102 - the inner optimizer's (the scheduler writes their lr)
        return self.inner.param_groups

    @param_groups.setter
    def param_groups(self, groups) -> None:
        self.inner.param_groups = groups

    @property
    def state(self):  # noqa: D102
        return self.inner.state

    @state.setter
    def state(self, state) -> None:
        self.inner.state = state

    @torch.no_grad()
    def step(self, closure=None):
        """Gradients to the CPU, the inner optimizer's step there, the new weights back to the device."""
        if closure is not None:
            raise ValueError("OffloadedOptimizer.step takes no closure")
        for p, c in zip(self.params, self.cpu_params):
            c.grad = None if p.grad is None else p.grad.to(CPU, copy=True)
        self.inner.step()
        for p, c in zip(self.params, self.cpu_params):
            if c.grad is not None:
                p.copy_(c, non_blocking=False)
                c.grad = None

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in (self.params, self.cpu_params):
            for p in group:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.zero_()

    def state_dict(self):
        return self.inner.state_dict()

    def load_state_dict(self, state_dict) -> None:
        """The inner optimizer's states, and the CPU copies taken anew from the device parameters: a resume
        loads the checkpoint's weights into ``params`` first, and the next step() copies ``cpu_params`` back
        over them, so copies left from construction would replace every weight trained before the checkpoint
        with the initial ones (the defect issue 48 found: a resume with offload_optimizer lost all training)."""
        self.inner.load_state_dict(state_dict)
        self.sync_from_params()

    @torch.no_grad()
    def sync_from_params(self) -> None:
        """Copy the device parameters into the CPU copies the optimizer steps (after weights were loaded into
        the model outside this optimizer)."""
        for p, c in zip(self.params, self.cpu_params):
            c.copy_(p.detach().to(CPU))

    def master_state(self, param: torch.Tensor) -> dict:
        """The inner optimizer's state of the device parameter ``param`` (its CPU copy's)."""
        for p, c in zip(self.params, self.cpu_params):
            if p is param:
                return self.inner.state.get(c, {})
        return {}

    def __repr__(self) -> str:
        return f"OffloadedOptimizer({self.inner!r})"


@contextlib.contextmanager
def on_device(model: torch.nn.Module | None, device: torch.device, offload: bool) -> Iterator[None]:
    """``model`` on ``device`` inside the block, back on the CPU after it when ``offload`` (a no-op
    otherwise, or for None)."""
    if model is None or not offload:
        yield
        return
    model.to(device)
    try:
        yield
    finally:
        model.to(CPU)
        if device.type == "cuda":
            torch.cuda.empty_cache()


def activations_on_cpu(offload: bool, device: torch.device):
    """Context of a training forward: tensors saved for backward kept in (pinned, on CUDA) CPU memory
    when ``offload``, else a no-op."""
    if not offload:
        return contextlib.nullcontext()
    return torch.autograd.graph.save_on_cpu(pin_memory=device.type == "cuda")
