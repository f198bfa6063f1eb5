"""The tasks of ``grpokit bench --learn`` (grpokit.bench.learn): what each names the same on both sides (``LearnTask``:
the checkpoint, the prompts, the batch, the learning rate, the completion length), their data and rewards, and the
one greedy held-out accuracy both frameworks are measured with.

    task = task_for("twin", train_size=400)     # sum | twin | tools | mixed
    checkpoint, train, held_out = task_data(task)
    rewards = task_rewards(task)                # [(name, fn, weight)]
"""


from __future__ import annotations

import random
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpokit.bench.shapes import BenchError

TASKS = ("sum", "twin", "tools", "mixed")
"""--task: sum (the default demo's addition, one reward), twin (subtraction from its own warm start, two rewards:
a strict answer format and the answer's correctness), tools (the tools demo's 4-digit multiplication with a
``multiply`` tool: multi-turn episodes; grpokit arms only, see ``TRL_TASKS``), mixed (the addition model on a pool
half of which is multiplication it cannot do: a dataset with many prompts that never teach, where a prompt's
history has something to say; training and held-out rows alike)."""
TRL_TASKS = ("sum", "twin", "mixed")
"""Tasks TRL runs here: TRL 1.16's tool loop parses calls through its own chat-template schema, which the
tools demo's tiny template does not carry, so the tools task compares grpokit's arms only."""


@dataclass(frozen=True)
class LearnTask:
    """What both frameworks are given; the rest is each one's default."""

    kind: str = "sum"
    """Which task (``TASKS``)."""
    prompts_per_step: int = 16
    """Prompts per rollout (TRL: per_device_train_batch_size = prompts x G, one optimizer step per rollout)."""
    group_size: int = 8
    """G: completions per prompt (TRL: num_generations)."""
    lr: float = 1e-4
    """Learning rate, constant (TRL: lr_scheduler_type constant, warmup 0)."""
    max_new_tokens: int = 8
    """Completion length limit (TRL: max_completion_length); an answer with its EOS takes 5-6 tokens."""
    temperature: float = 1.0
    """Sampling temperature, no top-k or top-p (both frameworks' defaults)."""
    beta: float = 0.0
    """KL coefficient: TRL's default 0; grpokit's grpo preset has 0.04, named 0 here."""
    eval_size: int = 200
    """Held-out rows evaluated (the demo's 200; fewer for a smoke run)."""
    train_size: int | None = None
    """Training prompts used (the first of the demo's 2,300; None: all). A pool small enough to be visited
    several times is where a prompt's history can say something (data.selection)."""


KIND_DEFAULTS = {
    "sum": {},
    "twin": {},
    "tools": {"prompts_per_step": 8, "max_new_tokens": 40, "lr": 3e-4, "eval_size": 100},
    "mixed": {},
}
"""Each task's batch and length where they differ from LearnTask's (the tools task's: the tools demo's)."""


def task_for(kind: str = "sum", train_size: int | None = None, lr: float | None = None) -> LearnTask:
    """The LearnTask of ``kind`` with its defaults (``KIND_DEFAULTS``), ``train_size`` training prompts and the
    learning rate ``lr`` of both frameworks (None: the task's; twin plateaus at its 1e-4, docs/benchmarks.md)."""
    if kind not in TASKS:
        raise BenchError(f"--task {kind!r}: expected one of {', '.join(TASKS)}")
    if train_size is not None and train_size < 1:
        raise BenchError(f"--train-size {train_size}: expected at least 1 training prompt")
    if lr is not None and not 0 < lr <= 1:
        raise BenchError(f"--lr {lr}: expected a learning rate in (0, 1], e.g. --lr 1e-5")
    given = {**KIND_DEFAULTS[kind], **({"lr": lr} if lr is not None else {})}
    return LearnTask(kind=kind, train_size=train_size, **given)


def task_data(task: LearnTask) -> tuple[Path, list[dict], list[dict]]:
    """(the warm-started model's folder, training rows, held-out rows) of ``task.kind``."""
    if task.kind not in TASKS:
        raise BenchError(f"--task {task.kind!r}: expected one of {', '.join(TASKS)}")
    if task.kind == "tools":
        from grpokit.demos.tools import make_problems as tool_problems
        from grpokit.demos.tools import prepare

        paths = prepare(log=lambda m: None)
        from grpokit.demos.tools import ToolDemoSpec

        train_rows, eval_rows = tool_problems(ToolDemoSpec())
        return paths["model"], train_rows[: task.train_size], eval_rows[: task.eval_size]
    from grpokit.demos.default import DemoSpec, make_problems, prepare_demo, shipped_model

    if task.kind == "twin":
        paths = prepare_demo(
            _twin_spec(), problems=twin_problems, teacher=twin_teacher, prefix="learn-twin", log=_say
        )
        train_rows, eval_rows = twin_problems(_twin_spec())
        return paths["model"], train_rows[: task.train_size], eval_rows[: task.eval_size]
    spec = DemoSpec()
    model_dir = shipped_model(spec)
    if model_dir is None:
        raise BenchError(
            "--learn needs the demo model shipped with grpokit (grpokit/demos/model); rebuild it with "
            "python -m grpokit.demos.shipped"
        )
    train_rows, eval_rows = make_problems(spec)
    if task.kind == "mixed":
        train_rows, eval_rows = mixed_rows(train_rows), mixed_rows(eval_rows)
    return model_dir, train_rows[: task.train_size], eval_rows[: task.eval_size]


def mixed_rows(rows: list[dict]) -> list[dict]:
    """Every other row of the addition task as the multiplication of the same operands (a*b=, answer a*b)."""
    out = []
    for i, row in enumerate(rows):
        a, b = (int(x) for x in row["prompt"][:-1].split("+"))
        out.append(row if i % 2 == 0 else {"prompt": f"{a}*{b}=", "answer": str(a * b)})
    return out


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _twin_spec():
    from grpokit.demos.default import DemoSpec

    return DemoSpec(max_operand=59, sft_steps=400, seed=1)


TWIN_BARE = 0.4
"""Share of the twin task's warm-start answers the teacher writes bare (no <answer> tags): the format reward has
something to teach."""


def twin_problems(spec) -> tuple[list[dict], list[dict]]:
    """a-b= with a >= b from 0..max_operand, shuffled; the first eval_size held out."""
    pairs = [(a, b) for a in range(spec.max_operand + 1) for b in range(a + 1)]
    random.Random(spec.seed).shuffle(pairs)
    rows = [{"prompt": f"{a}-{b}=", "answer": str(a - b)} for a, b in pairs]
    return rows[spec.eval_size :], rows[: spec.eval_size]


def twin_teacher(row: dict, rng: random.Random) -> str:
    """The noisy teacher of the twin task: right 30% of the time, else one off; bare 40% of the time."""
    from grpokit.demos.default import completion_text

    total, u = int(row["answer"]), rng.random()
    value = total if u < 0.3 else total + 1 if u < 0.8 or total == 0 else total - 1
    return str(value) if rng.random() < TWIN_BARE else completion_text(value)


ANSWER_ONLY = re.compile(r"^<answer>-?\d+</answer>$")


def answer_format(prompts, completions, **kw) -> list[float]:
    """The twin task's format reward: 1 when the completion is <answer>N</answer> and nothing else."""
    return [float(bool(ANSWER_ONLY.match(str(c).strip()))) for c in completions]


def task_rewards(task: LearnTask) -> list[tuple[str, Any, float]]:
    """(name, function, weight) of the task's rewards, the same on both sides."""
    if task.kind == "tools":
        from grpokit.demos.tools import tool_answer

        return [("tool_answer", tool_answer, 1.0)]
    from grpokit.rewards.accuracy import math_accuracy

    if task.kind == "twin":
        return [("answer_format", answer_format, 0.5), ("math_accuracy", math_accuracy, 1.0)]
    return [("math_accuracy", math_accuracy, 1.0)]


# ----------------------------------------------------------------------------- the shared evaluation


def greedy_accuracy(model, tokenizer, rows: list[dict], max_new_tokens: int, batch: int = 100) -> float:
    """Share of ``rows`` whose greedy completion scores 1 with ``math_accuracy`` against their ``answer``:
    HF ``generate`` (do_sample False), prompts left-padded, no special tokens added (as both trainers
    encode a plain prompt). The same function in the grpokit and the TRL process."""
    import torch

    from grpokit.rewards.accuracy import math_accuracy

    was = model.training
    model.eval()
    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id
    eos = tokenizer.eos_token_id
    scores: list[float] = []
    with torch.no_grad():
        for start in range(0, len(rows), batch):
            chunk = rows[start : start + batch]
            ids = [tokenizer(r["prompt"], add_special_tokens=False).input_ids for r in chunk]
            width = max(map(len, ids))
            input_ids = torch.tensor([[pad] * (width - len(x)) + x for x in ids], device=device)  # (B, Lp)
            attention = (input_ids != pad).long()  # (B, Lp): the prompts hold no pad token
            out = model.generate(
                input_ids=input_ids, attention_mask=attention, do_sample=False, max_new_tokens=max_new_tokens,
                pad_token_id=pad, eos_token_id=eos, top_p=None, top_k=None, temperature=None,
            )  # fmt: skip
            texts = tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)
            got = math_accuracy([r["prompt"] for r in chunk], texts, answer=[r["answer"] for r in chunk])
            scores += [float(s or 0.0) for s in got]
    model.train(was)
    return sum(scores) / len(scores)


# ----------------------------------------------------------------------------- the two workers


ARMS = {"grpokit": [], "selection": ["data.selection.mode=greso"], "no_adoption": ["train.adopt_average=false"]}
"""grpokit's arms: its defaults, with prompt selection (data.selection, grpokit.rollout.selection), and without the
policy taking its average (train.adopt_average, grpokit.train.weight_average; on by default on a CPU)."""
