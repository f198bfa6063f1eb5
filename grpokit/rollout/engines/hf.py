"""The hf engine (``rollout.engine: hf``): transformers' ``model.generate``, the slow, simple reference the
other engines are tested against."""

from __future__ import annotations

import contextlib

import torch

from grpokit.rollout.engines.base import (
    Engine,
    Rollout,
    SamplingParams,
    completion_mask_from_ids,
    eval_mode,
    left_pad,
    model_device,
)


class HFGenerator(Engine):
    """Reference path: ``model.generate`` with an explicit GenerationConfig, log-probs from the scores it drew
    each token from (transformers' processors: repetition penalty, temperature, top-k, top-p, min-p).

    The prompts are repeated G times before the call (prefill cost G times per prompt). Sampling
    settings stored in the model's own generation_config (min length, ...) are not applied: only the
    arguments given here are.
    """

    name = "hf"

    @torch.no_grad()
    def sample(self, model: torch.nn.Module, prompt_ids: list[list[int]], params: SamplingParams) -> Rollout:
        from transformers import GenerationConfig

        device = model_device(model)
        p_ids, p_mask = left_pad(prompt_ids, params.pad_token_id, device)  # (P, Lp)
        p_ids = p_ids.repeat_interleave(params.group_size, dim=0)  # (N, Lp)
        p_mask = p_mask.repeat_interleave(params.group_size, dim=0)  # (N, Lp)
        do_sample = params.temperature > 0
        stop_ids = list(params.eos_token_ids)
        if params.ignore_eos:  # generate() stops on an eos id: give it one no token has (the logits' width)
            head = model.get_output_embeddings()
            stop_ids = [int(head.weight.shape[0]) if head is not None else int(model.config.vocab_size)]
        config = GenerationConfig(
            max_new_tokens=params.max_new_tokens,
            do_sample=do_sample,
            temperature=params.temperature if do_sample else None,
            top_k=params.top_k
            if do_sample
            else None,  # 0 said: transformers 5 samples with top_k=50 when it is None
            top_p=params.top_p if do_sample and params.top_p < 1 else None,
            min_p=params.min_p if do_sample and params.min_p > 0 else None,
            repetition_penalty=float(params.repetition_penalty) if params.repetition_penalty != 1 else None,
            eos_token_id=stop_ids,
            pad_token_id=params.pad_token_id,
            return_dict_in_generate=True,
            output_scores=True,
        )
        rng = contextlib.nullcontext()
        if params.seed is not None:
            rng = torch.random.fork_rng(devices=[device] if device.type == "cuda" else [])
        with eval_mode(model), rng:
            if params.seed is not None:
                torch.manual_seed(params.seed)
            out = model.generate(input_ids=p_ids, attention_mask=p_mask, generation_config=config)
        completion_ids = out.sequences[:, p_ids.shape[1] :]  # (N, Lc)
        # the scores each token was drawn from: penalised, divided by T, filtered (-inf outside the kept set)
        scores = torch.stack(out.scores, dim=1).float()  # (N, Lc, V)
        logprobs = scores.log_softmax(-1).gather(-1, completion_ids[..., None]).squeeze(-1)  # (N, Lc)
        mask, truncated = completion_mask_from_ids(completion_ids, stop_ids)  # (N, Lc), (N,)
        completion_ids = completion_ids.masked_fill(mask == 0, params.pad_token_id)
        return Rollout(
            prompt_ids=p_ids,
            prompt_mask=p_mask,
            completion_ids=completion_ids,
            completion_mask=mask,
            logprobs=logprobs.masked_fill(mask == 0, 0.0),  # padding after an EOS may be outside the kept set
            truncated=truncated,
        ).to_host()
