"""Does the R1 recipe beat RL alone at the same compute? The embedded R1 demo (``grpokit.demos.r1``) over
several seeds, its two arms side by side:

    python -m grpokit.demos.r1_compare --seeds 0 1 2 --jobs 2 --output-dir runs/r1-compare
    python -m grpokit.demos.r1_compare --seeds 0 1 2 --jobs 2 --output-dir runs/r1-compare --resume

- recipe: cold_start -> reason (GRPO) -> rejection (sampling) -> distill (SFT of the base) -> final (GRPO);
  its score is the final stage's;
- RL alone: GRPO from the same seed's cold start for the CPU seconds that reason, rejection, distill and final
  used together (the pipeline's ``cpu_budget_of``: their training steps, and the sampling), measured as they
  ran; the cold start is shared, so neither arm is charged for it.

Compute is counted in CPU seconds (this process and its children: the reward workers; grpokit.core.clock):
on a shared machine the wall clock of the same work follows the other jobs, the CPU seconds barely move.
The wall seconds of the same stretches are reported beside them. Scores are the pipeline's held-out greedy
evaluation (the demo's 200 held-out sums): accuracy by ``math_accuracy``, format by ``format_lenient``.

Each seed is one ``grpokit pipeline`` process (``DIR/seed-N/``, its log ``DIR/seed-N.log``) with one torch
thread, at most ``--jobs`` at once; a seed seeds every stage's training and sampling (the base model and the
48 cold-start chains are the same for all). Results: ``DIR/r1_compare.json`` (every seed's stages and arms,
the summary: mean, sample standard deviation, min and max per arm, and the per-seed difference) and
``DIR/r1_compare.md``, printed too.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grpokit.demos.r1 import RECIPE_AFTER_COLD_START

ARMS = ("recipe", "rl_alone")
"""The two arms: the recipe (its score is the ``final`` stage's) and GRPO alone from the cold start."""
FINAL, RL_ALONE = "final", "rl_alone"


def run_seeds(
    out: Path,
    seeds: list[int],
    *,
    jobs: int = 2,
    resume: bool = False,
    write_pipeline: Callable[[Path, int], Path] | None = None,
    loads: list[float] | None = None,
    log=print,
) -> list[Path]:
    """One pipeline run per seed in ``out/seed-N`` (``write_pipeline(folder, seed)`` writes its file; default the
    demo's), at most ``jobs`` at once, each with OMP_NUM_THREADS=1; returns the seeds' folders. ``loads`` gets
    the machine's 1-minute load average every 30 s. A failed run stops the comparison with its log's tail (its
    finished stages are kept: --resume continues it)."""
    if write_pipeline is None:
        from grpokit.demos.r1 import write_demo_pipeline

        def write_pipeline(folder: Path, seed: int) -> Path:
            return write_demo_pipeline(folder, log=log, seed=seed)

    out.mkdir(parents=True, exist_ok=True)
    folders = [out / f"seed-{seed}" for seed in seeds]
    waiting = list(zip(seeds, folders))
    running: list[tuple[subprocess.Popen, Path, Any]] = []
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    next_load = time.monotonic()
    while waiting or running:
        if loads is not None and time.monotonic() >= next_load:
            loads.append(os.getloadavg()[0])
            next_load += 30.0
        while waiting and len(running) < jobs:
            seed, folder = waiting.pop(0)
            path = write_pipeline(folder, seed)
            cmd = [
                sys.executable,
                "-m",
                "grpokit.cli.main",
                "pipeline",
                str(path),
                "--output-dir",
                str(folder),
            ]
            if resume and (folder / "pipeline.json").is_file():
                cmd.append("--resume")
            log_file = open(out / f"{folder.name}.log", "a")  # noqa: SIM115 (closed when it ends)
            log(f"r1 compare: seed {seed}: {' '.join(cmd)} (log {log_file.name})")
            running.append(
                (subprocess.Popen(cmd, stdout=log_file, stderr=log_file, env=env), folder, log_file)
            )
        time.sleep(0.5)
        for entry in [e for e in running if e[0].poll() is not None]:
            proc, folder, log_file = entry
            running.remove(entry)
            log_file.close()
            if proc.returncode != 0:
                for other, _, other_log in running:
                    other.terminate()
                    other.wait()
                    other_log.close()
                tail = Path(log_file.name).read_text()[-3000:]
                raise SystemExit(f"r1 compare: {folder} failed (exit {proc.returncode}):\n{tail}")
            log(f"r1 compare: {folder.name} done")
    return folders


def read_seed(folder: Path) -> dict[str, Any]:
    """A finished seed's stages (``stages.json``: accuracy, format, work seconds) and its two arms."""
    rows = {row["stage"].split("-", 1)[1]: row for row in json.loads((folder / "stages.json").read_text())}
    missing = [name for name in (*RECIPE_AFTER_COLD_START, RL_ALONE) if name not in rows]
    if missing:
        raise SystemExit(
            f"r1 compare: {folder / 'stages.json'} has no stage {missing[0]!r}: is the run finished?"
        )
    alone_state = json.loads(next(folder.glob(f"*-{RL_ALONE}/stage.json")).read_text())
    alone = rows[RL_ALONE]
    recipe = {
        "accuracy": rows[FINAL]["accuracy"],
        "format": rows[FINAL]["format"],
        "cpu_s": sum(rows[name]["work_cpu_s"] for name in RECIPE_AFTER_COLD_START),
        "wall_s": sum(rows[name]["work_s"] for name in RECIPE_AFTER_COLD_START),
    }
    rl_alone = {
        "accuracy": alone["accuracy"],
        "format": alone["format"],
        "cpu_s": alone["work_cpu_s"],
        "wall_s": alone["work_s"],
        "budget_cpu_s": alone_state["cpu_budget"]["seconds"],
        "steps": alone_state["summary"]["steps"],
    }
    stages = {
        name: {key: row.get(key) for key in ("accuracy", "format", "work_s", "work_cpu_s", "note")}
        for name, row in rows.items()
    }
    return {"folder": str(folder), "stages": stages, "recipe": recipe, "rl_alone": rl_alone}


def spread(values: list[float]) -> dict[str, float]:
    """mean, sample standard deviation (0 for one value), min and max.

    >>> spread([0.5, 0.6, 0.7])["std"]  # deviations -0.1, 0, 0.1: sqrt(0.02 / 2) = 0.1
    0.1
    """
    return {
        "mean": statistics.fmean(values),
        "std": round(statistics.stdev(values), 12) if len(values) > 1 else 0.0,
        "min": min(values),
        "max": max(values),
    }


def summarize(seeds: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Each arm's accuracy, format, CPU and wall seconds over the seeds (``spread``), RL alone's steps, each
    stage's accuracy, and the per-seed difference RL alone - recipe in accuracy."""
    runs = list(seeds.values())
    out: dict[str, Any] = {
        arm: {key: spread([r[arm][key] for r in runs]) for key in ("accuracy", "format", "cpu_s", "wall_s")}
        for arm in ARMS
    }
    out["rl_alone"]["steps"] = spread([r["rl_alone"]["steps"] for r in runs])
    out["accuracy_difference"] = spread([r["rl_alone"]["accuracy"] - r["recipe"]["accuracy"] for r in runs])
    names = [
        name for name in runs[0]["stages"] if all(r["stages"][name]["accuracy"] is not None for r in runs)
    ]
    out["stages"] = {name: spread([r["stages"][name]["accuracy"] for r in runs]) for name in names}
    return out


def compare(folders: list[Path], seeds: list[int]) -> dict[str, Any]:
    """The comparison's result from finished seed folders: {"seeds": {seed: read_seed}, "summary": summarize}."""
    per_seed = {seed: read_seed(folder) for seed, folder in zip(seeds, folders)}
    return {"seeds": per_seed, "summary": summarize(per_seed)}


def _pm(s: dict[str, float], percent: bool, digits: int = 1) -> str:
    if percent:
        return f"{100 * s['mean']:.1f} ± {100 * s['std']:.1f}% ({100 * s['min']:.1f}-{100 * s['max']:.1f})"
    return f"{s['mean']:.{digits}f} ± {s['std']:.{digits}f}"


def table_markdown(result: dict[str, Any]) -> str:
    """The arms (mean ± sample standard deviation over the seeds, min-max) and each seed's numbers."""
    s = result["summary"]
    n = len(result["seeds"])
    lines = [
        f"| arm ({n} seeds) | accuracy | format | train CPU s | train wall s | steps |",
        "|---|---|---|---|---|---|",
    ]
    for arm, label in (("recipe", "recipe (reason + rejection + distill + final)"), ("rl_alone", "RL alone")):
        steps = _pm(s[arm]["steps"], False, digits=0) if "steps" in s[arm] else ""
        lines.append(
            f"| {label} | {_pm(s[arm]['accuracy'], True)} | {_pm(s[arm]['format'], True)} "
            f"| {_pm(s[arm]['cpu_s'], False)} | {_pm(s[arm]['wall_s'], False)} | {steps} |"
        )
    d = s["accuracy_difference"]
    lines += [
        "",
        f"RL alone - recipe, accuracy, per seed: {100 * d['mean']:+.1f} ± {100 * d['std']:.1f} points "
        f"({100 * d['min']:+.1f} to {100 * d['max']:+.1f}).",
        "",
        "| seed | "
        + " | ".join(s["stages"])
        + " | recipe CPU s | RL alone CPU s (budget) | RL alone steps |",
        "|---|" + "---|" * (len(s["stages"]) + 3),
    ]
    for seed, r in result["seeds"].items():
        accs = " | ".join(f"{100 * r['stages'][name]['accuracy']:.1f}%" for name in s["stages"])
        a = r["rl_alone"]
        lines.append(
            f"| {seed} | {accs} | {r['recipe']['cpu_s']:.1f} | {a['cpu_s']:.1f} ({a['budget_cpu_s']:.1f}) "
            f"| {a['steps']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m grpokit.demos.r1_compare", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="one pipeline run per seed")
    parser.add_argument("--jobs", type=int, default=2, help="pipeline runs at once (one per core)")
    parser.add_argument("--output-dir", type=Path, default=Path("runs/r1-compare"))
    parser.add_argument("--resume", action="store_true", help="continue the seeds' pipeline runs")
    args = parser.parse_args(argv)
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    t0, loads = time.perf_counter(), []
    folders = run_seeds(args.output_dir, args.seeds, jobs=args.jobs, resume=args.resume, loads=loads, log=log)
    result = compare(folders, args.seeds)
    result["run"] = {
        "command": "python -m grpokit.demos.r1_compare "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "started_utc": started,
        "ended_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "wall_s": time.perf_counter() - t0,
        "load_average_1min": spread(loads) | {"samples": len(loads), "every_s": 30},
        "jobs": args.jobs,
        "omp_num_threads": 1,
    }
    (args.output_dir / "r1_compare.json").write_text(json.dumps(result, indent=2))
    table = table_markdown(result)
    (args.output_dir / "r1_compare.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
