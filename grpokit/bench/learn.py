"""``grpokit bench --learn``: how much each framework learns, per step and per training second, beside TRL.

    grpokit bench --learn                       # 3 seeds x 60 steps, grpokit and TRL side by side
    grpokit bench --learn --quick               # 1 seed x 20 steps (a smoke run, minutes)
    grpokit bench --learn --set optim.adam_beta2=0.999 --trl-set loss_type=grpo   # one difference at a time

The task is the default demo's (grpokit.demos.default): two-number addition, ``"23+45="`` ->
``"<answer>68</answer>"``, scored by ``math_accuracy``, from the warm-started tiny Llama shipped with the
package (a weak start: its greedy answers are mostly off by one). Its 200 held-out problems are never
trained on; the other 2,300 are the training prompts of both frameworks.

What the benchmark names, the same on both sides (``LearnTask``): the checkpoint, the prompts, the batch
(prompts x G completions, one optimizer step per rollout), the learning rate and its constant schedule,
temperature 1 with no top-k / top-p, the completion length, beta 0, the seed. Everything else is each
framework's own default: grpokit's config defaults and TRL's GRPOConfig defaults as installed. The
settings that then differ are listed in the output (``setting_differences``: TRL's values are read through
grpokit.config.trl.from_trl, the importer that maps them to grpokit's), beside the differences in what the
code does that no setting names (``CODE_DIFFERENCES``).

Each run is its own process with one torch thread; a seed's grpokit and TRL runs are started together and
run side by side, so the load of the machine falls on both. Held-out accuracy is greedy pass@1 on the
held-out rows, measured by one function (``greedy_accuracy``, HF generate) in both processes, at step 0 and
every ``eval_every`` steps; the evaluation's time is not training time. Training seconds are the wall
clock of the training steps (grpokit: ``train_step()``; TRL: from ``on_train_begin`` to each
``on_step_end``, the callback's evaluation excluded), and beside them the CPU seconds the process and its
children used over the same stretches (``grpokit.core.clock``): on a shared machine the wall clock follows the load,
the CPU seconds much less.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from grpokit.bench.shapes import BenchError
from grpokit.core.clock import cpu_seconds

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


def task_for(kind: str = "sum", train_size: int | None = None) -> LearnTask:
    """The LearnTask of ``kind`` with its defaults (``KIND_DEFAULTS``) and ``train_size`` training prompts."""
    if kind not in TASKS:
        raise BenchError(f"--task {kind!r}: expected one of {', '.join(TASKS)}")
    if train_size is not None and train_size < 1:
        raise BenchError(f"--train-size {train_size}: expected at least 1 training prompt")
    return LearnTask(kind=kind, train_size=train_size, **KIND_DEFAULTS[kind])


QUICK = {"seeds": 1, "steps": 20, "eval_every": 5}
"""--quick: one seed, 20 steps, an evaluation every 5."""
FULL = {"seeds": 3, "steps": 60, "eval_every": 10}
"""The default measurement."""

CODE_DIFFERENCES = [
    ("rollout engine", "fast (own decode loop, shared-prefix KV cache)", "transformers generate()"),
    (
        "prompt order",
        "grpokit's seeded shuffle of the rows, each prompt once per pass",
        "RepeatSampler: a seeded permutation, each prompt once per pass",
    ),
    (
        "loss normaliser",
        "the whole mini-batch's (here the rollout's)",
        "per micro-batch / gradient accumulation (here one micro-batch: the same)",
    ),
    (
        "samples",
        "the decode loop's own seeded random stream",
        "generate()'s: the same seed gives other completions (the frameworks' seeds are independent)",
    ),
    (
        "reward calls",
        "forked workers (killable), math_accuracy in chunks of up to 32, 10 s per completion (the runner's budget)",
        "in the trainer's process, the whole batch in one call, no time limit",
    ),
    ("evaluation (both)", "greedy_accuracy: HF generate, greedy, batch of 100", "the same function"),
]
"""What the two codes do differently where no setting says it (found by reading both; docs/benchmarks.md)."""


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


def grpokit_overrides(task: LearnTask, seed: int, steps: int) -> list[str]:
    """The grpokit run's config: what the task names, the rest grpokit's defaults (plus what only
    quiets the run: no own evaluation, samples or TensorBoard)."""
    return [
        f"rollout.prompts_per_step={task.prompts_per_step}",
        f"rollout.group_size={task.group_size}",
        f"rollout.max_new_tokens={task.max_new_tokens}",
        f"rollout.temperature={task.temperature}",
        f"optim.lr={task.lr}",
        "optim.schedule=constant",
        f"algo.beta={task.beta}",
        f"train.steps={steps}",
        f"train.seed={seed}",
        "eval.enabled=false",
        "train.samples_every=0",
        "train.tensorboard=false",
        *(TOOL_OVERRIDES if task.kind == "tools" else []),
    ]


TOOL_OVERRIDES = [
    "rollout.tools=[grpokit.demos.tools:multiply]",
    "rollout.max_turns=3",
    "rollout.max_episode_tokens=72",
    "data.max_prompt_tokens=32",
]
"""The tools task's episodes, as the tools demo runs them (grpokit.demos.tools.overrides)."""


def trl_values(task: LearnTask, seed: int, steps: int) -> dict[str, Any]:
    """The TRL run's GRPOConfig fields that the task names (plus what only quiets the run)."""
    return {
        "per_device_train_batch_size": task.prompts_per_step * task.group_size,
        "gradient_accumulation_steps": 1,
        "num_generations": task.group_size,
        "max_completion_length": task.max_new_tokens,
        "temperature": task.temperature,
        "learning_rate": task.lr,
        "lr_scheduler_type": "constant",
        "beta": task.beta,
        "max_steps": steps,
        "seed": seed,
        "save_strategy": "no",
        "report_to": "none",
        "disable_tqdm": True,
        **({} if _cuda() else {"use_cpu": True, "bf16": False}),  # TRL's bf16 default needs a GPU
    }


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _parse_value(text: str) -> Any:
    import yaml

    return yaml.safe_load(text)


def _pairs(items: list[str], flag: str) -> dict[str, Any]:
    out = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise BenchError(f"{flag} {item!r}: expected KEY=VALUE")
        out[key.strip()] = _parse_value(value)
    return out


ARMS = {"grpokit": [], "selection": ["data.selection.mode=greso"]}
"""grpokit's arms: its defaults, and with prompt selection (data.selection, grpokit.rollout.selection)."""


def _run_grpokit(task: LearnTask, seed: int, steps: int, eval_every: int, extra: list[str]) -> dict[str, Any]:
    from grpokit.config.schema import load_config
    from grpokit.trainers.grpo import GRPOTrainer

    model_dir, train_rows, eval_rows = task_data(task)
    cfg = load_config(None, [*grpokit_overrides(task, seed, steps), *extra])
    with tempfile.TemporaryDirectory(prefix="grpokit-learn-") as out:
        cfg.model.name_or_path = str(model_dir)  # set directly: a path is not parsed as YAML
        cfg.train.output_dir = out
        trainer = GRPOTrainer(cfg, train_rows=train_rows, reward_functions=task_rewards(task))
        clock = TrainClock()
        curve = [_point(0, clock, trainer.model, trainer.tokenizer, eval_rows, task)]
        selection: list[dict[str, float]] = []  # each step's selection/* numbers (data.selection on)
        for step in range(1, steps + 1):
            clock.start()
            metrics = trainer.train_step()
            clock.stop()
            if not metrics:  # the prompts are solved: grpokit stops (stopped_early)
                break
            selection.append({k: v for k, v in metrics.items() if k.startswith(("selection/", "zero_var"))})
            if step % eval_every == 0 or step == steps:
                curve.append(_point(step, clock, trainer.model, trainer.tokenizer, eval_rows, task))
    return {"curve": curve, "selection": selection}


class TrainClock:
    """Wall and CPU seconds of the training only: ``start()`` / ``stop()`` around each training stretch."""

    def __init__(self):
        self.wall_s = self.cpu_s = 0.0
        self._wall = self._cpu = None

    def start(self) -> None:
        self._wall, self._cpu = time.perf_counter(), cpu_seconds()

    def stop(self) -> None:
        self.wall_s += time.perf_counter() - self._wall
        self.cpu_s += cpu_seconds() - self._cpu


def _point(
    step: int, clock: TrainClock, model, tokenizer, rows: list[dict], task: LearnTask
) -> dict[str, float]:
    t0 = time.perf_counter()
    if task.kind == "tools":  # greedy episodes with the tool (grpokit.demos.tools.accuracy)
        from grpokit.demos.tools import accuracy

        acc = accuracy(model, tokenizer, rows, with_tool=True)["accuracy"]
    else:
        acc = greedy_accuracy(model, tokenizer, rows, task.max_new_tokens)
    return {
        "step": step, "train_s": clock.wall_s, "train_cpu_s": clock.cpu_s, "accuracy": acc,
        "eval_s": time.perf_counter() - t0,
    }  # fmt: skip


def _run_trl(
    task: LearnTask, seed: int, steps: int, eval_every: int, extra: dict[str, Any]
) -> dict[str, Any]:
    import trl
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    model_dir, train_rows, eval_rows = task_data(task)
    rewards = task_rewards(task)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    curve: list[dict[str, float]] = []

    class Clock(TrainerCallback):
        """Training seconds between on_train_begin and each on_step_end, the evaluation left out."""

        def __init__(self):
            self.clock = TrainClock()

        def on_train_begin(self, args, state, control, model=None, **kw):
            curve.append(_point(0, self.clock, model, tokenizer, eval_rows, task))
            self.clock.start()

        def on_step_end(self, args, state, control, model=None, **kw):
            self.clock.stop()
            if state.global_step % eval_every == 0 or state.global_step == steps:
                curve.append(_point(state.global_step, self.clock, model, tokenizer, eval_rows, task))
            self.clock.start()

    with tempfile.TemporaryDirectory(prefix="grpokit-learn-trl-") as out:
        weights = {"reward_weights": [w for _, _, w in rewards]} if len(rewards) > 1 else {}
        args = GRPOConfig(output_dir=out, **{**trl_values(task, seed, steps), **weights, **extra})
        trainer = GRPOTrainer(
            model=str(model_dir), reward_funcs=[fn for _, fn, _ in rewards], args=args,
            train_dataset=Dataset.from_list(train_rows), processing_class=tokenizer, callbacks=[Clock()],
        )  # fmt: skip
        trainer.train()
    return {"curve": curve, "trl_version": trl.__version__}


def worker_main(argv: list[str]) -> int:
    """``python -m grpokit.bench.learn FRAMEWORK ...``: one run; its result as JSON in --out."""
    p = argparse.ArgumentParser(prog="python -m grpokit.bench.learn")
    p.add_argument("framework", choices=[*ARMS, "trl"])
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--eval-every", type=int, required=True)
    p.add_argument("--task", required=True, help="LearnTask as JSON")
    p.add_argument("--set", action="append", default=[])
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    task = LearnTask(**json.loads(a.task))
    t0 = time.perf_counter()
    if a.framework in ARMS:
        result = _run_grpokit(task, a.seed, a.steps, a.eval_every, [*ARMS[a.framework], *a.set])
    else:
        result = _run_trl(task, a.seed, a.steps, a.eval_every, _pairs(a.set, "--trl-set"))
    result.update(framework=a.framework, seed=a.seed, wall_s=time.perf_counter() - t0, settings=a.set)
    Path(a.out).write_text(json.dumps(result))
    return 0


# ----------------------------------------------------------------------------- the benchmark


def setting_differences(
    task: LearnTask, grpokit_set: list[str] = (), trl_set: dict[str, Any] | None = None
) -> list[tuple[str, Any, Any]]:
    """(grpokit key, grpokit's value, TRL's value in grpokit's terms) of every setting the two runs differ
    in: TRL's fields (its defaults and what the benchmark names) mapped by grpokit.config.trl.from_trl,
    compared with grpokit's resolved config (algo.* as the preset resolves them)."""
    from grpokit.config.schema import load_config, resolve_algo
    from grpokit.config.trl import from_trl

    cfg = load_config(None, [*grpokit_overrides(task, 0, 1), *grpokit_set])
    algo = resolve_algo(cfg).flat()
    values = {**trl_values(task, 0, 1), **(trl_set or {})}
    # display, checkpoints and the CPU flag: nothing trained differs
    for inert in ("disable_tqdm", "save_strategy", "use_cpu"):
        values.pop(inert, None)
    theirs, _ = from_trl(values)
    out = []
    skip = {
        "train.output_dir",
        "train.save_every",
        "train.keep_checkpoints",
        "train.report_to",
        "train.steps",
    }
    for section, fields in theirs.items():
        if not isinstance(fields, dict):
            continue
        for name, value in fields.items():
            key = f"{section}.{name}"
            if key in skip:
                continue
            ours = (
                algo[name]
                if section == "algo" and name in algo
                else getattr(getattr(cfg, section), name, None)
            )
            if section == "algo" and name == "preset":
                continue
            if not _same(ours, value):
                out.append((key, ours, value))
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return float(a) == float(b)
    return a == b


def _launch(
    framework: str, task: LearnTask, seed: int, steps: int, eval_every: int, sets: list[str], out: Path
):
    cmd = [
        sys.executable, "-m", "grpokit.bench.learn", framework, "--seed", str(seed), "--steps", str(steps),
        "--eval-every", str(eval_every), "--task", json.dumps(asdict(task)), "--out", str(out),
        *(x for s in sets for x in ("--set", s)),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    log = out.with_suffix(".log").open("w")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env), log


def run_learn(
    *,
    seeds: int = FULL["seeds"],
    steps: int = FULL["steps"],
    eval_every: int = FULL["eval_every"],
    task: LearnTask = LearnTask(),
    grpokit_set: list[str] = (),
    trl_set: list[str] = (),
    frameworks: tuple[str, ...] = ("grpokit", "selection", "trl"),
    timeout_s: float | None = None,
    log=lambda m: print(m, file=sys.stderr, flush=True),
) -> dict[str, Any]:
    """Seeds 0..seeds-1, each framework in its own process, a seed's runs side by side; the result dict
    (runs, summary per framework and evaluation step, settings that differ)."""
    if seeds < 1 or steps < 1 or eval_every < 1:
        raise BenchError(
            f"--learn needs seeds, steps and eval-every >= 1 (got {seeds}, {steps}, {eval_every})"
        )
    unknown = [fw for fw in frameworks if fw not in (*ARMS, "trl")]
    if unknown or not frameworks:
        raise BenchError(f"--arms {','.join(frameworks)}: expected some of {', '.join([*ARMS, 'trl'])}")
    task_data(task)  # the model is there (the twin task's warm start: built once, cached), before any process
    if task.kind not in TRL_TASKS:
        frameworks = tuple(fw for fw in frameworks if fw != "trl")
    trl_pairs = _pairs(list(trl_set), "--trl-set")
    differences = setting_differences(task, list(grpokit_set), trl_pairs)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="grpokit-learn-") as tmp:
        for seed in range(seeds):
            procs = {}
            for fw in frameworks:
                sets = list(grpokit_set) if fw in ARMS else list(trl_set)
                out = Path(tmp) / f"{fw}-{seed}.json"
                procs[fw] = (*_launch(fw, task, seed, steps, eval_every, sets, out), out)
            log(f"grpokit bench --learn: seed {seed}: {' and '.join(frameworks)} side by side, {steps} steps")
            for fw, (proc, logfile, out) in procs.items():
                try:
                    proc.wait(timeout=timeout_s)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                logfile.close()
                if proc.returncode != 0 or not out.is_file():
                    tail = "\n".join(out.with_suffix(".log").read_text(errors="replace").splitlines()[-20:])
                    raise BenchError(
                        f"--learn: the {fw} run of seed {seed} failed (exit {proc.returncode}):\n{tail}"
                    )
                runs.append(json.loads(out.read_text()))
    versions = {"trl": next((r.get("trl_version") for r in runs if r.get("trl_version")), None)}
    result = {
        "system": "grpokit",
        "kind": "learn",
        "task": asdict(task),
        "seeds": seeds,
        "steps": steps,
        "eval_every": eval_every,
        "grpokit_set": list(grpokit_set),
        "trl_set": list(trl_set),
        "versions": versions,
        "differences": [{"key": k, "grpokit": a, "trl": b} for k, a, b in differences],
        "code_differences": [{"what": w, "grpokit": a, "trl": b} for w, a, b in CODE_DIFFERENCES],
        "runs": runs,
        "summary": summarize(runs),
    }
    result["equal_seconds"] = at_equal_seconds(result["summary"])
    result["equal_cpu_seconds"] = at_equal_seconds(result["summary"], clock="train_cpu_s")
    result["comparisons"] = comparisons(result["summary"])
    return result


def summarize(runs: list[dict[str, Any]]) -> dict[str, list[dict[str, float]]]:
    """Per framework, per evaluation step: accuracy mean, sample std, min and max over the seeds, and the
    mean training seconds."""
    out: dict[str, list[dict[str, float]]] = {}
    for fw in dict.fromkeys(r["framework"] for r in runs):
        curves = [r["curve"] for r in runs if r["framework"] == fw]
        steps = sorted(set.intersection(*({p["step"] for p in c} for c in curves)))
        rows = []
        for step in steps:
            points = [next(p for p in c if p["step"] == step) for c in curves]
            accs = [p["accuracy"] for p in points]
            rows.append({
                "step": step,
                "accuracy_mean": statistics.fmean(accs),
                "accuracy_std": statistics.stdev(accs) if len(accs) > 1 else 0.0,
                "accuracy_min": min(accs),
                "accuracy_max": max(accs),
                "train_s_mean": statistics.fmean(p["train_s"] for p in points),
                "train_cpu_s_mean": statistics.fmean(p.get("train_cpu_s", math.nan) for p in points),
                "n": len(accs),
            })  # fmt: skip
        out[fw] = rows
    return out


def interpolate(xs: list[float], ys: list[float], x: float) -> float | None:
    """ys at x on the piecewise-linear curve through (xs, ys) (xs increasing); None outside [xs[0], xs[-1]]."""
    if not xs or x < xs[0] or x > xs[-1]:
        return None
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return ys[-1]


def at_equal_seconds(
    summary: dict[str, list[dict[str, float]]], a: str = "grpokit", b: str = "trl", clock: str = "train_s"
) -> list[dict]:
    """At each of ``a``'s evaluations (its mean training seconds), ``b``'s mean accuracy at the same seconds,
    read off ``b``'s mean curve (linear between its evaluations); rows past ``b``'s last second are left out.
    ``clock``: train_s (wall clock) or train_cpu_s (CPU seconds)."""
    if a not in summary or b not in summary:
        return []
    xs = [r[f"{clock}_mean"] for r in summary[b]]
    ys = [r["accuracy_mean"] for r in summary[b]]
    out = []
    for r in summary[a]:
        other = interpolate(xs, ys, r[f"{clock}_mean"])
        if other is not None and r["step"] > 0:
            out.append(
                {
                    clock: r[f"{clock}_mean"],
                    a: r["accuracy_mean"],
                    b: other,
                    "gap": r["accuracy_mean"] - other,
                }
            )
    return out


def at_equal_steps(summary: dict[str, list[dict[str, float]]], a: str, b: str) -> list[dict]:
    """At every step both ``a`` and ``b`` evaluated (step 0 left out): their mean accuracies and the gap."""
    theirs = {r["step"]: r for r in summary.get(b, [])}
    return [
        {"step": r["step"], a: r["accuracy_mean"], b: theirs[r["step"]]["accuracy_mean"],
         "gap": r["accuracy_mean"] - theirs[r["step"]]["accuracy_mean"]}
        for r in summary.get(a, []) if r["step"] > 0 and r["step"] in theirs
    ]  # fmt: skip


def comparisons(summary: dict[str, list[dict[str, float]]]) -> list[dict]:
    """Each pair of arms worth reading: the selection against TRL and against grpokit's defaults, grpokit against
    TRL; at equal steps, equal training seconds and equal CPU seconds."""
    pairs = [(a, b) for a, b in (("selection", "trl"), ("selection", "grpokit"), ("grpokit", "trl"))]
    out = []
    for a, b in pairs:
        if a in summary and b in summary:
            out.append({
                "a": a, "b": b, "equal_steps": at_equal_steps(summary, a, b),
                "equal_seconds": at_equal_seconds(summary, a, b),
                "equal_cpu_seconds": at_equal_seconds(summary, a, b, clock="train_cpu_s"),
            })  # fmt: skip
    return out


def print_learn_table(result: dict[str, Any], file=None) -> None:
    """The summary as Markdown tables (they paste into docs/benchmarks.md): held-out accuracy by step, each
    framework's seeds, and the settings that differ."""
    file = file or sys.stdout
    summary = result["summary"]
    fws = list(summary)
    w = lambda *cells: print("| " + " | ".join(str(c) for c in cells) + " |", file=file)  # noqa: E731
    task = result["task"]
    print(
        f"\nheld-out greedy accuracy ({task['eval_size']} problems), mean +- std (min-max) over "
        f"{result['seeds']} seed(s); training seconds (wall clock) and CPU seconds (the process and its "
        "children), mean\n",
        file=file,
    )
    w(
        "step",
        *(f"{fw} accuracy" for fw in fws),
        *(f"{fw} train s" for fw in fws),
        *(f"{fw} CPU s" for fw in fws),
    )
    w(*["---"] * (1 + 3 * len(fws)))
    by_step = {fw: {r["step"]: r for r in rows} for fw, rows in summary.items()}
    for step in sorted(set.intersection(*(set(b) for b in by_step.values()))):
        cells = []
        for fw in fws:
            r = by_step[fw][step]
            cells.append(
                f"{r['accuracy_mean']:.1%} +- {r['accuracy_std']:.1%} ({r['accuracy_min']:.1%}-{r['accuracy_max']:.1%})"
            )
        w(
            step, *cells, *(f"{by_step[fw][step]['train_s_mean']:.1f}" for fw in fws),
            *(f"{by_step[fw][step]['train_cpu_s_mean']:.1f}" for fw in fws),
        )  # fmt: skip
    given = {fw: " ".join([*ARMS.get(fw, []), *result["grpokit_set"]]) if fw in ARMS else " ".join(result["trl_set"])
             for fw in fws}  # fmt: skip
    print("\nfinal accuracy per seed\n", file=file)
    w("framework", "settings", *(f"seed {s}" for s in range(result["seeds"])), "train s (mean)")
    w(*["---"] * (3 + result["seeds"]))
    for fw in fws:
        runs = sorted((r for r in result["runs"] if r["framework"] == fw), key=lambda r: r["seed"])
        w(fw, given[fw] or "defaults", *(f"{r['curve'][-1]['accuracy']:.1%}" for r in runs),
          f"{statistics.fmean(r['curve'][-1]['train_s'] for r in runs):.1f}")  # fmt: skip
    for c in result.get("comparisons", []):
        a, b = c["a"], c["b"]
        print(f"\n{a} ({given[a] or 'defaults'}) against {b} ({given[b] or 'defaults'})\n", file=file)
        w("at equal", "where", a, b, f"{a} - {b}")
        w("---", "---", "---", "---", "---")
        for key, clock, what in (
            ("equal_steps", "step", "steps"),
            ("equal_seconds", "train_s", "train s"),
            ("equal_cpu_seconds", "train_cpu_s", "CPU s"),
        ):
            for r in c[key]:  # b's mean curve read at a's evaluations (seconds), or the same step
                where = f"step {r[clock]}" if clock == "step" else f"{r[clock]:.1f} s"
                w(what, where, f"{r[a]:.1%}", f"{r[b]:.1%}", f"{100 * r['gap']:+.1f} points")
    print("\nsettings that differ (TRL's in grpokit's terms, grpokit.config.trl)\n", file=file)
    w("setting", "grpokit", f"TRL {result['versions'].get('trl') or ''}".strip())
    w("---", "---", "---")
    for d in result["differences"]:
        w(d["key"], d["grpokit"], d["trl"])
    for d in result["code_differences"]:
        w(d["what"], d["grpokit"], d["trl"])


def plot_learn(result: dict[str, Any], path: str | Path) -> Path:
    """Held-out accuracy against the step and against training seconds: each seed thin, the mean thick."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    colours = {"grpokit": "tab:blue", "selection": "tab:green", "trl": "tab:orange"}
    for fw, rows in result["summary"].items():
        c = colours.get(fw, None)
        for r in (r for r in result["runs"] if r["framework"] == fw):
            xs = [p["step"] for p in r["curve"]], [p["train_s"] for p in r["curve"]]
            ys = [p["accuracy"] for p in r["curve"]]
            for ax, x in zip(axes, xs):
                ax.plot(x, ys, color=c, alpha=0.3, linewidth=0.8)
        label = "TRL" if fw == "trl" else fw
        axes[0].plot(
            [r["step"] for r in rows], [r["accuracy_mean"] for r in rows], color=c, linewidth=2, label=label
        )
        axes[1].plot(
            [r["train_s_mean"] for r in rows],
            [r["accuracy_mean"] for r in rows],
            color=c,
            linewidth=2,
            label=label,
        )
    axes[0].set_xlabel("step (one rollout, one optimizer step)")
    axes[1].set_xlabel("training seconds")
    axes[0].set_ylabel("held-out greedy accuracy")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend()
    task = result["task"]
    fig.suptitle(
        f"grpokit bench --learn: {task.get('kind', 'sum')}, {task['prompts_per_step']}x{task['group_size']}, lr {task['lr']:g}, "
        f"{result['seeds']} seed(s)"
    )
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1:]))
