"""vLLM as the rollout engine (``rollout.engine: vllm``): the same :class:`~grpokit.rollout.engines.base.Rollout`
as the other generators, sampled by a vLLM engine that holds a copy of the trainer's weights.

Colocated (``rollout.vllm.mode: colocate``, the default): the engine runs in the trainer's own process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``), started from the trainer's weights at the first rollout (written
once to a private folder: config.json and model.safetensors, no tokenizer: prompts go in as token ids and
completions come out as token ids, never re-tokenised).

Weights: before each training rollout the sampler calls ``sync(model, step)``: the trainer's weights are
pushed when they changed and ``rollout.vllm.sync_every`` steps have passed since the last push (> 1 samples
off-policy, up to sync_every - 1 steps behind, and says so in ``rollout/weight_lag``). Any other call
(evaluation, ``grpokit sample``) pushes whenever the weights changed. A push is vLLM's
``reload_weights(weights_iterator=...)`` on the worker, in-process (the tensors are handed over, no copy
through a file or a socket), then ``reset_prefix_cache()``: KV blocks computed with the old weights would
otherwise be reused for prompts seen before (measured: 17-43 nats off on a 300-token prompt). Each push (the
transfer and the reset) runs under ``rollout.vllm.sync_timeout_s``: past it, :class:`WeightSyncTimeout` stops the
run instead of a hang; its bytes and seconds are the step's ``rollout/push_bytes`` and ``rollout/push_s``.

With LoRA (``rollout.vllm.lora_push``): where vLLM's LoRA takes the adapter (its targets, rank and features), the
engine starts from the base weights with LoRA enabled and each push sends the adapter alone (vLLM's add_lora,
replaced in place; every request carries it), a few MB instead of the model; elsewhere (auto's fallback, or
``merged``) the adapter is merged into the pushed weights (W + B A * alpha / r, computed apart: the trainer's
model is never merged and unmerged, which would drift its frozen base by rounding), and the engine needs no
LoRA support and runs at full speed. The checks below cover both: the probe's log-probs see the adapter.

Check (``rollout.vllm.check_weights``): after every push, and before every rollout that should see
current weights, 4,096 evenly spaced values of a few tensors the engine keeps readable (the embedding,
the LM head, the norms; vLLM's CPU linear layers hold a prepacked copy and expose an empty weight) are
compared exactly with the trainer's. A difference stops the run with :class:`WeightSyncError` (a sync that
did not happen, TRL #5312; weights loaded wrongly). The log-prob mismatch of every token
(``sampler_logprob_diff/*``, ``sampler_kl``, grpokit.algos.mismatch) watches the rest.

Log-probs: vLLM's ``processed_logprobs``: the sampled token's log-prob under the distribution it was drawn
from, after the repetition penalty, the temperature, min-p, top-k and top-p (renormalised), the convention of
every engine (grpokit.rollout.engines.base). vLLM applies min-p before top-k / top-p, transformers (and
the fast engine) after: with top_p and min_p both on, vLLM's kept set can be smaller. Greedy (T = 0):
log_softmax of the (penalised) logits, as elsewhere.

Each completion is its own request with its own seed (derived from the rollout's seed), so a resumed run
samples as the first did; the G requests of a prompt share its prefill through vLLM's prefix cache.
(One request with n = G and a seed gives its G samples the same first tokens on vLLM 0.32.)

Server (``rollout.vllm.mode: server``): the engine runs in a ``grpokit vllm-serve`` process (other GPUs,
another node, or loopback) at ``rollout.vllm.server_url``; the generator makes the same calls on it over
HTTP (grpokit.rollout.engines.vllm.remote.ServerEngine, the server grpokit.rollout.engines.vllm.server) that it makes on a
LocalEngine here: the same requests, pushes, cache reset and checks. It waits for the server's health check
at the first rollout, then pushes the trainer's weights (the server started from its own --model).

GPU only (skipped without CUDA): ``rollout.vllm.gpu_memory_utilization``; ``rollout.vllm.sleep`` puts the
engine to sleep (level 1: weights offloaded, KV cache freed) after each rollout so the update has the
memory, and wakes the weights, pushes, then wakes the KV cache before the next one.
"""

from __future__ import annotations

import shutil
import tempfile
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from grpokit.core.errors import ConfigError
from grpokit.rollout.engines.base import Engine, Rollout, SamplingParams, left_pad
from grpokit.rollout.engines.vllm.errors import VLLMUnavailable, WeightSyncError, within
from grpokit.rollout.engines.vllm.local import LocalEngine, start_llm, vllm_missing
from grpokit.rollout.engines.vllm.weights import (
    adapter_problem,
    adapter_weights,
    base_version,
    base_weights,
    fingerprint,
    lora_config,
    lora_rank,
    trainer_weights,
    version_of,
    weight_bytes,
)

SEED_SPACE = 2**31 - 1
PROBE_TOKENS = 512
"""The probe sequence (VLLMGenerator.probe): the first prompt sampled, up to this many tokens; its first 64 are
scored token by token, the whole of it serves the prefix-cache check (which needs more than one KV block)."""


def stop_ids(params: SamplingParams) -> tuple[int, ...]:
    """The ids of ``params``' stop strings that are one token each (rollout.stop; grpokit.rollout.engines.stop)."""
    return () if params.stop_strings is None else params.stop_strings.token_ids


def request_params(params: SamplingParams, seed: int) -> dict[str, Any]:
    """The arguments of vLLM's own SamplingParams for one completion of ``params`` (n = 1, its own ``seed``)."""
    return dict(
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,  # 0 = off, as ours
        min_p=params.min_p,  # 0 = off
        repetition_penalty=params.repetition_penalty,  # over the prompt and the completion so far, as ours
        max_tokens=params.max_new_tokens,
        # EOS, and the stop strings that are one token each (the others are cut after: Engine.generate)
        stop_token_ids=None if params.ignore_eos else [*params.eos_token_ids, *stop_ids(params)],
        ignore_eos=params.ignore_eos,
        seed=seed,
    )


class VLLMGenerator(Engine):
    """The rollout engine over vLLM (see the module docstring). ``settings``: the run's ``rollout.vllm``
    section (grpokit.config.schema.VLLMConfig); ``max_model_len``: prompt plus completion tokens at most
    (rollout.vllm.max_model_len overrides it; None: the model's own limit, and never beyond that);
    ``say``: where notices go. The engine starts at the first ``generate`` and is kept until ``close``."""

    name = "vllm"
    exact_logprobs = False  # vLLM's kernels, not the trainer's model
    holds_weights = True  # its own copy, pushed by sync()
    needs_fresh_process = True  # its engine cannot run in a forked process
    takes_lora_adapters = True  # rollout.vllm.lora_push

    def __init__(
        self, settings: Any, *, max_model_len: int | None, seed: int = 0, say: Callable[[str], None] | None = None
    ):
        missing = vllm_missing() if settings.mode == "colocate" else None  # a server's client needs no vLLM
        if missing:
            raise VLLMUnavailable(missing)
        self.settings, self.max_model_len, self.seed = settings, max_model_len, seed
        self.say = say or (lambda message: None)
        self.llm: Any = None  # LocalEngine, or grpokit.rollout.engines.vllm.remote.ServerEngine in server mode
        self.folder: Path | None = None
        self.pushed: tuple[int, int] | None = None  # version_of the trainer's model the engine holds
        self.pushed_step: int | None = None  # the training step of the last push (sync)
        self.lagging = False  # the next generate may sample from older weights (sync_every > 1)
        self.pushes = 0
        self.probe_ids: list[int] | None = None  # the first prompt sampled, for probe()
        self.adapter = False  # each push sends the LoRA adapter alone (rollout.vllm.lora_push), set at the start
        self.base_pushed: tuple[int, int] | None = None  # base_version the engine holds, when the adapter is apart
        self.stats: dict = {}

    @classmethod
    def from_settings(cls, rollout, *, max_model_len: int = 0, seed: int = 0, say=None) -> VLLMGenerator:
        """rollout.vllm; the engine sized for ``max_model_len`` tokens (0: the model's limit)."""
        return cls(rollout.vllm, max_model_len=max_model_len or None, seed=seed, say=say)

    # ----------------------------------------------------------------------------- the engine

    def engine_for(self, model: torch.nn.Module):
        """The engine (LocalEngine, or ServerEngine in server mode), started from ``model``'s weights on
        first use; a server, started from its own --model, holds none of ours: the first rollout pushes
        them (with the probe check, which needs that rollout's first prompt)."""
        if self.llm is None:
            if self.settings.mode == "server":
                from grpokit.rollout.engines.vllm.remote import ServerEngine

                s = self.settings
                self.llm = ServerEngine(
                    s.server_url, timeout_s=s.server_timeout_s, weight_transfer=s.weight_transfer,
                    collective_port=s.collective_port, sync_timeout_s=s.sync_timeout_s,
                )  # fmt: skip
                self.say(f"vLLM server at {self.settings.server_url}: {self.llm.describe()}")
                self.adapter = self._pushes_adapter(model, self.llm.max_lora_rank)
            else:
                self.adapter = self._pushes_adapter(model, None)
                self.llm = self._start(model)
                # the engine holds the weights it started from; with the adapter apart, the first rollout pushes it
                self.pushed = None if self.adapter else version_of(model)
        return self.llm

    def _pushes_adapter(self, model: torch.nn.Module, server_rank: int | None) -> bool:
        """Whether each push sends the LoRA adapter alone (rollout.vllm.lora_push), decided once, when the engine
        starts (a colocated one then starts with LoRA) or is reached (a server: ``server_rank``, its
        --max-lora-rank). auto falls back to the merged weights with a notice saying why; adapter refuses."""
        how = self.settings.lora_push
        if how == "merged" or (how == "auto" and lora_config(model) is None):
            return False
        problem = adapter_problem(model)
        if problem is None and server_rank is not None and server_rank < lora_rank(model):
            problem = (
                f"the server at {self.settings.server_url} takes LoRA adapters up to rank {server_rank} (its "
                f"--max-lora-rank; 0: none), this one needs {lora_rank(model)}"
            )
        if problem is None:
            return True
        if how == "adapter":
            raise ConfigError(
                f"rollout.vllm.lora_push=adapter: {problem}. Set rollout.vllm.lora_push=merged (or auto) to push "
                "the merged weights instead."
            )
        if lora_config(model) is not None:
            self.say(f"vLLM: each push sends the merged weights, not the LoRA adapter alone: {problem}")
        return False

    def _start(self, model: torch.nn.Module) -> LocalEngine:
        from safetensors.torch import save_file

        cuda = next(model.parameters()).device.type == "cuda"
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        self.folder = Path(tempfile.mkdtemp(prefix="grpokit-vllm-"))
        weakref.finalize(self, shutil.rmtree, self.folder, True)  # removed with the generator at the latest
        base.config.save_pretrained(self.folder)
        start_weights = base_weights(model) if self.adapter else trainer_weights(model)  # the adapter apart
        state = {k: v.detach().cpu().contiguous() for k, v in start_weights.items()}
        save_file(state, str(self.folder / "model.safetensors"))
        self.base_pushed = base_version(model) if self.adapter else None
        dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
        length = self.settings.max_model_len or self.max_model_len
        limit = getattr(base.config, "max_position_embeddings", None)
        if length and limit:
            length = min(length, limit)
        s = self.settings
        llm = start_llm(
            self.folder, dtype=dtype, seed=self.seed, max_model_len=length, enforce_eager=s.enforce_eager,
            cpu_kv_cache_gib=s.cpu_kv_cache_gib, gpu_memory_utilization=s.gpu_memory_utilization, sleep=s.sleep,
            cuda=cuda, max_lora_rank=lora_rank(model) if self.adapter else 0,
        )  # fmt: skip
        return LocalEngine(llm, dtype)

    def release(self) -> bool:
        """Nothing to free on demand: the engine keeps its KV cache (rollout.vllm.sleep frees it on a GPU)."""
        return False

    def close(self) -> None:
        """Stop the engine (a server is left running: it was started apart) and remove its weights folder."""
        if self.llm is not None:
            self.llm.close()
        self.llm = None
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None

    # ----------------------------------------------------------------------------- weights

    def sync(self, model: torch.nn.Module, step: int) -> None:
        """Before training step ``step``'s rollout: push the trainer's weights if they changed and
        rollout.vllm.sync_every steps have passed since the last push; otherwise the rollout samples from
        the weights the engine holds (off-policy by ``step - pushed_step`` steps)."""
        self.engine_for(model)
        self.lagging = False
        self.stats.update(push_bytes=0, push_s=0.0)  # until a push before this step's rollout says otherwise
        if self.pushed_step is None:
            self.pushed_step = step
        if self.pushed is None:  # the engine holds none of the trainer's weights yet: generate pushes them
            self.stats["weight_lag"] = 0
            return
        now = version_of(model)
        changed = now != self.pushed
        # another model object than the one pushed is due at once: the lag sync_every allows is behind this model's
        # own updates, never another model's weights
        due = now[0] != self.pushed[0] or step - self.pushed_step >= self.settings.sync_every
        if changed and not due:
            self.lagging = True
        elif changed:
            self.push(model)
            self.pushed_step = step
        self.stats["weight_lag"] = step - self.pushed_step if self.lagging else 0

    def push(self, model: torch.nn.Module) -> None:
        """Hand the trainer's weights (or its LoRA adapter alone) to the engine, drop its prefix cache, check them.
        The transfer and the cache reset run under rollout.vllm.sync_timeout_s (WeightSyncTimeout past it)."""
        llm = self.engine_for(model)
        self._wake(["weights"])
        started = time.perf_counter()
        self.pushed = None  # until the checks pass: a failed push is pushed again by the next call
        where = self.settings.server_url if self.settings.mode == "server" else "in this process"
        what = f"weight push {self.pushes + 1} to the vLLM engine ({where})"
        sent = within(self.settings.sync_timeout_s, what, lambda: self._transfer(llm, model))
        self.stats.update(push_s=time.perf_counter() - started, push_bytes=sent)  # the transfer, before the checks
        self.pushes += 1
        self.check(model)
        self.probe(model)
        self.pushed = version_of(model)

    def _transfer(self, llm, model: torch.nn.Module) -> int:
        """The push itself; the bytes it sent. With the adapter apart: the base weights when they changed (a
        server's first push: it started from its own --model), then the adapter; else every weight, the adapter
        merged in. Then the tied LM head's refresh (when the base was sent) and the prefix cache reset."""
        sent, base_sent = 0, True
        if self.adapter:
            base_sent = base_version(model) != self.base_pushed
            if base_sent:
                weights = list(base_weights(model).items())
                self._reload(llm, weights)
                sent += weight_bytes(weights)
                self.base_pushed = base_version(model)
            adapter, config = adapter_weights(model)
            self._load_adapter(llm, adapter, config)
            sent += weight_bytes(adapter)
        else:
            weights = list(trainer_weights(model).items())
            self._reload(llm, weights)
            sent += weight_bytes(weights)
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        if base_sent and getattr(base.config, "tie_word_embeddings", False):
            llm.refresh_tied_head()
        llm.reset_prefix_cache()  # KV blocks of the old weights must not serve the next prompts
        return sent

    def _reload(self, llm, weights: list[tuple[str, Tensor]]) -> None:
        """The transfer of weights (a test replaces it to skip a sync)."""
        llm.load_weights(weights)

    def _load_adapter(self, llm, adapter: list[tuple[str, Tensor]], config: dict[str, Any]) -> None:
        """The transfer of the LoRA adapter (a test replaces it to skip a sync)."""
        llm.load_adapter(adapter, config)

    def check(self, model: torch.nn.Module) -> None:
        """WeightSyncError unless the engine's readable tensors equal the trainer's (rollout.vllm.check_weights)."""
        if not self.settings.check_weights:
            return
        ours = trainer_weights(model)
        engine = self.llm.readable()
        compared = 0
        for name, (shape, values) in engine.items():
            mine = ours.get(name)
            if mine is None or tuple(mine.shape) != shape:
                continue
            compared += 1
            if not torch.equal(fingerprint(mine.to(values.dtype)), values):
                raise WeightSyncError(
                    f"the vLLM engine's {name} is not the trainer's ({self.pushes} pushes so far): the engine "
                    "would sample from other weights than the ones being trained. A weight sync did not arrive "
                    "or was loaded wrongly; nothing was trained on its samples. (rollout.vllm.check_weights)"
                )
        if not compared:
            raise WeightSyncError(
                "no tensor of the vLLM engine could be compared with the trainer's (names or shapes differ): "
                "set rollout.vllm.check_weights=false to run unchecked"
            )

    def probe(self, model: torch.nn.Module) -> float | None:
        """The largest |engine - trainer| log-prob over a probe sequence (its first 64 tokens), scored by both at
        T = 1; WeightSyncError above the tolerance (1e-3 in float32, 0.1 in 16-bit). It sees what the tensor check
        cannot: weights vLLM keeps in packed copies. None before any prompt was seen or with
        rollout.vllm.check_weights off.

        Then the prefix cache: vLLM computes a prompt's log-probs afresh (such a request never reads its cache),
        so the probe also asks for the greedy token after the whole probe sequence (the first prompt sampled, up
        to PROBE_TOKENS), an ordinary request that reads the cache. The previous push's probe left the
        sequence's blocks there, so a push that did not reset the cache gives that token's log-prob from the old
        weights' keys and values (measured: 17-43 nats off on a 300-token prompt). A probe no longer than one KV
        block (16 tokens on a GPU, 128 on vLLM's CPU backend) cannot show it."""
        if not self.settings.check_weights or self.probe_ids is None:
            return None
        ids = self.probe_ids
        scored = ids[:64]
        # first the request that reads the cache: the one computed afresh may write its blocks there
        ((next_ids, next_lps),) = self.llm.sample([(list(ids), {"temperature": 0.0, "max_tokens": 1})])
        engine = torch.tensor(self.llm.prompt_logprobs(scored))  # (S-1,) not from the prefix cache
        was = model.training
        model.eval()
        with torch.no_grad():
            device = next(model.parameters()).device
            logits = model(input_ids=torch.tensor([ids], device=device)).logits[0].float()  # (L, V)
            logp = logits.log_softmax(-1)  # (L, V)
            targets = torch.tensor(scored[1:], device=device)[:, None]  # (S-1, 1)
            ours = logp[: len(scored) - 1].gather(-1, targets)[:, 0].cpu()  # (S-1,)
            ours_next = float(logp[-1, next_ids[0]])
        model.train(was)
        gap = float((engine - ours).abs().max())
        cached_gap = abs(next_lps[0] - ours_next)  # the greedy token after the probe, through the prefix cache
        dtype = next(model.parameters()).dtype
        full = dtype == torch.float32 and self.llm.dtype == "float32"  # a server may compute in another dtype
        tolerance = 1e-3 if full else 0.1
        self.stats["probe_gap"] = max(gap, cached_gap)
        precision = "float32" if full else "16-bit"
        if gap > tolerance:
            raise WeightSyncError(
                f"the vLLM engine's log-probs of a probe sequence are {gap:.3g} nats from the trainer's (tolerance "
                f"{tolerance:g}: {precision}) after push {self.pushes}: the engine computes "
                "with other weights than the trainer's (a weight it keeps apart was not updated). Nothing was "
                "trained on its samples. (rollout.vllm.check_weights)"
            )
        if cached_gap > tolerance:
            raise WeightSyncError(
                f"the vLLM engine's log-prob of the token after the probe sequence is {cached_gap:.3g} nats from the "
                f"trainer's (tolerance {tolerance:g}: {precision}) after push {self.pushes}, while the probe's own "
                "log-probs, computed afresh, agree: the engine's prefix cache holds KV blocks of older weights (a "
                "push that did not reset it). Nothing was trained on its samples. (rollout.vllm.check_weights)"
            )
        return max(gap, cached_gap)

    def _wake(self, tags: list[str]) -> None:
        if self.settings.sleep and torch.cuda.is_available() and self.llm is not None:
            self.llm.wake_up(tags)

    def _sleep(self) -> None:
        if self.settings.sleep and torch.cuda.is_available() and self.llm is not None:
            self.llm.sleep()

    # ----------------------------------------------------------------------------- sampling

    @torch.no_grad()
    def sample(self, model: torch.nn.Module, prompt_ids: list[list[int]], params: SamplingParams) -> Rollout:
        llm = self.engine_for(model)
        if self.probe_ids is None:
            self.probe_ids = list(prompt_ids[0][:PROBE_TOKENS]) if len(prompt_ids[0]) >= 2 else None
        if self.lagging:
            self.lagging = False  # this rollout is the one sync() allowed to lag
        elif version_of(model) != self.pushed:
            self.push(model)  # evaluation and sampling always see the current weights
        else:
            self._wake(["weights"])
        self._wake(["kv_cache"])
        G = params.group_size
        base_seed = 0 if params.seed is None else params.seed
        requests = []  # (prompt, vLLM's SamplingParams arguments): one request per completion, its own seed
        for i, prompt in enumerate(prompt_ids):
            for j in range(G):
                seed = (base_seed * 1_000_003 + i * G + j) % SEED_SPACE
                requests.append((list(prompt), request_params(params, seed)))
        completions = llm.sample(requests)  # (N,) prompt-major, as requested
        self._sleep()
        N, Lc = len(completions), max(1, max(len(tokens) for tokens, _ in completions))
        ids = torch.full((N, Lc), params.pad_token_id, dtype=torch.long)
        mask = torch.zeros((N, Lc), dtype=torch.long)
        logprobs = torch.zeros((N, Lc), dtype=torch.float32)
        truncated = torch.zeros(N, dtype=torch.bool)
        eos = set(params.eos_token_ids)
        for r, (tokens, token_logprobs) in enumerate(completions):
            ids[r, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
            mask[r, : len(tokens)] = 1
            logprobs[r, : len(tokens)] = torch.tensor(token_logprobs, dtype=torch.float32)
            truncated[r] = params.ignore_eos or not tokens or tokens[-1] not in eos
        p_ids, p_mask = left_pad(prompt_ids, params.pad_token_id)  # (P, Lp)
        self.stats.update(engine="vllm", pushes=self.pushes)
        return Rollout(
            prompt_ids=p_ids.repeat_interleave(G, dim=0),
            prompt_mask=p_mask.repeat_interleave(G, dim=0),
            completion_ids=ids,
            completion_mask=mask,
            logprobs=logprobs,
            truncated=truncated,
        )
