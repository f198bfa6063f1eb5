"""Decode engines: the model side of :class:`grpokit.rollout.engines.fast.FastGenerator`'s sampling loop.

An engine turns prompts into next-token logits and then advances one token per call:

- ``prefill(prompt_ids (P, Lp), prompt_mask (P, Lp), G, max_new_tokens) -> logits (P*G, V)``: each
  prompt's forward is run once and its KV cache is repeated for its G samples (rows prompt-major);
- ``step(tokens (B,)) -> logits (B, V)``: feed the last sampled token of each live row;
- ``keep(index (B',))``: drop finished rows, keeping the rows ``index`` (in that order).

Two engines:

- :class:`DynamicCacheEngine` calls the Hugging Face model itself with its ``DynamicCache``; it runs any
  causal LM and is the reference.
- :class:`StaticCacheEngine` runs the model's modules (projections, norms, MLPs, rotary embedding; LoRA
  wrappers included) with its own attention over a preallocated KV cache and a preallocated additive
  mask, so every decode step has the same shapes and addresses. On CUDA it records each step once as a
  CUDA graph (one per batch-size bucket N, N/2, N/4, ...) and then only replays it: the ~40 kernel
  launches per layer, which dominate a small model's decode time, become one launch per step. The kernels
  still run one by one on the device, a few microseconds each however small; ``rollout.compile`` fuses a
  layer's elementwise ones into four (grpokit.model.fused_layers). It
  supports the Llama family layout (Llama, Qwen2, Qwen3, Mistral without sliding windows);
  :func:`static_cache_support` says why a model is not supported, and ``kv_cache="auto"`` then falls
  back to the dynamic engine.

Layout of the static engine: KV buffers (N, kv_heads, L, head_dim) per layer, where the prompt occupies
slots ``[0, Lp)`` (left-padded) and generated token t is written at slot ``Lp + t`` for every row; the
mask (N, 1, 1, L) holds 0 for slots a row may attend to and the dtype's minimum elsewhere (left padding
and not-yet-written slots). Position ids count real tokens only, as in the dynamic engine.
"""

from __future__ import annotations

import contextlib

import torch
from torch import Tensor

from grpokit.config.schema import KV_CACHES
from grpokit.model.fused_layers import LayerOps
from grpokit.model.llama_layers import head_shape, llama_family_support, project_qkv
from grpokit.model.logprobs import base_model


def _accepts(model: torch.nn.Module, arg: str) -> bool:
    import inspect

    return arg in inspect.signature(base_model(model).forward).parameters


def static_cache_support(model: torch.nn.Module) -> str | None:
    """None when :class:`StaticCacheEngine` can run ``model``, else the reason it cannot (the Llama family's layout,
    grpokit.model.llama_layers, and an lm_head)."""
    base = base_model(model)
    # no model.model (GPT-2's is .transformer): the base, whose model_type then says why
    reason = llama_family_support(getattr(base, "model", base))
    if reason is None and not hasattr(base, "lm_head"):
        return "the model has no lm_head"
    return reason


class DynamicCacheEngine:
    """The Hugging Face model with its own ``DynamicCache`` (any causal LM)."""

    name = "dynamic"

    def __init__(self, model: torch.nn.Module):
        self.model = model

    def prefill(
        self, prompt_ids: Tensor, prompt_mask: Tensor, group_size: int, max_new_tokens: int
    ) -> Tensor:
        """prompt_ids, prompt_mask: (P, Lp) left-padded; returns next-token logits (P*G, V) float32."""
        G = group_size
        position_ids = (prompt_mask.cumsum(-1) - 1).clamp(min=0)  # (P, Lp)
        extra = {"logits_to_keep": 1} if _accepts(self.model, "logits_to_keep") else {}
        out = self.model(
            input_ids=prompt_ids,
            attention_mask=prompt_mask,
            position_ids=position_ids,
            use_cache=True,
            **extra,
        )
        self.cache = out.past_key_values
        self.cache.batch_repeat_interleave(G)  # (P, ...) -> (P*G, ...), groups contiguous
        self.attn = prompt_mask.repeat_interleave(G, dim=0)  # (B, Lp + t)
        self.next_pos = position_ids[:, -1:].repeat_interleave(G, dim=0) + 1  # (B, 1)
        return out.logits[:, -1].float().repeat_interleave(G, dim=0)  # (N, V)

    def step(self, tokens: Tensor) -> Tensor:
        """tokens: (B,) last sampled token per live row; returns logits (B, V) float32."""
        self.attn = torch.cat([self.attn, self.attn.new_ones((self.attn.shape[0], 1))], dim=-1)
        out = self.model(
            input_ids=tokens[:, None],
            attention_mask=self.attn,
            position_ids=self.next_pos,
            past_key_values=self.cache,
            use_cache=True,
        )
        self.cache = out.past_key_values
        self.next_pos = self.next_pos + 1
        return out.logits[:, -1].float()

    def keep(self, index: Tensor) -> None:
        self.cache.batch_select_indices(index)
        self.attn, self.next_pos = self.attn[index], self.next_pos[index]

    def release(self) -> bool:
        """Drop the cache; True when one was held."""
        held = self.cache is not None
        self.cache = self.attn = self.next_pos = None
        return held


def _adapter_state(model: torch.nn.Module) -> tuple:
    """PEFT's per-layer switches (merged, disabled, active adapters): Python branches a CUDA graph
    freezes at capture, so a change must drop the graphs."""
    return tuple(
        (bool(m.merged), bool(m.disable_adapters), tuple(m.active_adapters))
        for m in model.modules()
        if hasattr(m, "merged") and hasattr(m, "disable_adapters") and hasattr(m, "active_adapters")
    )


class StaticCacheEngine:
    """Decoder layers over a preallocated KV cache, one CUDA graph per batch bucket (module docstring).

    The engine runs the model's own modules (embeddings, norms, q/k/v/o projections, q/k norms, MLPs,
    rotary embedding, lm_head, LoRA wrappers included) and does the attention itself with
    ``F.scaled_dot_product_attention``: a decode step groups the query heads that share a KV head
    ((B, kv_heads, heads/kv_heads, d) queries against (B, kv_heads, L, d) keys), so grouped-query
    attention never copies the cache per query head.

    cuda_graphs: record and replay decode steps (CUDA only; ignored on CPU). On CUDA, attention runs on
        the memory-efficient SDPA kernel (or the math one), never cuDNN's, whose per-shape plans and
        masked decode inside graphs are not what we test; graphs and eager steps use the same kernels.
    bucketed: run each step on the next bucket size (Nmax, Nmax/2, ...) at or above the live batch, as the
        CUDA graphs always do; settable on CPU so tests run the same layout.
    fused: run the layers' elementwise work (norms with their residual adds, RoPE, the SwiGLU gate) as the few
        functions of grpokit.model.fused_layers; ``compiled``: through torch.compile, one kernel each (rollout.compile),
        else eagerly (the same numbers, the tests' path). Off: the modules as they are.
    Buffers and graphs are kept between calls (a smaller batch or shorter length reuses them; lengths
    are rounded up to a multiple of 64) and rebuilt when either grows, the weights move or PEFT's
    adapter switches change; ``release()`` frees them. The logits ``step`` returns are valid until the
    next ``step``.
    """

    name = "static"
    LENGTH_QUANTUM = 64
    MIN_BUCKET = 8

    def __init__(
        self,
        model: torch.nn.Module,
        cuda_graphs: bool = True,
        bucketed: bool | None = None,
        fused: bool = False,
        compiled: bool = False,
    ):
        reason = static_cache_support(model)
        if reason is not None:
            raise ValueError(f"the static KV cache cannot run this model: {reason}; use kv_cache='dynamic'")
        self.model = model
        base = base_model(model)
        self.inner, self.lm_head = base.model, base.lm_head
        self.heads, self.kv_heads, self.head_dim = head_shape(self.inner)
        self.device = next(model.parameters()).device
        self.use_graphs = bool(cuda_graphs) and self.device.type == "cuda"
        self.bucketed = self.use_graphs or bool(bucketed)
        self._shape: tuple[int, int] | None = None  # (Nmax, L) of the allocated buffers
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, Tensor]] = {}
        self._state: tuple = ()  # weight addresses and adapter switches the buffers/graphs were made for
        self.graphs_recorded = 0  # over the engine's life
        hidden_act = getattr(self.inner.config, "hidden_act", None)
        self.ops = LayerOps(compiled, hidden_act) if fused or compiled else None

    # -- buffers -------------------------------------------------------------------------------------
    def _allocate(self, N: int, L: int, dtype: torch.dtype, device: torch.device) -> None:
        L = -(-L // self.LENGTH_QUANTUM) * self.LENGTH_QUANTUM
        state = (tuple(p.data_ptr() for p in self.model.parameters()), _adapter_state(self.model))
        if self._shape is not None and N <= self._shape[0] and L <= self._shape[1] and state == self._state:
            return
        self.release()
        shape = (N, self.kv_heads, L, self.head_dim)
        n_layers = len(self.inner.layers)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.mask = torch.zeros((N, 1, 1, L), dtype=dtype, device=device)  # additive
        self.tokens = torch.zeros((N, 1), dtype=torch.long, device=device)
        self.positions = torch.zeros((N, 1), dtype=torch.long, device=device)
        self.slot = torch.zeros(1, dtype=torch.long, device=device)  # the slot the next step writes
        self._shape, self._state = (N, L), state
        if self.use_graphs:
            self._pool = torch.cuda.graph_pool_handle()

    def release(self) -> bool:
        """Free the KV buffers and the recorded graphs (rebuilt by the next prefill); True when any were held."""
        held = self._shape is not None
        self._graphs.clear()
        self._shape = None
        self.keys = self.values = self.mask = self.tokens = self.positions = self.slot = None
        return held

    # -- model ---------------------------------------------------------------------------------------
    def _attention(
        self, attn, x: Tensor, cos: Tensor, sin: Tensor, i: int, mask: Tensor, repeat: int, width: int | None = None
    ) -> Tensor:
        """Self-attention of layer i. x: (B, T, H). repeat > 0: prefill (T = Lp; K/V written to slots
        [0, Lp) of each prompt's ``repeat`` rows); repeat == 0: decode (T = 1, written at ``self.slot``), over the
        first ``width`` slots (eager steps: the written ones; None: all, the fixed shapes a CUDA graph needs)."""
        B, T, _ = x.shape
        d, h, kvh = self.head_dim, self.heads, self.kv_heads
        rope = self.ops.rope if self.ops is not None else None
        q, k, v = project_qkv(attn, x, cos, sin, (h, kvh, d), rope)  # (B, h, T, d), (B, kvh, T, d) x 2
        scale = getattr(attn, "scaling", d**-0.5)
        if repeat:
            rows = B * repeat
            self.keys[i][:rows, :, :T].copy_(k.repeat_interleave(repeat, dim=0))
            self.values[i][:rows, :, :T].copy_(v.repeat_interleave(repeat, dim=0))
            k, v = k.repeat_interleave(h // kvh, dim=1), v.repeat_interleave(h // kvh, dim=1)  # (B, h, T, d)
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
            out = out.transpose(1, 2).reshape(B, T, h * d)  # (B, T, h*d)
        else:
            keys, values = self.keys[i][:B], self.values[i][:B]  # views with fixed addresses
            keys.index_copy_(2, self.slot, k)
            values.index_copy_(2, self.slot, v)
            if width is not None:  # the slots past it are unwritten and masked: no work spent on them
                keys, values = keys[:, :, :width], values[:, :, :width]
            grouped = q.reshape(B, kvh, h // kvh, d)  # query heads sharing a KV head: (B, kvh, h/kvh, d)
            out = torch.nn.functional.scaled_dot_product_attention(
                grouped, keys, values, attn_mask=mask, scale=scale
            )  # (B, kvh, h/kvh, d)
            out = out.reshape(B, 1, h * d)
        return attn.o_proj(out)

    def _layers(
        self, hidden: Tensor, mask: Tensor, position_ids: Tensor, repeat: int = 0, width: int | None = None
    ) -> Tensor:
        """hidden (B, T, H) -> final-normed hidden (B, T, H) through every decoder layer."""
        cos, sin = self.inner.rotary_emb(hidden, position_ids)  # (B, T, d) each
        if self.ops is not None:
            return self.ops.layers(
                self.inner, hidden, lambda i, attn, x: self._attention(attn, x, cos, sin, i, mask, repeat, width)
            )
        for i, layer in enumerate(self.inner.layers):
            hidden = hidden + self._attention(
                layer.self_attn, layer.input_layernorm(hidden), cos, sin, i, mask, repeat, width
            )
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        return self.inner.norm(hidden)

    def prefill(
        self, prompt_ids: Tensor, prompt_mask: Tensor, group_size: int, max_new_tokens: int
    ) -> Tensor:
        """prompt_ids, prompt_mask: (P, Lp) left-padded; returns next-token logits (P*G, V) float32.

        Allocates (or reuses) room for Lp + max_new_tokens slots."""
        P, Lp = prompt_ids.shape
        G = group_size
        device = prompt_ids.device
        embeds = self.inner.embed_tokens(prompt_ids)  # (P, Lp, H)
        dtype = embeds.dtype
        self._allocate(P * G, Lp + max_new_tokens, dtype, device)
        minimum = torch.finfo(dtype).min
        # Prefill mask (P, 1, Lp, Lp): causal over real tokens; a padding query sees itself only (finite).
        causal = torch.ones((Lp, Lp), dtype=torch.bool, device=device).tril()  # (Lp, Lp)
        allowed = causal[None] & prompt_mask.bool()[:, None, :]  # (P, Lp, Lp)
        allowed = allowed | torch.eye(Lp, dtype=torch.bool, device=device)[None]
        prefill_mask = torch.zeros((P, 1, Lp, Lp), dtype=dtype, device=device)
        prefill_mask.masked_fill_(~allowed[:, None], minimum)
        position_ids = (prompt_mask.cumsum(-1) - 1).clamp(min=0)  # (P, Lp)
        with self._attention_kernels():
            hidden = self._layers(embeds, prefill_mask, position_ids, repeat=G)  # (P, Lp, H)
        logits = self.lm_head(hidden[:, -1:]).float()[:, -1]  # (P, V)

        # Decode state of rows [:N]: slot Lp next, prompt slots visible where real, later slots hidden.
        # Rows past N are scratch (a bucket may cover them); each decode step unmasks its own slot in
        # every row, so no row ever attends to nothing.
        N = P * G
        self.mask.fill_(minimum)
        self.mask[:N, 0, 0, :Lp].masked_fill_(prompt_mask.repeat_interleave(G, dim=0).bool(), 0.0)
        self.positions[:N].copy_(position_ids[:, -1:].repeat_interleave(G, dim=0) + 1)
        self.slot.fill_(Lp)
        self._next_slot = Lp  # host copy of self.slot (no device sync to read it)
        return logits.repeat_interleave(G, dim=0)  # (N, V)

    def _decode(self, b: int, width: int | None = None) -> Tensor:
        """One decode step on buffer rows [:b]: reads tokens/positions/mask/slot, writes K/V, advances. ``width``:
        attend over the first ``width`` slots only (eager steps; None: every slot, as a CUDA graph records it)."""
        mask = self.mask[:b]
        mask.index_fill_(-1, self.slot, 0.0)  # the slot being written becomes visible
        positions = self.positions[:b]
        hidden = self.inner.embed_tokens(self.tokens[:b])  # (b, 1, H)
        hidden = self._layers(hidden, mask if width is None else mask[..., :width], positions, width=width)
        logits = self.lm_head(hidden)[:, -1].float()  # (b, V)
        positions.add_(1)
        self.slot.add_(1)
        return logits

    def _attention_kernels(self):
        """On CUDA, SDPA limited to the memory-efficient and math kernels (class docstring)."""
        if self.device.type != "cuda":
            return contextlib.nullcontext()
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])

    def _bucket(self, live: int) -> int:
        if not self.bucketed:
            return live
        b = self._shape[0]
        while b // 2 >= live and b // 2 >= self.MIN_BUCKET:
            b //= 2
        return b

    def _graph(self, b: int) -> tuple[torch.cuda.CUDAGraph, Tensor]:
        if b not in self._graphs:
            state = (self.slot.clone(), self.positions[:b].clone(), self.mask[:b].clone())

            def restore() -> None:
                self.slot.copy_(state[0])
                self.positions[:b].copy_(state[1])
                self.mask[:b].copy_(state[2])

            # No autocast while recording: it would cache cast weights the graph then reads forever.
            plain = torch.autocast("cuda", enabled=False)
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream), plain, self._attention_kernels():  # warm-up outside the graph
                self._decode(b)
                restore()  # the warm-up advanced the state; the replay must do the real step
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool), plain, self._attention_kernels():
                logits = self._decode(b)
            self._graphs[b] = (graph, logits)
            self.graphs_recorded += 1
        return self._graphs[b]

    def step(self, tokens: Tensor) -> Tensor:
        """tokens: (B,) last sampled token per live row; returns logits (B, V) float32."""
        B = tokens.shape[0]
        if self._next_slot >= self._shape[1]:
            raise RuntimeError("static KV cache is full (more decode steps than max_new_tokens)")
        self.tokens[:B, 0].copy_(tokens)
        b = self._bucket(B)
        self._next_slot += 1
        if self.use_graphs:
            graph, logits = self._graph(b)
            graph.replay()
            return logits[:B]
        with self._attention_kernels():
            return self._decode(b, width=self._next_slot)[:B]  # slots [0, _next_slot) are written

    def keep(self, index: Tensor) -> None:
        """Move rows ``index`` (B',) to the front of every buffer; later rows become scratch."""
        n, written = index.shape[0], self._next_slot  # the slots past the written ones hold nothing to keep
        for buf in (*self.keys, *self.values):
            buf[:n, :, :written] = buf[index, :, :written]
        self.mask[:n] = self.mask[index]
        self.positions[:n] = self.positions[index]


def check_kv_cache(kv_cache: str) -> None:
    """Raise ValueError unless ``kv_cache`` is one of KV_CACHES."""
    if kv_cache not in KV_CACHES:
        raise ValueError(f"unknown kv_cache {kv_cache!r}; choose one of {KV_CACHES}")


def make_engine(
    model: torch.nn.Module,
    kv_cache: str = "auto",
    cuda_graphs: bool = True,
    bucketed=None,
    fused: bool = False,
    compiled: bool = False,
):
    """The decode engine for ``model``: ``static`` (:class:`StaticCacheEngine`, its ``fused``/``compiled`` layers),
    ``dynamic`` (:class:`DynamicCacheEngine`) or ``auto`` (static when :func:`static_cache_support` allows)."""
    check_kv_cache(kv_cache)
    if kv_cache == "dynamic" or (kv_cache == "auto" and static_cache_support(model) is not None):
        return DynamicCacheEngine(model)
    return StaticCacheEngine(model, cuda_graphs=cuda_graphs, bucketed=bucketed, fused=fused, compiled=compiled)
