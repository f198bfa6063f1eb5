"""Verifiable rewards for GRPO: math, format, code, language and length, plus a runner that survives them.

Every reward function follows TRL's convention (that of its GRPOTrainer._calculate_rewards),

    fn(prompts, completions, completion_ids, trainer_state, log_metric, log_extra, **columns)
        -> list[float | None]                                      # None = not applicable

so TRL reward functions work unchanged (`async def` ones too). Completions are strings, or chat
messages ([{"role": "assistant", "content": ...}], see `as_completions`) when the prompt is; the
built-ins read the text of either. Columns: `answer` (math ground truth: a bare value or a
GSM8K solution ending in "#### n"), `tests` (code tests: assert-style source or stdin/stdout
cases), `completion_ids` (token ids, for the length rewards). Columns are configurable through the
factories (`make_math_accuracy(answer_column=...)`, `make_code_tests(tests_column=...)`).

Builtins (BUILTINS, by name): math_accuracy, format_strict, format_lenient (and "format" =
format_strict), code_tests, language_consistency, and the factories overlong_penalty(max_len,
buffer_len) and length_penalty(max_len, ...). `resolve_reward("name" | "module:fn" | "file.py:fn",
**params)` turns a config entry into a function, `resolve_reward_specs(cfg.rewards)` the whole list
(problems are `RewardConfigError`s naming the `rewards[i]` entry); `RewardRunner` runs them with
weights and timeouts in killable worker processes (see `grpokit.scoring.runner`). The isolation of
the code sandbox is described in `grpokit.sandbox`.

Learned and process rewards: `reward_model` (a sequence-classification reward model) and
`process_reward_model` (a Math-Shepherd-style PRM) are factories taking the model folder as `path`
(`grpokit.rewards.reward_model`); they run in the trainer's process (`in_process = True`, honoured
by the runner). A function marked `step_rewards = True` returns per completion its steps
[(char_end, score)] (`grpokit.rewards.process`: the contract, and how the trainer maps the steps to
tokens for the grpo_process preset).
"""

from grpokit.rewards.accuracy import extract_answers, make_math_accuracy, math_accuracy
from grpokit.rewards.code import code_tests, extract_code, make_code_tests
from grpokit.rewards.format import format_lenient, format_strict
from grpokit.rewards.language import language_consistency, make_language_consistency
from grpokit.rewards.length import length_penalty, overlong_penalty
from grpokit.rewards.process import step_ends
from grpokit.rewards.registry import (
    BUILTINS,
    RewardConfigError,
    is_factory,
    resolve_reward,
    resolve_reward_specs,
)
from grpokit.rewards.reward_model import make_process_reward_model, make_reward_model
from grpokit.sandbox import SandboxLimits, isolation_report
from grpokit.scoring.completions import as_completions
from grpokit.scoring.runner import RewardResult, RewardRunner, TrainerState

__all__ = [
    "BUILTINS",
    "RewardConfigError",
    "RewardResult",
    "RewardRunner",
    "SandboxLimits",
    "TrainerState",
    "as_completions",
    "code_tests",
    "extract_answers",
    "extract_code",
    "format_lenient",
    "format_strict",
    "is_factory",
    "isolation_report",
    "language_consistency",
    "length_penalty",
    "make_code_tests",
    "make_language_consistency",
    "make_math_accuracy",
    "make_process_reward_model",
    "make_reward_model",
    "math_accuracy",
    "overlong_penalty",
    "resolve_reward",
    "resolve_reward_specs",
    "step_ends",
]
