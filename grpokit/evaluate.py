"""Held-out evaluation: greedy pass@1 and sampled mean@k, scored by the accuracy reward."""

from __future__ import annotations

import torch

from grpokit.config import DataConfig
from grpokit.data import reward_columns
from grpokit.rewards import RewardRunner
from grpokit.templates import encode_prompts


@torch.no_grad()
def evaluate(
    model,
    tokenizer,
    rows: list[dict],
    *,
    accuracy_fn,
    generator,
    data_cfg: DataConfig,
    eos_token_ids: list[int],
    num_samples: int = 4,
    temperature: float = 1.0,
    max_new_tokens: int = 256,
    seed: int = 0,
    batch_prompts: int = 64,
    examples: list[dict] | None = None,
) -> dict[str, float]:
    """accuracy = greedy pass@1 (share of prompts whose greedy completion scores 1);
    mean_at_k = mean score of ``num_samples`` sampled completions per prompt (0 = skipped).
    ``examples``, when given, receives the first greedy {prompt, completion, score}."""
    if not rows:
        raise ValueError("evaluate: no rows to evaluate on")
    model.eval()
    prompts = [row[data_cfg.prompt_column] for row in rows]
    encoded = encode_prompts(
        prompts,
        tokenizer,
        template=data_cfg.template,
        system_prompt=data_cfg.system_prompt,
        max_prompt_tokens=data_cfg.max_prompt_tokens,
    )
    runner = RewardRunner([("accuracy", accuracy_fn, 1.0)])

    def run(group_size: int, temp: float) -> tuple[list[float], list[int]]:
        scores, lengths = [], []
        for start in range(0, len(rows), batch_prompts):
            chunk = list(range(start, min(start + batch_prompts, len(rows))))
            out = generator.generate(
                model,
                [encoded[i] for i in chunk],
                group_size=group_size,
                max_new_tokens=max_new_tokens,
                temperature=temp,
                eos_token_ids=eos_token_ids,
                pad_token_id=tokenizer.pad_token_id,
                seed=seed + start,
            )
            expanded = [rows[i] for i in chunk for _ in range(group_size)]
            columns = reward_columns(expanded, data_cfg.prompt_column)
            texts = out.decode(tokenizer)
            result = runner([r[data_cfg.prompt_column] for r in expanded], texts, columns)
            if examples is not None and not examples:
                score = result.per_function["accuracy"][0]
                examples.append({"prompt": expanded[0][data_cfg.prompt_column], "completion": texts[0], "score": score})
            scores += [float(v) if v is not None else 0.0 for v in result.per_function["accuracy"]]
            lengths += out.completion_mask.sum(1).tolist()
        return scores, lengths

    greedy, greedy_len = run(1, 0.0)
    metrics = {
        "accuracy": sum(s >= 1.0 - 1e-6 for s in greedy) / len(greedy),
        "greedy_score": sum(greedy) / len(greedy),
        "completion_len/mean": sum(greedy_len) / len(greedy_len),
        "num_examples": float(len(rows)),
    }
    if num_samples > 0:
        sampled, _ = run(num_samples, temperature)
        metrics[f"mean_at_{num_samples}"] = sum(sampled) / len(sampled)
        per_prompt = [sampled[i : i + num_samples] for i in range(0, len(sampled), num_samples)]
        metrics[f"pass_at_{num_samples}"] = sum(any(s >= 1.0 - 1e-6 for s in p) for p in per_prompt) / len(
            per_prompt
        )
    return metrics
