"""Held-out evaluation: greedy pass@1, and over k sampled completions per prompt mean@k, pass@k and maj@k,
scored by the accuracy reward.

maj@k (majority voting, "self-consistency", Wang et al. 2022, arXiv 2203.11171): each of the k sampled
completions votes for its final answer as the accuracy reward reads it (``voted_answers``: the function's
``answer_of``, else the ``answer_parsed`` column it logs, as TRL's accuracy_reward does, else the math
verifier's extraction ``grpokit.rewards.accuracy.extract_answers``: <answer> tags, \\boxed{}, "#### n",
"the answer is ...").
Answers that are the same number count as one ("0.5", "1/2" and "\\frac{1}{2}"); others must match once
normalised. The most common answer wins, a tie going to the answer given first; the prompt counts as
solved when a completion giving that answer scores 1. A completion with no extractable answer (or
malformed answer tags) does not vote; a prompt where no completion gives one counts as not solved.
``maj_at_k/no_answer`` reports the share of sampled completions that did not vote: with a reward whose
task has no extractable final answer (code, free text) it is near 1 and maj@k means nothing.

Worked example, k = 4, gold 12: answers "12", "\\boxed{12}", "13", (none) -> votes {12: 2, 13: 1};
the majority answer 12 scores 1, so the prompt counts as solved; no_answer adds 1/4 for it.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Hashable, Sequence

import torch

from grpokit.config.schema import DataConfig
from grpokit.data.prompts import reward_columns
from grpokit.data.templates import encode_prompts
from grpokit.rewards import RewardRunner
from grpokit.rollout.engines.base import SamplingParams
from grpokit.scoring.completions import as_completions
from grpokit.scoring.runner import TrainerState


def final_answer(completion: str) -> Hashable | None:
    """The answer a completion votes for in maj@k, or None when it has none (see the module docstring).

    ``final_answer("so \\boxed{0.5}") == final_answer("#### 1/2")``; several different candidates in one
    completion vote as that tuple of answers (the verifier scores such a completion 0 unless all match)."""
    from grpokit.rewards.accuracy import MALFORMED, as_number, extract_answers, normalize

    keys: list[Hashable] = []
    for candidate in extract_answers(completion):
        if candidate == MALFORMED:
            return None
        text = normalize(candidate)
        if not text:
            continue
        number = as_number(text)
        key = number[0] if number is not None else text  # the Fraction: "0.5" and "1/2" are one answer
        if key not in keys:
            keys.append(key)
    if not keys:
        return None
    return keys[0] if len(keys) == 1 else tuple(keys)


class EvalProgress:
    """Progress lines of an evaluation, given to ``say`` (stderr: the run's notices or the eval command's),
    never to the results: after a chunk of prompts, at most one line every ``every_s`` seconds, and the
    last chunk of each phase always::

        eval: greedy 64/200 prompts (12 s)
        eval: 4 samples each 200/200 prompts (95 s)
    """

    def __init__(
        self, say: Callable[[str], None], total: int, *, unit: str = "prompts", every_s: float = 10.0
    ):
        self.say, self.total, self.unit, self.every_s = say, total, unit, every_s
        self.start = self.last = time.monotonic()

    def __call__(self, phase: str, done: int) -> None:
        now = time.monotonic()
        if done < self.total and now - self.last < self.every_s:
            return
        self.last = now
        self.say(f"eval: {phase} {done}/{self.total} {self.unit} ({now - self.start:.0f} s)")


UNPARSEABLE = ("", "[unparseable]", "[]")
"""What TRL's accuracy_reward logs as answer_parsed when it found no answer."""


def voted_answers(accuracy_fn: Callable, texts: Sequence[str], logged: dict[str, list]) -> list[Hashable | None]:
    """What each completion votes for in maj@k: what the accuracy reward extracts, never another reader.

    In order: the function's own ``answer_of(text)`` when it has one; else the ``answer_parsed`` column it
    logs with log_extra (TRL's accuracy_reward does, "[unparseable]" when none); else the math verifier's
    extraction (``final_answer``, what grpokit's math_accuracy reads)."""
    answer_of = getattr(accuracy_fn, "answer_of", None)
    if callable(answer_of):
        return [answer_of(t) for t in texts]
    parsed = logged.get("answer_parsed")
    if parsed is not None and len(parsed) == len(texts):
        return [None if a is None or str(a) in UNPARSEABLE else str(a) for a in parsed]
    return [final_answer(t if isinstance(t, str) else str(t)) for t in texts]


def majority_vote(answers: Sequence[Hashable | None], scores: Sequence[float]) -> float:
    """The score of the majority answer among one prompt's completions: the most common non-None answer,
    a tie going to the one that appears first; 0.0 when no completion has an answer.

    ``majority_vote(["12", "13", "12", None], [1, 0, 1, 0]) == 1.0``."""
    votes = Counter(a for a in answers if a is not None)
    if not votes:
        return 0.0
    most = max(votes.values())
    winner = next(a for a in answers if a is not None and votes[a] == most)  # first-seen among the tied
    return float(next(s for a, s in zip(answers, scores) if a == winner))


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
    repetition_penalty: float = 1.0,
    max_new_tokens: int = 256,
    seed: int = 0,
    batch_prompts: int = 64,
    examples: list[dict] | None = None,
    split=None,
    extra_rewards: Sequence[tuple[str, Callable]] = (),
    progress: Callable[[str], None] | None = None,
    stop_strings=None,
) -> dict[str, float]:
    """accuracy = greedy pass@1 (share of prompts whose greedy completion scores 1). With k =
    ``num_samples`` sampled completions per prompt (0 = skipped): mean_at_k = their mean score,
    pass_at_k = share of prompts with at least one scoring 1, maj_at_k = share whose majority answer
    scores 1 (module docstring), maj_at_k/no_answer = share of completions with no answer to vote.
    ``examples``, when given, receives the first greedy {prompt, completion, score}. ``split`` (under
    torchrun, a grpokit.train.distributed.Distributed): each rank runs a contiguous block of the chunks of
    ``batch_prompts`` rows, with the chunks' own seeds, and the results are gathered: the same numbers
    as one process. ``extra_rewards`` [(name, fn)] also score the greedy completions (R1's format and
    language scores beside accuracy): ``greedy/<name>`` is the mean of the values that apply (not None).
    ``repetition_penalty`` applies to the greedy and the sampled completions (rollout.repetition_penalty); the
    truncation filters (top_p, top_k, min_p) do not: evaluation reads the model's distribution at the temperature.
    ``progress`` (a line printer, e.g. stderr) gets :class:`EvalProgress` lines as chunks finish (under
    torchrun: this rank's rows). ``stop_strings`` (grpokit.rollout.engines.stop.StopStrings, rollout.stop) end the
    greedy and sampled completions as they end the training rollouts."""
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
        chat_template_kwargs=getattr(data_cfg, "chat_template_kwargs", None),
    )
    runner = RewardRunner([("accuracy", accuracy_fn, 1.0), *((name, fn, 0.0) for name, fn in extra_rewards)])
    extra: dict[str, list] = {name: [] for name, _ in extra_rewards}  # greedy values per extra reward

    starts = list(range(0, len(rows), batch_prompts))
    if split is not None:  # a contiguous block of chunks per rank, gathered in rank order below
        per_rank = -(-len(starts) // split.world)
        starts = starts[split.rank * per_rank : (split.rank + 1) * per_rank]
    mine = sum(min(batch_prompts, len(rows) - start) for start in starts)  # this rank's prompts
    shown = EvalProgress(progress, mine) if progress is not None and mine else None

    common = SamplingParams(
        group_size=1, max_new_tokens=max_new_tokens, temperature=0.0, repetition_penalty=repetition_penalty,
        eos_token_ids=eos_token_ids, pad_token_id=tokenizer.pad_token_id, stop_strings=stop_strings,
    )  # fmt: skip

    def run(group_size: int, temp: float) -> tuple[list[float], list[int], list[str], list]:
        scores, lengths, all_texts, answers = [], [], [], []
        phase, done = ("greedy" if temp == 0 else f"{group_size} samples each"), 0
        for start in starts:
            chunk = list(range(start, min(start + batch_prompts, len(rows))))
            params = SamplingParams.of(common, group_size=group_size, temperature=temp, seed=seed + start)
            out = generator.generate(model, [encoded[i] for i in chunk], params)
            expanded = [rows[i] for i in chunk for _ in range(group_size)]
            columns = reward_columns(expanded, data_cfg.prompt_column)
            columns["completion_ids"] = out.completion_token_ids()
            texts = out.decode(tokenizer, columns["completion_ids"])
            columns["trainer_state"] = TrainerState()
            prompts_here = [r[data_cfg.prompt_column] for r in expanded]
            completions = as_completions(prompts_here, texts)  # messages for chat prompts, as in training
            result = runner(prompts_here, completions, columns)
            # a failed row scores 0; a function failing on every row stops the evaluation
            problem = result.failure(1.0, prompts_here, completions)
            if problem:
                raise ValueError(f"evaluation: {problem}")
            if examples is not None and not examples:
                score = result.per_function["accuracy"][0]
                examples.append(
                    {"prompt": expanded[0][data_cfg.prompt_column], "completion": texts[0], "score": score}
                )
            scores += [float(v) if v is not None else 0.0 for v in result.per_function["accuracy"]]
            if temp == 0:
                for name in extra:
                    extra[name] += result.per_function[name]
            lengths += out.completion_mask.sum(1).tolist()
            all_texts += [t if isinstance(t, str) else str(t) for t in texts]
            answers += voted_answers(accuracy_fn, texts, result.extra) if temp > 0 else [None] * len(texts)
            done += len(chunk)
            if shown is not None:
                shown(phase, done)
        if split is not None:
            parts = split.gather((scores, lengths, all_texts, answers))
            scores, lengths, all_texts, answers = ([x for p in parts for x in p[i]] for i in range(4))
            if examples is not None and not examples and scores:  # the first row ran on another rank
                examples.append({"prompt": prompts[0], "completion": all_texts[0], "score": scores[0]})
        return scores, lengths, all_texts, answers

    greedy, greedy_len, _, _ = run(1, 0.0)
    metrics = {
        "accuracy": sum(s >= 1.0 - 1e-6 for s in greedy) / len(greedy),
        "greedy_score": sum(greedy) / len(greedy),
        "completion_len/mean": sum(greedy_len) / len(greedy_len),
        "num_examples": float(len(rows)),
    }
    for name, values in extra.items():  # under torchrun rank 0's share (the pipeline runs one process)
        applicable = [float(v) for v in values if v is not None]
        if applicable:
            metrics[f"greedy/{name}"] = sum(applicable) / len(applicable)
    if num_samples > 0:
        k = num_samples
        sampled, _, texts, answers = run(k, temperature)
        metrics[f"mean_at_{k}"] = sum(sampled) / len(sampled)
        per_prompt = [sampled[i : i + k] for i in range(0, len(sampled), k)]
        metrics[f"pass_at_{k}"] = sum(any(s >= 1.0 - 1e-6 for s in p) for p in per_prompt) / len(per_prompt)
        majority = [majority_vote(answers[i : i + k], sampled[i : i + k]) for i in range(0, len(sampled), k)]
        metrics[f"maj_at_{k}"] = sum(m >= 1.0 - 1e-6 for m in majority) / len(majority)
        metrics[f"maj_at_{k}/no_answer"] = sum(a is None for a in answers) / len(answers)
    return metrics
