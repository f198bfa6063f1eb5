"""A vLLM engine in this process: how it is started (colocated, and by ``grpokit vllm-serve``) and the calls the
generator makes on it (:class:`LocalEngine`; grpokit.rollout.engines.vllm.remote.ServerEngine makes the same
calls over HTTP)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from grpokit.config.checks import VLLM_INSTALL
from grpokit.rollout.engines.vllm.errors import WeightSyncError
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
    max_lora_rank: int = 0,
):
    """A vLLM engine in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) of the model in ``folder``
    (config.json and safetensors; its tokenizer is not read: token ids in, token ids out). The colocated
    generator and ``grpokit vllm-serve`` both start theirs here. ``max_lora_rank`` > 0: with vLLM's LoRA support,
    for one adapter of at most that rank (LocalEngine.load_adapter)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process
    if not cuda:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(cpu_kv_cache_gib))
    from vllm import LLM

    extra: dict[str, Any] = {}
    if cuda:
        extra["gpu_memory_utilization"] = gpu_memory_utilization
        extra["enable_sleep_mode"] = sleep
    if max_lora_rank:
        extra.update(enable_lora=True, max_lora_rank=max_lora_rank, max_loras=1)
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

    ADAPTER = "grpokit-policy"
    """The name (and id 1) of the one adapter an engine with LoRA holds: each push replaces it in place."""

    def __init__(self, llm, dtype: str):
        self.llm, self.dtype = llm, dtype
        self.lora: Any = None  # the LoRARequest every request carries once an adapter was pushed (None: none)
        self.adapter_folder: Path | None = None  # where the adapter pushed last is written for vLLM to read

    def sample(self, requests: list[tuple[list[int], dict[str, Any]]]) -> list[tuple[list[int], list[float]]]:
        """One completion per (prompt token ids, SamplingParams arguments) request, in order: its token ids
        and each sampled token's log-prob."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        prompts = [TokensPrompt(prompt_token_ids=list(ids)) for ids, _ in requests]
        params = [SamplingParams(n=1, logprobs=0, detokenize=False, **kw) for _, kw in requests]
        outputs = self.llm.generate(prompts, params, use_tqdm=False, lora_request=self.lora)
        completions = [out.outputs[0] for out in outputs]
        return [
            (list(c.token_ids), [step[tok].logprob for step, tok in zip(c.logprobs, c.token_ids)])
            for c in completions
        ]

    def load_weights(self, weights: list[tuple[str, Tensor]]) -> None:
        """vLLM's reload_weights on the worker, the tensors handed over in this process. The adapter pushed before
        (if any) no longer applies: the weights come alone (merged, or a base the next load_adapter completes)."""
        self.lora = None
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})

    def load_adapter(self, weights: list[tuple[str, Tensor]], config: dict[str, Any]) -> None:
        """The LoRA adapter ``weights`` (PEFT's names) with its adapter_config ``config``, in place of the one before
        (vLLM's add_lora with load_inplace: it reads the adapter from a folder, written here); every later request
        applies it. The engine must have started with max_lora_rank >= its rank."""
        import json
        import tempfile

        from safetensors.torch import save_file
        from vllm.lora.request import LoRARequest

        if self.adapter_folder is None:
            self.adapter_folder = Path(tempfile.mkdtemp(prefix="grpokit-vllm-adapter-"))
        state = {name: t.detach().cpu().contiguous() for name, t in weights}
        save_file(state, str(self.adapter_folder / "adapter_model.safetensors"))
        (self.adapter_folder / "adapter_config.json").write_text(json.dumps(config))
        folder = str(self.adapter_folder)
        if not self.llm.llm_engine.add_lora(LoRARequest(self.ADAPTER, 1, folder, load_inplace=True)):
            raise WeightSyncError(f"the vLLM engine did not take the LoRA adapter written to {folder}")
        self.lora = LoRARequest(self.ADAPTER, 1, folder)

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
        prompt = [TokensPrompt(prompt_token_ids=list(ids))]
        (out,) = self.llm.generate(prompt, params, use_tqdm=False, lora_request=self.lora)
        return [step[tok].logprob for step, tok in zip(out.prompt_logprobs[1:], ids[1:])]

    def wake_up(self, tags: list[str]) -> None:
        self.llm.wake_up(tags=tags)

    def sleep(self) -> None:
        self.llm.sleep(level=1)

    def close(self) -> None:
        self.llm = None
        if self.adapter_folder is not None:
            shutil.rmtree(self.adapter_folder, ignore_errors=True)
            self.adapter_folder = None
