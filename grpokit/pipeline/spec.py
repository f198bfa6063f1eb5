"""Multi-stage runs (``grpokit pipeline PIPELINE.yaml``): ordered stages of ``sft``, ``rl`` and ``sample``,
each run as its own ``python -m grpokit.cli.main sft | train | sample`` process, with their state kept in one output tree.
(Over 500 lines: the pipeline file's reading, its checks across stages (references, cycles, budgets, lineage)
and the state file a resume reads work on the same Stage and Pipeline and change together.)

    name: r1                        # output tree runs/NAME (or --output-dir)
    model: models/base              # the first stage's model; "base" in references
    eval: {data: eval.jsonl, accuracy: math_accuracy, format: format_lenient, language: language_consistency}
    stages:
      - {name: cold_start, kind: sft, config: sft.yaml}
      - {name: reason, kind: rl, config: rl.yaml, set: {train.steps: 200}}
      - {name: rejection, kind: sample, config: sample.yaml}
      - {name: distill, kind: sft, config: sft.yaml, model: base, data: rejection}
      - {name: final, kind: rl, config: rl.yaml}

A stage's model is the previous stage's final checkpoint (a ``sample`` stage passes its model on), unless
``model`` names an earlier stage, ``base`` or a path; ``data`` (its ``data.train``) may name an earlier
``sample`` stage, whose kept rows it then reads. ``set`` holds dotted overrides; ``config`` the stage's own
config file (relative paths: from the current folder, as everywhere in grpokit). ``cpu_budget_of: [a, b]``
gives an rl or sft stage the CPU seconds stages a and b used (their training steps; a sample stage's
sampling) as its train.max_cpu_seconds: an equal-compute comparison (the R1 demo's ``rl_alone``).

Output tree: ``NN-NAME/`` per stage (the stage's own output folder) with ``stage.json``: status
(running | done), the stage's hash (its kind, config file text, overrides and inputs, the hashes of the
stages it reads included), its command and outputs (model, data). ``--resume``: a done stage with the same
hash is never rerun; a changed one is refused unless ``--rerun-changed`` (which reruns it and, through the
hashes, every stage that reads it); a stage left running (killed) continues with its own ``--resume``
(from its newest checkpoint; a sample stage from its saved batches). Everything in the file is checked
(keys, kinds, references, each stage's config) before any model loads; problems are one-line
``PipelineError``s naming the stage.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from grpokit.core.errors import ConfigError
from grpokit.core.files import replace_whole

KINDS = ("sft", "rl", "sample")
"""Stage kinds."""
COMMANDS = {"sft": "sft", "rl": "train", "sample": "sample"}
"""The grpokit subcommand that runs each kind."""
TOP_KEYS = ("name", "model", "eval", "stages")
STAGE_KEYS = ("name", "kind", "config", "model", "data", "set", "cpu_budget_of")
EVAL_KEYS = (
    "data",
    "prompt_column",
    "template",
    "system_prompt",
    "max_prompt_tokens",
    "max_new_tokens",
    "limit",
    "accuracy",
    "format",
    "language",
)
BASE = "base"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class PipelineError(ConfigError):
    """A bad pipeline file, or a run tree that does not match it (exit code 2)."""


@dataclass
class Stage:
    """One stage as written in the file, its references resolved to stage indices."""

    index: int
    """0-based position in the file; the folder is f"{index + 1:02d}-{name}"."""
    name: str
    kind: str
    config: str | None = None
    model: str | None = None
    """A stage name, "base", a path, or None (the previous stage's model)."""
    data: str | None = None
    """A sample stage's name, a path, or None (the stage config's own data.train)."""
    overrides: list[str] = field(default_factory=list)
    """The ``set`` mapping as section.key=value strings, in file order."""
    cpu_budget_of: list[str] = field(default_factory=list)
    """Names of earlier stages: this one (rl or sft) trains for the CPU seconds they used together
    (train.max_cpu_seconds, set when it starts; ``cpu_budget``)."""

    @property
    def folder(self) -> str:
        return f"{self.index + 1:02d}-{self.name}"


@dataclass
class Pipeline:
    name: str
    model: str | None
    stages: list[Stage]
    eval: dict[str, Any] | None
    path: Path


def _nearest(key: str, options: tuple[str, ...]) -> str:
    match = difflib.get_close_matches(key, options, n=1, cutoff=0.5)
    return f"did you mean '{match[0]}'?" if match else f"valid keys: {', '.join(options)}"


def _check_keys(values: dict, allowed: tuple[str, ...], where: str) -> None:
    for key in values:
        if key not in allowed:
            raise PipelineError(f"{where}: unknown key '{key}'; {_nearest(str(key), allowed)}")


def _override_text(key: str, value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=1_000_000).strip()
    return f"{key}={text.removesuffix('...').strip()}"


def load_pipeline(path: str | Path) -> Pipeline:
    """Read and check a pipeline file: keys, stage kinds, names, references (no later stage, no cycle).
    Each stage's own config is checked by ``check_stage_configs``."""
    p = Path(path)
    if not p.is_file():
        raise PipelineError(f"pipeline file {p} does not exist")
    try:
        values = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise PipelineError(f"{p}: not valid YAML: {str(e).splitlines()[0]}") from None
    if not isinstance(values, dict):
        raise PipelineError(f"{p}: the top level must be a mapping with stages: (and name:, model:, eval:)")
    _check_keys(values, TOP_KEYS, str(p))
    raw_stages = values.get("stages")
    if not isinstance(raw_stages, list) or not raw_stages:
        raise PipelineError(f"{p}: stages: must be a non-empty list, e.g. [{{kind: rl, config: rl.yaml}}]")
    stages = [_read_stage(p, i, raw) for i, raw in enumerate(raw_stages)]
    _name_stages(p, stages, raw_stages)
    model = values.get("model")
    if model is not None and not isinstance(model, str):
        raise PipelineError(f"{p}: model: expected a path or hub id, got {model!r}")
    evaluation = values.get("eval")
    if evaluation is not None:
        if not isinstance(evaluation, dict) or "data" not in evaluation:
            raise PipelineError(
                f"{p}: eval: expected a mapping with data: (held-out prompts), e.g. {{data: eval.jsonl}}"
            )
        _check_keys(evaluation, EVAL_KEYS, f"{p}: eval")
    _check_references(p, stages, model)
    name = values.get("name") or p.stem
    if not isinstance(name, str) or not _NAME.match(name):
        raise PipelineError(f"{p}: name: {name!r} must be letters, digits, '_', '-' or '.', e.g. r1-demo")
    return Pipeline(name=name, model=model, stages=stages, eval=evaluation, path=p)


def _read_stage(p: Path, i: int, raw: Any) -> Stage:
    where = f"{p}: stages[{i}]"
    if not isinstance(raw, dict):
        raise PipelineError(f"{where}: expected a mapping such as {{kind: rl, config: rl.yaml}}, got {raw!r}")
    _check_keys(raw, STAGE_KEYS, where)
    kind = raw.get("kind")
    if kind not in KINDS:
        raise PipelineError(f"{where}: unknown stage kind {kind!r}; expected one of {', '.join(KINDS)}")
    for key in ("name", "config", "model", "data"):
        if raw.get(key) is not None and not isinstance(raw[key], str):
            raise PipelineError(f"{where}.{key}: expected a string, got {raw[key]!r}")
    settings = raw.get("set") or {}
    if not isinstance(settings, dict):
        raise PipelineError(f"{where}.set: expected a mapping of dotted keys, e.g. {{train.steps: 100}}")
    overrides = [_override_text(str(k), v) for k, v in settings.items()]
    budget_of = raw.get("cpu_budget_of") or []
    if not isinstance(budget_of, list) or not all(isinstance(name, str) for name in budget_of):
        raise PipelineError(
            f"{where}.cpu_budget_of: expected a list of earlier stages' names, e.g. [reason, distill], "
            f"got {budget_of!r}"
        )
    if budget_of and kind == "sample":
        raise PipelineError(
            f"{where}.cpu_budget_of: a sample stage has no training to limit; give it to an rl or sft stage"
        )
    if budget_of and "train.max_cpu_seconds" in settings:
        raise PipelineError(
            f"{where}: cpu_budget_of sets train.max_cpu_seconds from the stages it names; remove "
            "set.train.max_cpu_seconds (or cpu_budget_of)"
        )
    return Stage(
        i, raw.get("name") or "", kind, raw.get("config"), raw.get("model"), raw.get("data"), overrides, budget_of
    )


def _name_stages(p: Path, stages: list[Stage], raw: list) -> None:
    """Unnamed stages take their kind as name, or kind-N when the kind occurs more than once."""
    counts = {kind: sum(s.kind == kind for s in stages) for kind in KINDS}
    seen_kind: dict[str, int] = {}
    for s in stages:
        seen_kind[s.kind] = seen_kind.get(s.kind, 0) + 1
        if not s.name:
            s.name = s.kind if counts[s.kind] == 1 else f"{s.kind}-{seen_kind[s.kind]}"
    names: dict[str, int] = {}
    for s in stages:
        if not _NAME.match(s.name) or s.name == BASE:
            raise PipelineError(
                f"{p}: stages[{s.index}].name={s.name!r}: letters, digits, '_', '-' or '.', and not '{BASE}'"
            )
        if s.name in names:
            raise PipelineError(
                f"{p}: stages[{s.index}].name={s.name!r} is also stages[{names[s.name]}]'s name"
            )
        names[s.name] = s.index


def _check_references(p: Path, stages: list[Stage], model: str | None) -> None:
    """Edges stage -> stage it reads; a cycle, a later stage, or data from a non-sample stage is an error."""
    by_name = {s.name: s for s in stages}
    for s in stages:
        for ref in s.cpu_budget_of:
            if ref not in by_name:
                raise PipelineError(
                    f"{p}: stages[{s.index}] ({s.name}).cpu_budget_of names {ref!r}, which is no stage; "
                    f"{_nearest(ref, tuple(by_name))}"
                )
    edges = {
        s.index: [
            (key, by_name[ref].index) for key, ref in (("model", s.model), ("data", s.data)) if ref in by_name
        ]
        + [("cpu_budget_of", by_name[ref].index) for ref in s.cpu_budget_of]
        for s in stages
    }
    cycle = _find_cycle(edges)
    if cycle:
        path = " -> ".join(stages[i].name for i in cycle)
        raise PipelineError(
            f"{p}: the stages read each other in a cycle ({path}); a stage reads only earlier stages"
        )
    for s in stages:
        for key, target in edges[s.index]:
            if target > s.index:
                raise PipelineError(
                    f"{p}: stages[{s.index}] ({s.name}).{key}={stages[target].name!r} reads the output of a later "
                    f"stage (stages[{target}]); a stage reads only stages before it: reorder them"
                )
            if key == "data" and stages[target].kind != "sample":
                raise PipelineError(
                    f"{p}: stages[{s.index}] ({s.name}).data={stages[target].name!r} is a {stages[target].kind} "
                    "stage, which writes no data; name a sample stage or a data file"
                )
    if stages[0].model is None and model is None:
        raise PipelineError(f"{p}: the first stage has no model: set model: at the top (or in stages[0])")
    if any(s.model == BASE for s in stages) and model is None:
        raise PipelineError(f"{p}: a stage reads model: {BASE}, but the file sets no model: at the top")


def _find_cycle(edges: dict[int, list[tuple[str, int]]]) -> list[int] | None:
    """A cycle of the graph as [a, b, ..., a], or None (depth-first search, colours white/grey/black)."""
    colour = dict.fromkeys(edges, 0)
    stack: list[int] = []

    def visit(node: int) -> list[int] | None:
        colour[node] = 1
        stack.append(node)
        for _, nxt in edges[node]:
            if colour[nxt] == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if colour[nxt] == 0:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        colour[node] = 2
        return None

    for node in edges:
        if colour[node] == 0:
            found = visit(node)
            if found:
                return found
    return None


# ----------------------------------------------------------------------------- inputs, hashes, commands


def stage_inputs(pipe: Pipeline, stage: Stage, outputs: dict[int, dict]) -> tuple[str | None, str | None]:
    """(model, data) a stage reads, given the outputs {index: {"model", "data"}} of the stages before it.
    A placeholder "<NAME's model>" stands for an output not made yet (checking before anything runs)."""
    by_name = {s.name: s for s in pipe.stages}

    def output(index: int, what: str) -> str:
        return (outputs.get(index) or {}).get(what) or f"<{pipe.stages[index].name}'s {what}>"

    if stage.model is None:
        model = pipe.model if stage.index == 0 else output(stage.index - 1, "model")
    elif stage.model == BASE:
        model = pipe.model
    elif stage.model in by_name:
        model = output(by_name[stage.model].index, "model")
    else:
        model = stage.model
    data = output(by_name[stage.data].index, "data") if stage.data in by_name else stage.data
    return model, data


def stage_overrides(
    stage: Stage, model: str | None, data: str | None, cpu_budget: float | None = None
) -> list[str]:
    """The stage's own overrides followed by the pipeline's model, data and CPU budget (which win)."""
    out = list(stage.overrides)
    if model is not None:
        out.append(f"model.name_or_path={model}")
    if data is not None:
        out.append(f"data.train={data}")
    if cpu_budget is not None:
        out.append(f"train.max_cpu_seconds={cpu_budget!r}")
    return out


def used_cpu_seconds(state: dict[str, Any]) -> tuple[float, float] | None:
    """(CPU, wall) seconds a done stage's work took, from its state's summary: the training steps of an sft or
    rl stage (train_cpu_seconds, train_seconds), a sample stage's whole sampling (cpu_seconds, seconds);
    None when they were not recorded."""
    summary = state.get("summary") or {}
    cpu = summary.get("train_cpu_seconds", summary.get("cpu_seconds"))
    wall = summary.get("train_seconds", summary.get("seconds"))
    return None if cpu is None else (float(cpu), float(wall or 0.0))


def cpu_budget(pipe: Pipeline, stage: Stage, states: dict[int, dict[str, Any]]) -> dict[str, Any] | None:
    """The CPU seconds the stages of ``stage.cpu_budget_of`` used together (``used_cpu_seconds``), given the
    states {index: stage.json} of the stages done before it: {"seconds", "wall_seconds", "of": {name: CPU s}};
    None without cpu_budget_of. A named stage that recorded none is a PipelineError."""
    if not stage.cpu_budget_of:
        return None
    by_name = {s.name: s for s in pipe.stages}
    of, wall = {}, 0.0
    for name in stage.cpu_budget_of:
        used = used_cpu_seconds(states.get(by_name[name].index) or {})
        if used is None:
            raise PipelineError(
                f"stages[{stage.index}] ({stage.name}).cpu_budget_of: stage {by_name[name].folder} recorded no CPU "
                "seconds (it ran before grpokit recorded them); remove its stage.json to run it again"
            )
        of[name], wall = used[0], wall + used[1]
    return {"seconds": sum(of.values()), "wall_seconds": wall, "of": of}


def lineage(pipe: Pipeline, stage: Stage) -> str | None:
    """The folder of the stage this one grows from, for the plot across stages: the sample stage whose rows it
    trains on, else the stage (or "00-base") whose model it starts from; None for a model given by path."""
    by_name = {s.name: s for s in pipe.stages}
    if stage.data in by_name:
        return by_name[stage.data].folder
    if stage.model is None:
        return pipe.stages[stage.index - 1].folder if stage.index > 0 else f"00-{BASE}"
    if stage.model == BASE:
        return f"00-{BASE}"
    return by_name[stage.model].folder if stage.model in by_name else None


def stage_hash(stage: Stage, hashes: dict[int, str], pipe: Pipeline) -> str:
    """sha256 of what decides a stage's result: kind, config file text, overrides, and its inputs (an
    earlier stage by that stage's hash, so a rerun upstream changes every stage that reads it)."""
    by_name = {s.name: s for s in pipe.stages}

    def ref(value: str | None, default_index: int | None) -> str | None:
        if value is None and default_index is not None and default_index >= 0:
            return "stage:" + hashes[default_index]
        if value == BASE or (value is None and default_index == -1):
            return "model:" + str(pipe.model)
        if value in by_name:
            return "stage:" + hashes[by_name[value].index]
        return value

    config_text = Path(stage.config).read_text() if stage.config else None
    blob = {
        "kind": stage.kind,
        "config": config_text,
        "set": stage.overrides,
        "model": ref(stage.model, stage.index - 1),
        "data": ref(stage.data, None),
    }
    if stage.cpu_budget_of:  # only then: the hashes of stages without one stay what they were
        blob["cpu_budget_of"] = [ref(name, None) for name in stage.cpu_budget_of]
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:16]


_DATA_SUFFIXES = (".jsonl", ".ndjson", ".json", ".csv", ".tsv", ".parquet", ".pq", ".arrow", ".txt", ".yaml")


def missing_local_path(value: str | None) -> bool:
    """True when `value` names a local file or folder that does not exist; a hub id (``name`` or
    ``owner/name``, not starting with ".", "~" or "/", without a data file's extension) is not local."""
    if not value or value.startswith("<") or any(ch in value for ch in "*?["):
        return False
    path = Path(value).expanduser()
    if path.exists():
        return False
    parts = value.split("/")
    hub_id = (
        len(parts) <= 2
        and all(parts)
        and not value.startswith((".", "~", "/"))
        and path.suffix.lower() not in _DATA_SUFFIXES
    )
    return not hub_id


def check_inputs(pipe: Pipeline) -> None:
    """The base model and every model, data file and config a stage names that is a local path exists."""
    names = {s.name for s in pipe.stages} | {BASE}
    if missing_local_path(pipe.model):
        raise PipelineError(f"{pipe.path}: model: {pipe.model} does not exist (looked in {Path.cwd()})")
    for stage in pipe.stages:
        where = f"stages[{stage.index}] ({stage.name})"
        for key, value in (("model", stage.model), ("data", stage.data)):
            if value not in names and missing_local_path(value):
                raise PipelineError(f"{where}.{key}: {value} does not exist (looked in {Path.cwd()})")
        for override in stage.overrides:
            key, _, value = override.partition("=")
            if key in ("model.name_or_path", "data.train", "data.eval") and missing_local_path(value):
                raise PipelineError(f"{where}.set.{key}: {value} does not exist (looked in {Path.cwd()})")


def check_stage_configs(pipe: Pipeline) -> None:
    """Each stage's config as its command would read it (placeholders for outputs not made yet), checked
    without loading a model: unknown keys and bad values are errors naming the stage; so are local models
    and data files that do not exist (`check_inputs`)."""
    check_inputs(pipe)
    for stage in pipe.stages:
        if stage.config and not Path(stage.config).is_file():
            raise PipelineError(f"stages[{stage.index}] ({stage.name}).config: {stage.config} does not exist")
        model, data = stage_inputs(pipe, stage, {})
        overrides = [*stage_overrides(stage, model, data), "train.output_dir=<pipeline>"]
        try:
            CHECKERS[stage.kind](stage.config, overrides)
        except ConfigError as e:
            raise PipelineError(f"stages[{stage.index}] ({stage.name}, {stage.kind}): {e}") from None


def _check_rl(config: str | None, overrides: list[str]) -> None:
    from grpokit.config.schema import load_config

    load_config(config, overrides)


def _check_sample(config: str | None, overrides: list[str]) -> None:
    from grpokit.trainers.sample import load_sample_config

    load_sample_config(
        config, [o if not o.startswith("train.output_dir=") else "output.dir=<pipeline>" for o in overrides]
    )


def _check_sft(config: str | None, overrides: list[str]) -> None:
    """The SFT stage's config, checked as ``grpokit sft`` checks it."""
    from grpokit.config.sft import load_sft_config

    load_sft_config(config, overrides)


CHECKERS = {"rl": _check_rl, "sample": _check_sample, "sft": _check_sft}


def stage_command(
    stage: Stage, folder: Path, model: str | None, data: str | None, resume: bool, cpu_budget: float | None = None
) -> list[str]:
    """The command line of a stage: ``python -m grpokit.cli.main COMMAND [CONFIG] overrides --output-dir DIR``,
    with ``--resume`` to continue a stage left running, else ``--overwrite`` (a fresh start replaces a
    folder left without a checkpoint); ``cpu_budget``: its train.max_cpu_seconds (``cpu_budget_of``)."""
    import sys

    cmd = [sys.executable, "-m", "grpokit.cli.main", COMMANDS[stage.kind]]
    if stage.config:
        cmd.append(stage.config)
    cmd += stage_overrides(stage, model, data, cpu_budget)
    cmd += ["--output-dir", str(folder), "--resume" if resume else "--overwrite"]
    return cmd


def read_state(folder: Path) -> dict[str, Any] | None:
    """The stage's stage.json, None when there is none. One that cannot be read is a PipelineError, never
    a reason to rerun the stage silently (it is written whole, by rename: a kill cannot tear it)."""
    path = folder / "stage.json"
    if not path.is_file():
        return None
    try:
        state = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise PipelineError(
            f"{path} is not valid JSON ({type(e).__name__}: {str(e).splitlines()[0][:120]}): it was changed "
            "outside grpokit; remove it to run the stage again, or --overwrite to rerun every stage"
        ) from None
    if not isinstance(state, dict):
        raise PipelineError(
            f"{path} is not a stage state (a JSON object): remove it to run the stage again, or --overwrite "
            "to rerun every stage"
        )
    return state


def missing_outputs(stage: Stage, state: dict[str, Any]) -> str | None:
    """What a stage recorded as done lacks in its folder: the checkpoint (sft, rl) or the samples file
    (sample) its state names; None when they are there."""
    outputs = state.get("outputs")
    if not isinstance(outputs, dict):
        return "its outputs are not recorded"
    wanted = [("data", outputs.get("data"))] if stage.kind == "sample" else [("model", outputs.get("model"))]
    for what, path in wanted:
        if not path or not Path(path).exists():
            return f"its {what} {path} is missing"
    return None


def write_state(folder: Path, state: dict[str, Any]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    replace_whole(folder / "stage.json", json.dumps(state, indent=2))


def can_resume(stage: Stage, folder: Path) -> bool:
    """Whether the stage's own --resume has something to continue from: a checkpoint (sft, rl) or saved
    batches (sample)."""
    if stage.kind == "sample":
        return (folder / "candidates").is_dir()
    from grpokit.model.checkpoint import list_checkpoints

    return bool(list_checkpoints(folder / "checkpoints"))
