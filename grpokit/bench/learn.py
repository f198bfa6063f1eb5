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
held-out rows (of the averaged weights when ``--set train.ema_decay=D`` keeps an average), measured by one function (``greedy_accuracy``, HF generate) in both processes, at step 0 and
every ``eval_every`` steps; the evaluation's time is not training time. Training seconds are the wall
clock of the training steps (grpokit: ``train_step()``; TRL: from ``on_train_begin`` to each
``on_step_end``, the callback's evaluation excluded), and beside them the CPU seconds the process and its
children used over the same stretches (``grpokit.core.clock``): on a shared machine the wall clock follows the load,
the CPU seconds much less.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from grpokit.bench.learn_report import at_equal_seconds, comparisons, summarize
from grpokit.bench.learn_tasks import (
    ARMS,
    TRL_TASKS,
    LearnTask,
    greedy_accuracy,
    task_data,
    task_rewards,
)
from grpokit.bench.shapes import BenchError
from grpokit.core.clock import cpu_seconds

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
        "forked workers (killable), math_accuracy in chunks sized by its speed (one per worker once it is known), 10 s per completion (the runner's budget)",
        "in the trainer's process, the whole batch in one call, no time limit",
    ),
    ("evaluation (both)", "greedy_accuracy: HF generate, greedy, batch of 100", "the same function"),
]
"""What the two codes do differently where no setting says it (found by reading both; docs/benchmarks.md)."""





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




def _run_grpokit(task: LearnTask, seed: int, steps: int, eval_every: int, extra: list[str]) -> dict[str, Any]:
    from grpokit.config.schema import load_config
    from grpokit.trainers.grpo import GRPOTrainer

    model_dir, train_rows, eval_rows = task_data(task)
    cfg = load_config(None, [*grpokit_overrides(task, seed, steps), *extra])
    with tempfile.TemporaryDirectory(prefix="grpokit-learn-") as out:
        cfg.model.name_or_path = str(model_dir)  # set directly: a path is not parsed as YAML
        cfg.train.output_dir = out
        trainer = GRPOTrainer(cfg, train_rows=train_rows, reward_functions=task_rewards(task))
        average = trainer.parts.policy.average  # train.ema_decay: the averaged weights are the model evaluated
        evaluated = average.model if average is not None and cfg.train.ema_decay else trainer.model
        clock = TrainClock()
        curve = [_point(0, clock, evaluated, trainer.tokenizer, eval_rows, task)]
        selection: list[dict[str, float]] = []  # each step's selection/* numbers (data.selection on)
        for step in range(1, steps + 1):
            clock.start()
            metrics = trainer.train_step()
            clock.stop()
            if not metrics:  # the prompts are solved: grpokit stops (stopped_early)
                break
            selection.append({k: v for k, v in metrics.items() if k.startswith(("selection/", "zero_var", "average/"))})
            if step % eval_every == 0 or step == steps:
                curve.append(_point(step, clock, evaluated, trainer.tokenizer, eval_rows, task))
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
    task: LearnTask | None = None,
    grpokit_set: list[str] = (),
    trl_set: list[str] = (),
    frameworks: tuple[str, ...] = ("grpokit", "selection", "trl"),
    timeout_s: float | None = None,
    log=lambda m: print(m, file=sys.stderr, flush=True),
) -> dict[str, Any]:
    """Seeds 0..seeds-1, each framework in its own process, a seed's runs side by side; the result dict
    (runs, summary per framework and evaluation step, settings that differ); ``task``: the demo's sum when None."""
    task = LearnTask() if task is None else task
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


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1:]))
