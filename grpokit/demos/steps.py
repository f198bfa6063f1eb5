"""The embedded demo's process-reward variant: multi-step addition whose every step is checked by rule.

Task: three numbers, summed in steps, ``"3+14+9="`` -> ``"17 26 <answer>26</answer>"``: each running
sum is a step (steps end after a space, `grpokit.rewards.process.step_ends(text, " ")`), the answer the
last step. `step_checks` (a process reward, `step_rewards = True`) scores each step 1 or 0: an
intermediate step is right when it is the true running sum, the last step when it is
``<answer>total</answer>``; so its sequence-level value (the last step's score) is the answer's
correctness, the accuracy.

Warm start, as the default demo: a noisy teacher whose every step is right 35% of the time (45% one
too many, 20% one too few), each step building on its own previous one, so its answers are right
about 30% of the time and its greedy answers are mostly off. Under ``algo.preset=grpo_process`` each
step gets its own credit (DeepSeekMath sec. 4.1.3); under ``algo.preset=grpo`` the same function gives
the outcome only (its last step): the comparison in docs/algorithms/process.md is that of the two presets, same reward.

    grpokit train --output-dir runs/steps data.train=demo_steps                     # grpo_process
    grpokit train --output-dir runs/steps_outcome data.train=demo_steps algo.preset=grpo
"""

from __future__ import annotations

import itertools
import random
import re
from dataclasses import dataclass
from pathlib import Path

from grpokit.demos.default import WarmStartSpec, demo_overrides, prepare_demo
from grpokit.rewards.process import step_ends
from grpokit.scoring.completions import to_text

NAME = "demo_steps"
"""`data.train=demo_steps` on the command line picks this variant of the demo."""

_ANSWER = re.compile(r"<answer>(\d+)</answer>")


@dataclass(frozen=True)
class StepsSpec(WarmStartSpec):
    max_operand: int = 29
    """Operands are drawn from 0..max_operand."""
    operands: int = 3
    """Numbers per problem (operands - 1 running sums, then the answer)."""
    eval_size: int = 200
    """Held-out problems."""
    step_right: float = 0.35
    """Probability that a teacher's step adds correctly ..."""
    step_plus_one: float = 0.45
    """... adds one too many (the rest: one too few)."""


def make_problems(spec: StepsSpec) -> tuple[list[dict], list[dict]]:
    """All operand tuples, shuffled; the first eval_size are held out."""
    tuples = list(itertools.product(range(spec.max_operand + 1), repeat=spec.operands))
    random.Random(spec.seed).shuffle(tuples)
    rows = [{"prompt": "+".join(map(str, t)) + "=", "answer": str(sum(t))} for t in tuples]
    return rows[spec.eval_size :], rows[: spec.eval_size]


def teacher(spec: StepsSpec):
    """The noisy teacher's completion of a row: running sums, each step off by one now and then."""

    def write(row: dict, rng: random.Random) -> str:
        numbers = [int(x) for x in row["prompt"].rstrip("=").split("+")]
        total, steps = numbers[0], []
        for x in numbers[1:]:
            u = rng.random()
            noise = 0 if u < spec.step_right else (1 if u < spec.step_right + spec.step_plus_one else -1)
            total = total + x + noise if total + x + noise >= 0 else total + x + 1
            steps.append(str(total))
        return " ".join(steps) + f" <answer>{total}</answer>"

    return write


def step_checks(prompts, completions, **kwargs) -> list[list[tuple[int, float]]]:
    """Process reward of the demo: [(char_end, 1.0 or 0.0)] per completion, one per step (module docstring)."""
    out = []
    for prompt, completion in zip(prompts, completions):
        text = to_text(completion)
        numbers = [int(x) for x in re.findall(r"\d+", to_text(prompt))]
        partial = list(itertools.accumulate(numbers))[1:]  # the running sums after each addition
        ends = step_ends(text, " ")
        steps, start = [], 0
        for k, end in enumerate(ends):
            piece, start = text[start:end].strip(), end
            if k == len(ends) - 1:  # the last step is the answer
                m = _ANSWER.fullmatch(piece)
                right = bool(m) and bool(partial) and int(m.group(1)) == partial[-1]
            else:
                right = k < len(partial) and piece == str(partial[k])
            steps.append((end, float(right)))
        out.append(steps)
    return out


step_checks.step_rewards = True


def prepare(cache: Path | None = None, log=print) -> dict[str, Path]:
    """Build (or reuse) the warm-started model and data of this variant: {"model", "train", "eval"}."""
    spec = StepsSpec()
    return prepare_demo(
        spec, cache=cache, log=log, problems=make_problems, teacher=teacher(spec), prefix=NAME
    )


def overrides(paths: dict[str, Path]) -> dict:
    """The variant's run: the default demo's settings with GRPO process supervision, room for the running
    sums (16 new tokens instead of 8), scored by step_checks."""
    run = demo_overrides(paths)
    run["rollout"]["max_new_tokens"] = 16
    run["algo"] = {"preset": "grpo_process"}
    run["rewards"] = [{"name": "grpokit.demos.steps:step_checks", "weight": 1.0}]
    run["train"]["output_dir"] = "runs/demo_steps"
    return run
