"""``grpokit pipeline PIPELINE.yaml``: run the stages of a pipeline file in order (``grpokit.pipeline.spec``),
each as a child process, evaluating after each one (``grpokit.pipeline.report``).

    grpokit pipeline r1.yaml                      # runs/NAME/01-..., 02-..., stages.md, stages.png
    grpokit pipeline r1.yaml --resume             # finished stages are skipped, a killed one continues
    grpokit pipeline r1.yaml --check              # check the file and every stage's config, run nothing
    grpokit pipeline --demo --output-dir DIR      # the embedded R1 demo (grpokit.demos.r1)

Signals: Ctrl-C reaches the running stage from the terminal (same process group) and the stage stops with
a checkpoint; SIGTERM sent to the pipeline is passed on to the stage. The pipeline then exits with the
stage's code (130 / 143), its state saying "running": ``--resume`` continues there. Exit codes otherwise as
``grpokit train``: 2 for a bad file or run tree (before any model loads), the stage's code when one fails.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from grpokit.pipeline.report import eval_hash, evaluate_model, print_table, stage_row, write_report
from grpokit.pipeline.spec import (
    BASE,
    Pipeline,
    PipelineError,
    can_resume,
    check_stage_configs,
    cpu_budget,
    lineage,
    missing_outputs,
    read_state,
    stage_command,
    stage_hash,
    stage_inputs,
    write_state,
)

PIPELINE_STATE = "pipeline.json"


def check_eval(pipe: Pipeline) -> None:
    """The eval: section's rewards resolve and its data loads (no model)."""
    if pipe.eval is None:
        return
    from grpokit.data.prompts import DataError, load_prompts
    from grpokit.pipeline.report import SCORES, _as_spec
    from grpokit.rewards import RewardConfigError, resolve_reward_specs

    try:
        specs = [_as_spec(pipe.eval[key]) for key in SCORES if pipe.eval.get(key)]
        resolve_reward_specs(specs)
        load_prompts(
            pipe.eval["data"],
            prompt_column=pipe.eval.get("prompt_column", "prompt"),
            limit=1,
            default_split="test",
        )
    except (RewardConfigError, DataError, ValueError) as e:
        raise PipelineError(f"{pipe.path}: eval: {e}") from None


def prepare_tree(pipe: Pipeline, out: Path, *, resume: bool, overwrite: bool) -> None:
    """Refuse to mix runs: a folder holding a pipeline run needs --resume or --overwrite."""
    if resume and overwrite:
        raise PipelineError(
            "--resume continues the pipeline in the output folder and --overwrite replaces it: give one."
        )
    if out.exists() and not out.is_dir():
        raise PipelineError(f"--output-dir {out} is a file, not a folder; choose another path.")
    holds = (out / PIPELINE_STATE).is_file()
    if holds and not resume and not overwrite:
        raise PipelineError(
            f"{out} already holds a pipeline run: continue it with --resume, replace it with --overwrite, "
            f"or choose another folder (--output-dir {out}-2)."
        )
    if overwrite and holds:
        for child in out.iterdir():
            if child.is_dir() and child.name[:2].isdigit() and child.name[2:3] == "-":
                shutil.rmtree(child)
        for name in (PIPELINE_STATE, "stages.md", "stages.json", "stages.png"):
            (out / name).unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    listing = [{"name": s.name, "kind": s.kind, "folder": s.folder} for s in pipe.stages]
    (out / PIPELINE_STATE).write_text(
        json.dumps({"name": pipe.name, "file": str(pipe.path), "stages": listing}, indent=2)
    )


def run_child(cmd: list[str], log) -> int:
    """Run a stage's command; SIGTERM to the pipeline is passed on, SIGINT left to the terminal (which
    sends it to the stage too). The stage dies with the pipeline (PR_SET_PDEATHSIG, Linux)."""
    log("$ " + " ".join(cmd))
    proc = subprocess.Popen(cmd, preexec_fn=_die_with_parent)
    previous = {
        signal.SIGTERM: signal.signal(signal.SIGTERM, lambda *_: proc.send_signal(signal.SIGTERM)),
        signal.SIGINT: signal.signal(signal.SIGINT, lambda *_: None),
    }
    try:
        return proc.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _die_with_parent() -> None:
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def run_pipeline(
    pipe: Pipeline,
    out: Path,
    *,
    resume: bool = False,
    overwrite: bool = False,
    rerun_changed: bool = False,
    log=None,
) -> int:
    """Every stage in order (module docstring); returns the exit code."""
    log = log or (lambda msg: print(f"pipeline: {msg}", file=sys.stderr, flush=True))
    check_stage_configs(pipe)
    check_eval(pipe)
    if resume:  # a changed finished stage: refused before anything runs (--overwrite replaces them all)
        _check_states(pipe, out, rerun_changed=rerun_changed)
    prepare_tree(pipe, out, resume=resume, overwrite=overwrite)
    rows: list[dict[str, Any]] = []
    if pipe.eval is not None and pipe.model is not None:
        state = read_state(out / f"00-{BASE}") or {}
        _evaluate(state, pipe, pipe.model, out / f"00-{BASE}", log)
        rows.append(stage_row(f"00-{BASE}", "model", state))
    hashes: dict[int, str] = {}
    outputs: dict[int, dict] = {}
    states: dict[int, dict] = {}  # the stage.json of each stage done
    for stage in pipe.stages:
        folder = out / stage.folder
        hashes[stage.index] = digest = stage_hash(stage, hashes, pipe)
        model, data = stage_inputs(pipe, stage, outputs)
        state = read_state(folder)
        if state is not None and state.get("hash") != digest:
            state = None  # --rerun-changed (_check_states refused it otherwise): start the stage again
        if state is not None and state.get("status") == "done":
            _check_outputs(stage, state, folder)
        if state is not None and state.get("status") == "done":
            log(f"{stage.folder}: done before, not rerun")
        else:
            resume_stage = state is not None and can_resume(stage, folder)
            budget = cpu_budget(pipe, stage, states)  # None without cpu_budget_of
            cmd = stage_command(
                stage, folder, model, data, resume=resume_stage, cpu_budget=budget and budget["seconds"]
            )
            state = {
                "name": stage.name,
                "kind": stage.kind,
                "hash": digest,
                "status": "running",
                "command": cmd,
                **({"cpu_budget": budget} if budget else {}),
            }
            write_state(folder, state)
            log(
                f"{stage.folder}: {'continuing' if resume_stage else 'starting'} ({stage.kind}, model {model})"
            )
            start = time.perf_counter()
            code = run_child(cmd, log)
            if code != 0:
                log(
                    f"{stage.folder} stopped with exit code {code}; stages before it are kept: fix what it says "
                    f"and continue with grpokit pipeline {pipe.path} --output-dir {out} --resume"
                )
                return code
            summary = json.loads((folder / "summary.json").read_text())
            made = {
                "model": model if stage.kind == "sample" else summary["checkpoint"],
                "data": summary.get("output"),
            }
            state.update(
                status="done", outputs=made, seconds=time.perf_counter() - start, summary=_brief(summary)
            )
            write_state(folder, state)
        outputs[stage.index], states[stage.index] = state["outputs"], state
        if pipe.eval is not None and stage.kind != "sample":
            _evaluate(state, pipe, state["outputs"]["model"], folder, log)
        rows.append(stage_row(stage.folder, stage.kind, state, parent=lineage(pipe, stage)))
        print_table(rows)
        write_report(out, rows)
    log(f"done: {out / 'stages.md'}, {out / 'stages.png'}")
    return 0


def _check_states(pipe: Pipeline, out: Path, *, rerun_changed: bool) -> None:
    """A stage whose hash differs from the one recorded in its folder is refused without --rerun-changed."""
    hashes: dict[int, str] = {}
    for stage in pipe.stages:
        hashes[stage.index] = digest = stage_hash(stage, hashes, pipe)
        state = read_state(out / stage.folder)
        if state is not None and state.get("status") == "done" and state.get("hash") == digest:
            _check_outputs(stage, state, out / stage.folder)
        if state is None or state.get("hash") == digest or rerun_changed:
            continue
        what = "finished" if state.get("status") == "done" else "left running"
        raise PipelineError(
            f"stage {stage.folder} changed since it {what} (its config, overrides or an input stage differ from "
            f"the run in {out / stage.folder}); set it back, or pass --rerun-changed to run it again and every "
            "stage that reads it"
        )


def _check_outputs(stage, state: dict[str, Any], folder: Path) -> None:
    """A stage recorded as done must still have what it made: stage.json alone is not trusted."""
    gone = missing_outputs(stage, state)
    if gone:
        raise PipelineError(
            f"{stage.folder}: stage.json says the stage finished, but {gone} (deleted?); restore it, or "
            f"remove {folder / 'stage.json'} to run the stage again"
        )


def _brief(summary: dict[str, Any]) -> dict[str, Any]:
    keys = (
        "steps",
        "checkpoint",
        "output",
        "rows",
        "prompts",
        "pass_rate_mean",
        "eval_accuracy_after",
        "train_seconds",
        "train_cpu_seconds",
        "seconds",
        "cpu_seconds",
        "budget_reached",
    )
    return {k: summary[k] for k in keys if k in summary}


def _evaluate(state: dict[str, Any], pipe: Pipeline, model: str, folder: Path, log) -> None:
    """Evaluate once per (model, eval settings): the result is kept in the stage's state."""
    digest = eval_hash(pipe.eval, model)
    if state.get("eval_hash") == digest:
        return
    log(f"{folder.name}: evaluating {model}")
    state["eval"] = evaluate_model(model, pipe.eval, progress=lambda line: log(f"{folder.name}: {line}"))
    state["eval_hash"] = digest
    write_state(folder, state)


# ----------------------------------------------------------------------------- command line
