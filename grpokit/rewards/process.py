"""Process rewards: reward functions that score each step of a completion, and how the trainer uses them.

The contract. A reward function marked `step_rewards = True` (an attribute, like `per_completion`)
is called as any other (TRL's convention, see `grpokit.scoring.runner`) but returns, per completion,
its steps as a list of `(char_end, score)` pairs, or None (not applicable):

    def steps_ok(prompts, completions, **kw):            # one step per line, scored by some rule
        out = []
        for text in completions:
            ends = step_ends(text, "\\n")                 # [6, 13, 20]: where each step's text ends
            out.append([(end, float(rule(text[:end]))) for end in ends])
        return out
    steps_ok.step_rewards = True

- `char_end` is the exclusive end of the step in the completion's text (the string, or the content
  of the assistant message for chat prompts): step k is text[char_end_{k-1}:char_end_k]. The ends are
  integers, strictly ascending, within 1..len(text); scores are finite numbers. A list that breaks
  this fails that completion, as a bad value does (named in the error: "step 2 ends at character 57,
  beyond the completion's 40 characters"); the run then stops as for any reward failure.
- An empty list means the completion has no steps (nothing to score): like None.
- The sequence-level value of a process reward (reward/<name>/mean, reward/total, accuracy, dynamic
  sampling, the flat-rewards check) is the score of the LAST step: the step that ends the answer.

What the trainer does with them (`step_rewards_of`). Each char_end becomes the index of the
completion token that holds the step's last character, found by decoding prefixes of the completion's
token ids (binary search, then checked: the decoded prefix must start with the text up to char_end,
so the mapping is exact for any tokenizer; steps ending inside the same token get the same index).
Scores are multiplied by the entry's weight. The weighted total of the other (outcome) reward
functions of non-zero weight, when there are any, is one more step ending at the completion's last
token (its EOS); a weight-0 function (e.g. one kept for train.accuracy_reward) adds no step.
The result, per completion [(t_end, score)], travels in `ScoredBatch.step_rewards` to
`compute_advantages(step_rewards=...)`; the `grpo_process` preset's estimator (process_group,
grpokit.algos.process) needs it, and asking for it without a process reward is a ConfigError.

Built in: `process_reward_model` (a Math-Shepherd-style PRM, grpokit.rewards.reward_model) and
`step_ends` for splitting a completion at a separator.
"""

from __future__ import annotations

from collections.abc import Callable

from grpokit.scoring.steps import check_char_steps as check_char_steps  # the contract's parts, here too
from grpokit.scoring.steps import is_process_reward as is_process_reward
from grpokit.scoring.steps import step_outcome as step_outcome


def reads_step_rewards(estimator: str) -> bool:
    """The advantage estimator ``estimator`` (a name or alias) reads step rewards: it was registered so
    (grpokit.algos.advantages, step_rewards=True: process_group), and choosing it needs a process reward function.
    A "module:function" of your own is not imported to say: False."""
    from grpokit.algos.advantages import estimator as entry
    from grpokit.algos.advantages import user_defined

    return not user_defined(estimator) and entry(estimator).step_rewards


def step_ends(text: str, separator: str = "\n") -> list[int]:
    """Exclusive end offsets of the steps of `text` split after each `separator` (the separator belongs
    to the step it ends); a last step without a separator ends at len(text); blank steps (only
    whitespace) are skipped. "a\\nb\\n" -> [2, 4]; "a\\nb" -> [2, 3]; "a\\n\\nb" with "\\n" -> [2, 4]."""
    if not separator:
        raise ValueError("the step separator must not be empty")
    ends, start = [], 0
    while start < len(text):
        at = text.find(separator, start)
        end = len(text) if at < 0 else at + len(separator)
        if text[start:end].strip():
            ends.append(end)
        elif ends and at >= 0:  # a blank step: its separator joins the step before
            ends[-1] = end
        start = end
    return ends


def token_step_ends(
    tokenizer, ids: list[int], text: str, steps: list[tuple[int, float]]
) -> list[tuple[int, float]]:
    """[(t_end, score)]: each step's char_end mapped to the index in `ids` of the token holding the
    step's last character, where `text` = tokenizer.decode(ids, skip_special_tokens=True).

    For each end e: the smallest k with len(decode(ids[:k])) >= e (binary search over k, the prefix
    length grows with k), then moved on while decode(ids[:k]) does not start with text[:e] (a byte-level
    token cut in the middle of a character decodes to U+FFFD); t_end = k - 1.
    """
    cache: dict[int, str] = {}

    def prefix(k: int) -> str:
        if k not in cache:
            cache[k] = tokenizer.decode(ids[:k], skip_special_tokens=True)
        return cache[k]

    out: list[tuple[int, float]] = []
    low = 1
    for end, score in steps:
        lo, hi = low, len(ids)
        while lo < hi:
            mid = (lo + hi) // 2
            if len(prefix(mid)) >= end:
                hi = mid
            else:
                lo = mid + 1
        k = lo
        while k < len(ids) and not prefix(k).startswith(text[:end]):
            k += 1
        out.append((k - 1, score))
        low = k
    return out


def step_rewards_of(
    algo,
    functions: list[tuple[str, Callable, float]],
    result,
    tokenizer,
    completion_ids: list[list[int]],
    texts: list[str],
):
    """Per completion its steps [(t_end, weighted score)] sorted by t_end, for the trainer's ScoredBatch,
    or None when no function is a process reward. `result`: the RewardRunner's RewardResult (its `steps`
    in characters, its `per_function`); `completion_ids` / `texts`: each completion's token ids and its
    text as `tokenizer` decoded them for the reward functions. The other functions' weighted total is one
    more step at the last token (see the module docstring). Mapped only when the estimator may read them
    (a process one, or your own); the trainer has checked the setup (check_process_setup) when built."""
    from grpokit.algos.advantages import user_defined

    process = [(name, w) for name, fn, w in functions if is_process_reward(fn)]
    estimator = algo.advantage.estimator
    if not process or (not user_defined(estimator) and not reads_step_rewards(estimator)):
        return None  # a built-in outcome estimator reads no steps: no need to map them
    outcome = [(name, w) for name, fn, w in functions if not is_process_reward(fn) and w != 0]
    out = []
    for i, (ids, text) in enumerate(zip(completion_ids, texts)):
        steps: list[tuple[int, float]] = []
        for name, weight in process:
            char_steps = result.steps.get(name, [None] * len(texts))[i] or []
            steps += [(t, weight * s) for t, s in token_step_ends(tokenizer, ids, text, char_steps)]
        if outcome and ids:
            total = sum(w * v for name, w in outcome if (v := result.per_function[name][i]) is not None)
            steps.append((len(ids) - 1, total))
        out.append(sorted(steps, key=lambda step: step[0]))
    return out


def check_process_setup(
    algo, functions: list[tuple[str, Callable, float]], turn_rewards: bool = False
) -> None:
    """ConfigError when the algorithm's estimator reads step rewards and no reward function gives them
    (``turn_rewards``: an environment's per-turn rewards give them, grpokit.rollout.episodes)."""
    from grpokit.config.schema import ConfigError

    estimator = algo.advantage.estimator
    if not reads_step_rewards(estimator) or turn_rewards:
        return
    if not any(is_process_reward(fn) for _, fn, _ in functions):
        names = [name for name, _, _ in functions]
        raise ConfigError(
            f"algo.advantage={estimator!r} (preset grpo_process) needs step rewards, and none of the rewards "
            f"{names} gives them. Add a process reward: rewards: [{{name: process_reward_model, kwargs: "
            "{path: PRM_DIR, step_separator: '\\n'}}] or your own function with step_rewards = True "
            "(grpokit.rewards.process); or choose an outcome preset (algo.preset=grpo)"
        )
