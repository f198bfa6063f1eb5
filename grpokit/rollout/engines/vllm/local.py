"""A vLLM engine in this process: how it is started (colocated, and by ``grpokit vllm-serve``) and the calls the
generator makes on it (:class:`LocalEngine`; grpokit.rollout.engines.vllm.remote.ServerEngine makes the same
calls over HTTP)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from grpokit.config.checks import VLLM_INSTALL
from grpokit.rollout.engines.vllm.weights import fingerprint


def vllm_missing() -> str | None:
    """None when vLLM imports, else why not (and how to install it)."""
    try:
        from vllm import LLM, SamplingParams  # noqa: F401 (a folder named vllm on the path imports as an empty package)
    except Exception as e:  # ImportError, or a broken install failing inside its own imports
        return f"rollout.engine=vllm needs vLLM, which does not import here ({type(e).__name__}: {e}). {VLLM_INSTALL}"
    return None


def _readable_tensors(model: torch.nn.Module) -> dict[str, tuple[tuple[int, ...], Tensor]]:
    """Run inside the engine (``LLM.apply_model``): the fingerprint of every parameter that holds values."""
    return {
        name: (tuple(p.shape), fingerprint(p))
        for name, p in model.named_parameters()
        if p.numel() > 0 and ("embed" in name or "norm" in name or "lm_head" in name)
    }


def _refresh_tied_head(model: torch.nn.Module) -> bool:
    """Run inside the engine after a push: an LM head tied to the embedding gets no weights of its own in a
    reload, so on CPU the GEMM copy vLLM packed from it at load time stays old (measured: 0.8 nats off after
    one step); rebuilding it from the (updated, shared) embedding fixes that. False when there is none."""
    head, embed = getattr(model, "lm_head", None), getattr(getattr(model, "model", None), "embed_tokens", None)
    method = getattr(head, "quant_method", None)
    if head is None or embed is None or method is None:
        return False
    head.weight = embed.weight
    method.process_weights_after_loading(head)
    return True


def start_llm(
    folder: str | Path,
    *,
    dtype: str,
    seed: int,
    max_model_len: int | None,
    enforce_eager: bool | None,
    cpu_kv_cache_gib: int,
    gpu_memory_utilization: float,
    sleep: bool,
    cuda: bool,
):
    """A vLLM engine in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) of the model in ``folder``
    (config.json and safetensors; its tokenizer is not read: token ids in, token ids out). The colocated
    generator and ``grpokit vllm-serve`` both start theirs here."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process
    if not cuda:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(cpu_kv_cache_gib))
    from vllm import LLM

    extra: dict[str, Any] = {}
    if cuda:
        extra["gpu_memory_utilization"] = gpu_memory_utilization
        extra["enable_sleep_mode"] = sleep
    return LLM(
        model=str(folder),
        dtype=dtype,
        enforce_eager=enforce_eager if enforce_eager is not None else not cuda,
        max_model_len=max_model_len or None,
        seed=seed,
        skip_tokenizer_init=True,  # token ids in, token ids out
        logprobs_mode="processed_logprobs",  # log_softmax(logits / T), see the module docstring
        generation_config="vllm",  # the model's generation_config.json sets no sampling default
        enable_prefix_caching=True,
        **extra,
    )


class LocalEngine:
    """The calls the generator makes on a vLLM engine, on one in this process (``llm``, a ``vllm.LLM``).
    grpokit.rollout.engines.vllm.remote.ServerEngine makes the same calls over HTTP to ``grpokit vllm-serve``, which
    serves them with one of these."""

    def __init__(self, llm, dtype: str):
        self.llm, self.dtype = llm, dtype

    def sample(self, requests: list[tuple[list[int], dict[str, Any]]]) -> list[tuple[list[int], list[float]]]:
        """One completion per (prompt token ids, SamplingParams arguments) request, in order: its token ids
        and each sampled token's log-prob."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        prompts = [TokensPrompt(prompt_token_ids=list(ids)) for ids, _ in requests]
        params = [SamplingParams(n=1, logprobs=0, detokenize=False, **kw) for _, kw in requests]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        completions = [out.outputs[0] for out in outputs]
        return [
            (list(c.token_ids), [step[tok].logprob for step, tok in zip(c.logprobs, c.token_ids)])
            for c in completions
        ]

    def load_weights(self, weights: list[tuple[str, Tensor]]) -> None:
        """vLLM's reload_weights on the worker, the tensors handed over in this process."""
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})

    def refresh_tied_head(self) -> None:
        self.llm.apply_model(_refresh_tied_head)

    def reset_prefix_cache(self) -> None:
        self.llm.reset_prefix_cache()

    def readable(self) -> dict[str, tuple[tuple[int, ...], Tensor]]:
        """The fingerprint of every tensor the engine keeps readable (_readable_tensors)."""
        (tensors,) = self.llm.apply_model(_readable_tensors)
        return tensors

    def prompt_logprobs(self, ids: list[int]) -> list[float]:
        """log p(ids[t] | ids[:t]) for t >= 1, at T = 1."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
        (out,) = self.llm.generate([TokensPrompt(prompt_token_ids=list(ids))], params, use_tqdm=False)
        return [step[tok].logprob for step, tok in zip(out.prompt_logprobs[1:], ids[1:])]

    def wake_up(self, tags: list[str]) -> None:
        self.llm.wake_up(tags=tags)

    def sleep(self) -> None:
        self.llm.sleep(level=1)

    def close(self) -> None:
        self.llm = None
