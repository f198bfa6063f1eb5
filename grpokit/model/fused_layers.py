"""The Llama-family layer's elementwise work in few kernels: what the static-cache decode engine
(grpokit.rollout.engines.fast.decode) runs between its matrix products under ``rollout.compile``, and what every
forward's RMSNorms and MLPs run under ``model.compile`` (:func:`fuse_modules`).

A decode step of a small model is a thousand small kernels: transformers' RMSNorm alone is seven (the cast to
float32, the square, the mean, the add, the rsqrt, the product, the weight), and each costs a few microseconds on
the device whatever its size, inside a CUDA graph too. Here each chain is one function:

    h' = h + delta;  x = w * cast(h' * rsqrt(mean(h'^2) + eps))     add_rms_norm (the residual add and the next norm)
    x  = w * cast(h * rsqrt(mean(h^2) + eps))                         rms_norm (transformers' formula, float32 inside)
    silu(gate) * up                                                   swiglu (the MLP between its projections)
    q * cos + rotate_half(q) * sin, the same for k                    rope_qk

:class:`LayerOps` runs them through ``torch.compile`` (Inductor writes one fused kernel per function, with
``emulate_precision_casts`` so the bfloat16 roundings happen where transformers' eager code rounds), or eagerly:
the same functions, the CPU tests' reference. Used only on the modules whose classes are known to compute exactly
these formulas (``RMSNORM_CLASSES``, ``MLP_CLASSES`` with a SiLU); any other module is called as it is. Written
here rather than taken from liger-kernel: its kernels are Triton (GPU only), so they could not run in the CPU tests
that check the path against the one it replaces, and its RoPE patch replaces transformers' module-level function
for every model in the process.

Measured on an H200 (docs/benchmarks.md, 2026-11-29): in the decode, replayed as CUDA graphs, generation took 0.71x
its time (``rollout.compile`` auto: on a GPU); in the update, launched call by call, the fused norms and gates made
it 1.2-1.3x slower (not profiled yet; a compiled call's host overhead is the likely cause), so ``model.compile`` is
off by default.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor

from grpokit.model.llama_layers import rotate

RMSNORM_CLASSES = frozenset({"LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "MistralRMSNorm"})
MLP_CLASSES = frozenset({"LlamaMLP", "Qwen2MLP", "Qwen3MLP", "MistralMLP"})
SILU_ACTIVATIONS = frozenset({"silu", "swish"})


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """transformers' Llama RMSNorm: ``weight * (x * rsqrt(mean(x^2) + eps))`` in float32, cast back before the
    weight. x: (..., H), weight: (H,)."""
    dtype = x.dtype
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(dtype)


def add_rms_norm(h: Tensor, delta: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """The residual add and the next RMSNorm: ``(h + delta, rms_norm(h + delta))``. h, delta: (..., H)."""
    h = h + delta
    return h, rms_norm(h, weight, eps)


def swiglu(gate: Tensor, up: Tensor) -> Tensor:
    """The Llama MLP's gate: ``silu(gate) * up``, (..., I) each."""
    return F.silu(gate) * up


def rope_qk(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """RoPE on q (B, heads, T, d) and k (B, kv_heads, T, d); cos/sin (B, T, d) (grpokit.model.llama_layers.rotate)."""
    return rotate(q, cos, sin), rotate(k, cos, sin)


def _inductor_options() -> dict:
    """Inductor's emulate_precision_casts where this torch has it: a bfloat16 result is rounded before a fused
    consumer reads it, as eager code rounds it."""
    from torch._inductor import config

    return {"emulate_precision_casts": True} if hasattr(config, "emulate_precision_casts") else {}


def _compile_failures() -> tuple[type[BaseException], ...]:
    """The exceptions torch.compile raises when it cannot build a function (dynamo's, Inductor's)."""
    from torch._dynamo.exc import TorchDynamoException

    try:
        from torch._inductor.exc import InductorError
    except ImportError:  # an older torch
        return (TorchDynamoException,)
    return (TorchDynamoException, InductorError)


def compiled_function(fn):
    """``fn`` through torch.compile (dynamic shapes, one graph), whose failure to build names the settings that
    turn it off rather than surfacing as a compiler's traceback alone."""
    compiled = torch.compile(fn, dynamic=True, fullgraph=True, options=_inductor_options())
    failures = _compile_failures()

    @functools.wraps(fn)
    def call(*args):
        try:
            return compiled(*args)
        except failures as e:
            first = (str(e).strip().splitlines() or [""])[0][:300]
            raise RuntimeError(
                f"torch.compile could not build grpokit's fused {fn.__name__} ({type(e).__name__}: {first}); set "
                "rollout.compile=false, model.compile=false and optim.fused_logprobs=false to run the plain code"
            ) from e

    return call


def _known_norm(module: torch.nn.Module) -> bool:
    return type(module).__name__ in RMSNORM_CLASSES and hasattr(module, "weight") and hasattr(module, "variance_epsilon")


def _known_mlp(module: torch.nn.Module, hidden_act: str | None) -> bool:
    return (
        type(module).__name__ in MLP_CLASSES
        and hidden_act in SILU_ACTIVATIONS
        and all(hasattr(module, name) for name in ("gate_proj", "up_proj", "down_proj"))
    )


@functools.cache
def shared_ops(compiled: bool) -> LayerOps:
    """The process's LayerOps (compiled or eager), made once: every fused module of every model uses them."""
    return LayerOps(compiled)


class _FusedForward:
    """A fused module's ``forward`` under model.compile (an instance attribute): it keeps its module and calls the
    shared ops, so a deep copy (the frozen reference) binds to the copy and a pickle (the asynchronous sampler
    receives the policy pickled) takes it whole, where a bound method of a module-level function would not load."""

    def __init__(self, module: torch.nn.Module, compiled: bool, kind: str):
        self.module, self.compiled, self.kind = module, bool(compiled), kind

    def __call__(self, x: Tensor) -> Tensor:
        ops = shared_ops(self.compiled)
        return ops.fused_norm(self.module, x) if self.kind == "norm" else ops.fused_mlp(self.module, x)


def fuse_modules(model: torch.nn.Module, compiled: bool = True) -> int:
    """model.compile: every RMSNorm and SwiGLU MLP of ``model`` whose class is known (``RMSNORM_CLASSES``,
    ``MLP_CLASSES`` with a SiLU) runs its fused function from now on, in every forward and its backward: its
    ``forward`` becomes an attribute of the instance (:class:`_FusedForward`: the class is untouched, so other models
    are not; a deep copy, such as the frozen reference, and a pickle keep it, bound to their own module). The MLP's
    projections are still called, LoRA wrappers included. Returns how many modules were fused."""
    config = getattr(model, "config", None)
    hidden_act = getattr(getattr(config, "get_text_config", lambda: config)(), "hidden_act", None)
    fused = 0
    for module in model.modules():
        if _known_norm(module):
            module.forward = _FusedForward(module, compiled, "norm")
        elif _known_mlp(module, hidden_act):
            module.forward = _FusedForward(module, compiled, "mlp")
        else:
            continue
        fused += 1
    return fused


class LayerOps:
    """The fused functions, compiled (``compiled=True``: ``torch.compile``, dynamic shapes, one graph each) or
    eager, and how a layer's modules use them. ``hidden_act``: the model config's (the MLP is fused only for SiLU).
    """

    def __init__(self, compiled: bool, hidden_act: str | None = "silu"):
        self.compiled = bool(compiled)
        self.hidden_act = hidden_act
        wrap = compiled_function if compiled else (lambda f: f)
        self._norm, self._add_norm, self._swiglu, self.rope = wrap(rms_norm), wrap(add_rms_norm), wrap(swiglu), wrap(rope_qk)

    def fused_norm(self, module: torch.nn.Module, x: Tensor) -> Tensor:
        """An RMSNorm ``module`` of a known class on ``x``, as one fused function."""
        return self._norm(x, module.weight, module.variance_epsilon)

    def fused_mlp(self, module: torch.nn.Module, x: Tensor) -> Tensor:
        """A SwiGLU MLP ``module`` of a known class on ``x``: its three projections (LoRA wrappers included) around
        one fused gate."""
        return module.down_proj(self._swiglu(module.gate_proj(x), module.up_proj(x)))

    def norm(self, module: torch.nn.Module, x: Tensor) -> Tensor:
        """``module(x)`` for an RMSNorm ``module``, fused where its class is known."""
        return self.fused_norm(module, x) if _known_norm(module) else module(x)

    def add_norm(self, module: torch.nn.Module, h: Tensor, delta: Tensor) -> tuple[Tensor, Tensor]:
        """``(h + delta, module(h + delta))``, in one kernel where ``module``'s class is known."""
        if _known_norm(module):
            return self._add_norm(h, delta, module.weight, module.variance_epsilon)
        h = h + delta
        return h, module(h)

    def mlp(self, module: torch.nn.Module, x: Tensor) -> Tensor:
        """``module(x)`` for a Llama-family MLP, fused (:meth:`fused_mlp`) where its class is known."""
        return self.fused_mlp(module, x) if _known_mlp(module, self.hidden_act) else module(x)

    def layers(self, decoder: torch.nn.Module, hidden: Tensor, attention) -> Tensor:
        """hidden (B, T, H) through every layer of ``decoder`` and its final norm (pre-norm residual blocks, as
        grpokit.model.llama_layers), each residual add fused into the norm after it. ``attention(layer_index,
        self_attn, x)`` returns the attention block's output (B, T, H) for normed input x."""
        layers = decoder.layers
        x = self.norm(layers[0].input_layernorm, hidden) if len(layers) else None
        for i, layer in enumerate(layers):
            hidden, x = self.add_norm(layer.post_attention_layernorm, hidden, attention(i, layer.self_attn, x))
            after = layers[i + 1].input_layernorm if i + 1 < len(layers) else decoder.norm
            hidden, x = self.add_norm(after, hidden, self.mlp(layer.mlp, x))
        return x if x is not None else self.norm(decoder.norm, hidden)
