"""Which reward is "accuracy" (the console's accuracy, the plots, evaluation's pass@1 / maj@k and the
flat-reward check): one documented rule, never a format or length reward picked silently.

  1. `train.accuracy_reward` when set (a reward's name, as in the config or the metrics).
  2. else the one verifier among the rewards: a built-in that checks correctness (math_accuracy,
     code_tests) or a function whose name says accuracy / correct (TRL's
     `accuracy_reward`, `reasoning_accuracy_reward`);
  3. else the only reward, or the only one whose name does not say format / length / overlong / brevity /
     language (with `format_strict` beside it), announced when the run starts (`pick_accuracy_reward` says why);
  4. else, with several verifiers, an error that asks for `train.accuracy_reward`;
  5. else none, never a guess: only shaping rewards (TRL's quickstart `reward_len` alone), or several rewards none
     of which says it is the verifier (`fmt` and `exact_sort`: either could be the format one). The run trains,
     as TRL's does, without the accuracy metric or held-out accuracy (the flat-reward check reads the total
     reward's spread either way), and says so in one line when it starts, naming `train.accuracy_reward`.

Before issue 30 the first reward listed was taken: with TRL's `think_format_reward` first, "accuracy"
read 1.0 while the accuracy reward was 0.19. Before issue 52 the first reward whose name did not say format was:
with `fmt` and `exact_sort`, accuracy, pass@1, maj@k and the flat-reward stop followed `fmt`.
"""

from __future__ import annotations

from grpokit.core.errors import ConfigError

VERIFIERS = ("math_accuracy", "code_tests")
"""Built-in rewards whose 1 means correct (a reward model's score does not: name it to use it)."""
ACCURACY_WORDS = ("accuracy", "correct")
SHAPING_WORDS = ("format", "length", "overlong", "len_", "_len", "brevity", "language")


def _words(name: str) -> str:
    return name.rsplit(":", 1)[-1].lower()


def choose_accuracy_reward(
    names: list[str], explicit: str | None, aliases: dict[str, str] | None = None
) -> str | None:
    """The name (as in `names`, the metrics' names) of the reward that accuracy reads; see the module doc."""
    return pick_accuracy_reward(names, explicit, aliases)[0]


def pick_accuracy_reward(
    names: list[str], explicit: str | None, aliases: dict[str, str] | None = None
) -> tuple[str | None, str]:
    """(name, why): the reward accuracy reads and the rule that chose it, or (None, why) when every reward
    is a format/length one (rule 5). `aliases` maps the config's names to the metric names
    (my_rewards.py:brevity -> brevity)."""
    aliases = aliases or {}
    if explicit:
        name = aliases.get(explicit, explicit)
        if name not in names:
            raise ConfigError(f"train.accuracy_reward={explicit!r} is not one of the rewards {names}")
        return name, "train.accuracy_reward"
    original = {aliases.get(k, k): k for k in aliases} | {n: n for n in names if n not in aliases.values()}

    def says(name: str, words: tuple[str, ...]) -> bool:
        return any(w in _words(original.get(name, name)) for w in words)

    verifiers = [n for n in names if original.get(n, n) in VERIFIERS or says(n, ACCURACY_WORDS)]
    if len(verifiers) == 1:
        return verifiers[0], "the one verifier among the rewards"
    plain = [n for n in names if not says(n, SHAPING_WORDS)]
    if not verifiers and len(plain) == 1:
        if len(names) == 1:
            return plain[0], "the only reward"
        return plain[0], f"the only reward of {names} that is not a format/length one; train.accuracy_reward chooses another"
    if not verifiers and plain:
        return None, (
            f"none: of the rewards {names} none says it is the verifier (a name with accuracy or correct), and grpokit "
            "does not guess, so no accuracy metric and no held-out accuracy; set train.accuracy_reward to the one "
            f"whose 1 means correct, e.g. train.accuracy_reward={plain[-1]}"
        )
    if not verifiers:
        return None, (
            f"none: the rewards {names} are all format/length ones, so no accuracy metric and no held-out "
            "accuracy; set train.accuracy_reward to name the one whose 1 means correct"
        )
    why = f"{len(verifiers)} look like verifiers ({verifiers})"
    raise ConfigError(
        f"which reward is accuracy? Of the rewards {names}, {why}; set train.accuracy_reward to the one whose "
        "1 means correct (it drives the accuracy metric, evaluation's pass@1 and maj@k, and the flat-reward "
        "check), e.g. train.accuracy_reward=" + (verifiers or names)[0]
    )
