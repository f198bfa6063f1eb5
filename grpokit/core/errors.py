"""The errors a run stops with, by kind, and the exit code of each kind (``exit_code``; the table of
docs/exit-codes.md and ``grpokit --help``). Each message says why and what to change.

    0    done (a run stopped early as finished too: solved prompts, train.max_cpu_seconds)
    1    TrainingError: the run itself failed (no reward spread, a growing sampler/trainer KL, out of memory,
         NaN weights), or an unexpected error (a bug: --debug shows its traceback)
    2    ConfigError, DataError: usage or config error (a bad value, data, model path, output folder,
         checkpoint to resume from), found before the model loads where it can be
    3    UserCodeFailedError: the user's code failed while the run ran it (RewardFunctionError: a reward function
         raising or timing out on more than train.max_reward_failure_frac of a step; EnvironmentFailedError, by
         the same rule; CallbackError)
    4    EngineError: the generation engine or the sampler process failed (SamplerDiedError,
         SamplerStalledError; a vLLM server down or dying)
    5    RunIOError, OSError: disk full or another I/O error writing the run
    128 + N  stopped by signal N (130 SIGINT, 143 SIGTERM) after saving a checkpoint
"""

from __future__ import annotations

EXIT_DONE = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_USER_CODE = 3
EXIT_ENGINE = 4
EXIT_IO = 5


class ConfigError(ValueError):
    """A configuration key or value is wrong; the message says which and what to do."""

    exit_code = EXIT_USAGE


class TrainingError(RuntimeError):
    """The run cannot go on; the message says why and what to change."""

    exit_code = EXIT_FAILED


class FlatRewardsError(TrainingError):
    """No group had any reward spread for train.stop_after_flat_steps steps: nothing can be learnt."""


class UserCodeFailedError(TrainingError):
    """The user's code (a reward function, a tool, an environment, a callback) failed while the run ran it."""

    exit_code = EXIT_USER_CODE


class RewardFunctionError(UserCodeFailedError):
    """A reward function raised or timed out on more of a step's completions than
    train.max_reward_failure_frac allows."""


class EnvironmentFailedError(UserCodeFailedError):
    """A multi-turn run's environment failed (raised, hung, crashed, answered what is not an answer) on every
    episode of a step, or on more than train.max_reward_failure_frac of them."""


class CallbackError(UserCodeFailedError):
    """A callback given to the trainer raised; the run stopped with a checkpoint of the step."""


class EngineError(TrainingError):
    """The generation engine or the process that samples failed: a vLLM server down or dying, a weight push
    that did not arrive, the asynchronous sampler process dying or no longer answering."""

    exit_code = EXIT_ENGINE


class SamplerDiedError(EngineError):
    """The sampler process of an asynchronous run (rollout.max_staleness >= 1) died or failed."""


class SamplerStalledError(SamplerDiedError):
    """The sampler process of an asynchronous run gave no heartbeat for rollout.sampler_timeout_s seconds:
    stopped (SIGSTOP), frozen or hung."""


class RunIOError(TrainingError):
    """Writing the run's files failed (disk full, a quota, a read-only or vanished folder)."""

    exit_code = EXIT_IO


def exit_code(error: BaseException) -> int:
    """The exit code of a command that ended with ``error`` (the module docstring's table): the class's own
    ``exit_code`` (the nearest in its bases), an OSError's 5 (I/O), else 1."""
    for cls in type(error).__mro__:
        code = vars(cls).get("exit_code")
        if isinstance(code, int):
            return code
    if isinstance(error, OSError):
        return EXIT_IO
    return EXIT_FAILED


def with_text(error: Exception, more: str) -> Exception:
    """An error of ``error``'s class whose message ends with ``more`` (e.g. the checkpoint saved on the way out);
    ``error`` itself when ``more`` is empty or its class takes more than a message."""
    if not more:
        return error
    try:
        return type(error)(f"{error}{more}")
    except TypeError:
        return error
