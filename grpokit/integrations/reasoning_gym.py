"""reasoning-gym (pip install 'grpokit[reasoning-gym]'): its procedural tasks as training and held-out data,
each task's own ``score_answer`` as the reward, pass rates per task in the metrics, and a curriculum that
raises a task's difficulty from its measured pass rate.

    data:
      train: reasoning_gym:basic_arithmetic?size=500&seed=1&max_digits=2   # a task, its config in the query
      eval: reasoning_gym:basic_arithmetic?size=100&seed=999&max_digits=2  # another seed: other problems
      # or a weighted mix, reasoning-gym's own composite config file: reasoning_gym:mix.yaml
    rewards:
      - name: grpokit.integrations.reasoning_gym:reasoning_gym_score    # the task's score_answer
      - {name: format_lenient, weight: 0.2}                               # grpokit's format reward beside it

A row: ``prompt`` (the task's question, or ``prompt=`` a template over the entry, e.g. "{metadata[expression]}="),
``answer``, ``task`` (the task's name) and ``entry`` (the whole reasoning-gym entry, what its scorer reads).
Query keys besides the task's own config: ``size`` (rows per epoch, 500), ``seed`` (0), ``epochs`` (1; N:
N x size rows, each epoch's drawn anew with its own seed, so a run of N passes never repeats a problem),
``prompt``. Values are read as YAML scalars (``operators=[+]`` is a list). A mix's file is reasoning-gym's
CompositeConfig YAML (size, seed, datasets: [{name, weight, config}]), plus ``epochs`` and ``prompt``.

The reward extracts the answer as reasoning-gym's own prompts ask for it (the last ``<answer>...</answer>``,
``reasoning_gym.utils.extract_answer``) and scores it with the row's task's ``score_answer(answer, entry)``
(partial credit where the task gives it); it logs ``pass/TASK`` (the share scoring 1) and ``score/TASK``
per task, which reach the metrics as reward/reasoning_gym_score/pass/TASK.
"""

from __future__ import annotations

import json
import math
import urllib.parse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from grpokit.core.errors import ConfigError

GRPOKIT_KEYS = ("size", "seed", "epochs", "prompt")
EPOCH_SEED_STRIDE = 1_000_003
"""Epoch e of a task draws its rows with seed + e x this (reasoning-gym's rows are a function of seed, index)."""


def _rg():
    try:
        import reasoning_gym
    except ImportError as e:
        raise ConfigError(
            f"reasoning-gym tasks need the reasoning-gym package ({e}); pip install 'grpokit[reasoning-gym]'"
        ) from e
    return reasoning_gym


def parse_source(target: str, where: str) -> dict[str, Any]:
    """'TASK?key=value&...' or 'mix.yaml' -> {"tasks": {name: weight}, "configs": {name: {...}}, "size",
    "seed", "epochs", "prompt"}; ConfigError naming ``where`` otherwise."""
    name, _, query = target.partition("?")
    if name.endswith((".yaml", ".yml")):
        path = Path(name)
        if not path.is_file():
            raise ConfigError(
                f"{where}: {path} is not a file (a reasoning-gym composite config: size, seed, datasets)"
            )
        try:
            data = yaml.safe_load(path.read_text()) or {}
            specs = data["datasets"]
            tasks = {d["name"]: float(d.get("weight", 1.0)) for d in specs}
            configs = {d["name"]: dict(d.get("config") or {}) for d in specs}
        except (yaml.YAMLError, KeyError, TypeError, ValueError) as e:
            raise ConfigError(
                f"{where}: {path} is not reasoning-gym's composite config (datasets: [{{name, weight, config}}]): "
                f"{type(e).__name__}: {e}"
            ) from None
        settings = {k: data[k] for k in GRPOKIT_KEYS if k in data}
    else:
        if not name:
            raise ConfigError(f"{where}: name a task, e.g. reasoning_gym:basic_arithmetic?size=500&seed=1")
        values = {}
        for pair in filter(None, query.split("&")):  # ('+' stays a plus: operators=[+])
            key, _, text = pair.partition("=")
            key, text = urllib.parse.unquote(key), urllib.parse.unquote(text)
            try:
                values[key] = text if key == "prompt" else yaml.safe_load(text)
            except yaml.YAMLError:
                values[key] = text
        settings = {k: values.pop(k) for k in GRPOKIT_KEYS if k in values}
        tasks, configs = {name: 1.0}, {name: values}
    for key, low in (("size", 1), ("epochs", 1), ("seed", 0)):
        value = settings.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
            raise ConfigError(f"{where}: {key}={value!r} must be an integer >= {low}")
    return {"tasks": tasks, "configs": configs, **settings}


def task_rows(
    tasks: str | dict[str, float],
    *,
    size: int = 500,
    seed: int = 0,
    configs: dict[str, dict] | None = None,
    epochs: int = 1,
    prompt: str | None = None,
    where: str = "reasoning_gym",
) -> list[dict]:
    """``epochs x size`` rows of a task, or of a weighted mix of tasks ({name: weight}: each row's task drawn
    with those weights, reasoning-gym's CompositeDataset), each task built with its ``configs`` entry (its
    config class's fields, e.g. max_digits). Epoch e is drawn with seed + e x EPOCH_SEED_STRIDE."""
    rg = _rg()
    from reasoning_gym.composite import CompositeConfig, CompositeDataset, DatasetSpec

    tasks = {tasks: 1.0} if isinstance(tasks, str) else dict(tasks)
    configs = configs or {}
    unknown = sorted(set(tasks) - set(rg.factory.DATASETS))
    if unknown:
        raise ConfigError(
            f"{where}: {unknown[0]!r} is not a reasoning-gym task; the tasks are {sorted(rg.factory.DATASETS)}"
        )
    rows: list[dict] = []
    for epoch in range(epochs):
        epoch_seed = seed + epoch * EPOCH_SEED_STRIDE
        try:
            if len(tasks) == 1:
                (name,) = tasks
                dataset = rg.create_dataset(
                    name, **{**configs.get(name, {}), "size": size, "seed": epoch_seed}
                )
            else:
                specs = [
                    DatasetSpec(name, float(w), dict(configs.get(name, {}))) for name, w in tasks.items()
                ]
                config = CompositeConfig(size=size, seed=epoch_seed, datasets=specs)
                config.validate()
                dataset = CompositeDataset(config)
        except (TypeError, ValueError, AssertionError) as e:
            raise ConfigError(f"{where}: reasoning-gym refused the config: {type(e).__name__}: {e}") from None
        for index in range(size):
            entry = dataset[index]
            rows.append(as_row(entry, prompt, where))
    return rows


def as_row(entry: dict, prompt: str | None, where: str) -> dict:
    """A reasoning-gym entry (question, answer, metadata) as a grpokit row."""
    task = entry["metadata"].get("source_dataset")
    text = entry["question"]
    if prompt is not None:
        try:
            text = prompt.format(**entry)
        except (KeyError, IndexError, AttributeError, ValueError) as e:
            raise ConfigError(
                f"{where}: prompt={prompt!r} cannot be filled from a {task} entry ({type(e).__name__}: {e}); "
                f"its fields: question, answer, metadata{sorted(entry['metadata'])}"
            ) from None
    # the entry as JSON-able data (reasoning-gym keeps tuples in metadata): what its scorer reads back
    plain = json.loads(json.dumps({k: entry[k] for k in ("question", "answer", "metadata")}, default=str))
    return {"prompt": text, "answer": str(entry["answer"]), "task": task, "entry": plain}


def load_rows(target: str, source: str, prompt_column: str | None, limit: int | None) -> list[dict]:
    """The data loader of 'reasoning_gym:TARGET' (grpokit.data.prompts.SOURCE_KINDS)."""
    where = f"data {source!r}"
    spec = parse_source(target, where)
    if prompt_column not in (None, "prompt"):
        raise ConfigError(
            f"{where}: reasoning-gym rows hold their prompt in 'prompt'; set data.prompt_column=prompt"
        )
    rows = task_rows(
        spec["tasks"], size=spec.get("size", 500), seed=spec.get("seed", 0), configs=spec["configs"],
        epochs=spec.get("epochs", 1), prompt=spec.get("prompt"), where=where,
    )  # fmt: skip
    return rows[:limit] if limit else rows


_SCORERS: dict[str, Callable] = {}


def _scorer(task: str) -> Callable:
    if task not in _SCORERS:
        _SCORERS[task] = _rg().get_score_answer_fn(task)
    return _SCORERS[task]


def reasoning_gym_score(
    prompts: Sequence, completions: Sequence, task: Sequence[str], entry: Sequence[dict], **kwargs: Any
) -> list[float]:
    """Each completion scored by its row's reasoning-gym task: the last <answer>...</answer> block (None when
    there is none: 0) through the task's score_answer(answer, entry). Logs pass/TASK (1 when it scored 1) and
    score/TASK."""
    from reasoning_gym.utils import extract_answer

    log_metric = kwargs.get("log_metric")
    out = []
    for completion, name, row in zip(completions, task, entry):
        text = completion if isinstance(completion, str) else _last_assistant_text(completion)
        answer = extract_answer(text)
        value = float(_scorer(name)(answer, row)) if answer is not None else 0.0
        if not math.isfinite(value):
            raise ValueError(f"{name}'s score_answer gave {value!r} for the answer {answer[:80]!r}")
        if log_metric is not None:
            log_metric(f"pass/{name}", float(value >= 1.0))
            log_metric(f"score/{name}", value)
        out.append(value)
    return out


reasoning_gym_score.per_completion = True
reasoning_gym_score.columns = ("task", "entry")


def _last_assistant_text(messages: object) -> str:
    """A chat completion's text (TRL's message-list shape): its last assistant message."""
    if isinstance(messages, list):
        for m in reversed(messages):
            if isinstance(m, dict) and m.get("role") == "assistant":
                return str(m.get("content") or "")
    return str(messages)


class Curriculum:
    """A callback (``GRPOTrainer(..., callbacks=[Curriculum(...)])``) that raises a reasoning-gym task's
    difficulty from its measured pass rate: when the mean of reward/REWARD/pass/TASK over the last ``window``
    steps reaches ``raise_at``, the task's curriculum goes up a level (reasoning-gym's
    ``increment_global_level``) and the task's training rows are drawn anew at that level (the same count,
    a fresh seed), in place: the prompt stream's order is kept. ``config``: the task's fixed settings (the
    curriculum sets only its own attributes); ``prompt``: as the data's. ``levels[task]`` and ``changes``
    (step, task, level) say what it did. Synchronous runs only: an asynchronous run's rows live in its
    sampler process."""

    def __init__(
        self,
        tasks: str | Sequence[str],
        *,
        raise_at: float = 0.8,
        window: int = 3,
        config: dict[str, dict] | None = None,
        prompt: str | None = None,
        seed: int = 0,
        reward: str = "reasoning_gym_score",
    ):
        rg = _rg()
        from reasoning_gym.factory import create_curriculum, has_curriculum

        self.tasks = [tasks] if isinstance(tasks, str) else list(tasks)
        missing = [t for t in self.tasks if not has_curriculum(t)]
        if missing:
            raise ConfigError(f"Curriculum: reasoning-gym has no curriculum for {missing[0]!r}")
        if not 0 < raise_at <= 1 or window < 1:
            raise ConfigError("Curriculum: raise_at must be in (0, 1] and window >= 1")
        self.rg, self.raise_at, self.window, self.reward = rg, raise_at, window, reward
        self.config, self.prompt, self.seed = config or {}, prompt, seed
        self.curricula = {t: create_curriculum(t) for t in self.tasks}
        self.levels = dict.fromkeys(self.tasks, 0)
        self.rates: dict[str, list[float]] = {t: [] for t in self.tasks}
        self.changes: list[tuple[int, str, int]] = []

    def __call__(self, step: int, metrics: dict[str, float], trainer) -> None:
        if trainer.cfg.rollout.max_staleness:
            raise ConfigError(
                "Curriculum changes the training rows, which an asynchronous run's sampler process holds"
            )
        for task in self.tasks:
            rate = metrics.get(f"reward/{self.reward}/pass/{task}")
            if rate is None:
                continue
            recent = self.rates[task]
            recent.append(rate)
            del recent[: -self.window]
            if len(recent) == self.window and sum(recent) / self.window >= self.raise_at:
                if self.curricula[task].increment_global_level():
                    self.levels[task] += 1
                    self.redraw(trainer, task, step)
                    self.changes.append((step, task, self.levels[task]))
                    recent.clear()

    def redraw(self, trainer, task: str, step: int) -> None:
        """The task's rows of the sampler drawn anew at the curriculum's level (and their token ids)."""
        from grpokit.data.templates import encode_prompts

        sampler = trainer.sampler
        at = [i for i, row in enumerate(sampler.train_rows) if row.get("task") == task]
        if not at:
            return
        level_seed = self.seed + EPOCH_SEED_STRIDE * (1000 + self.levels[task])
        config = self.curricula[task].generate_configuration(
            {**self.config.get(task, {}), "size": len(at), "seed": level_seed}
        )
        dataset = self.rg.create_dataset(task, **vars(config))
        rows = [as_row(dataset[k], self.prompt, f"Curriculum {task}") for k in range(len(at))]
        data = trainer.cfg.data
        ids = encode_prompts(
            [row[data.prompt_column] for row in rows], trainer.tokenizer, template=data.template,
            system_prompt=data.system_prompt, max_prompt_tokens=data.max_prompt_tokens,
            chat_template_kwargs=data.chat_template_kwargs,
        )  # fmt: skip
        for k, i in enumerate(at):
            sampler.train_rows[i] = rows[k]
            sampler.encoded[i] = ids[k]
        trainer.say(
            f"curriculum: step {step}: {task} raised to level {self.levels[task]} ({len(at)} rows redrawn)"
        )
