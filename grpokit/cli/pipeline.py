"""``grpokit pipeline PIPELINE.yaml | --demo``: a pipeline run (grpokit.pipeline.run) from the command line."""

from __future__ import annotations

import sys
from pathlib import Path

from grpokit.cli.args import fail
from grpokit.pipeline import run as pipeline_run
from grpokit.pipeline import spec


def add_pipeline_parser(subparsers, parents: list) -> None:
    p = subparsers.add_parser(
        "pipeline",
        help="run ordered sft / rl / sample stages from a pipeline file, resumably (the R1 recipe)",
        parents=parents,
        description=pipeline_run.__doc__.split("\n\n")[0].replace("``", ""),
    )
    p.add_argument("file", nargs="?", help="the pipeline YAML file")
    p.add_argument("--demo", action="store_true", help="the embedded R1 demo (tiny model, CPU, no download)")
    p.add_argument("--output-dir", help="the run tree (default runs/NAME)")
    p.add_argument(
        "--resume", action="store_true", help="continue: finished stages are kept, a killed one continues"
    )
    p.add_argument("--overwrite", action="store_true", help="replace the pipeline run in the output folder")
    p.add_argument("--rerun-changed", action="store_true", help="rerun finished stages whose config changed")
    p.add_argument("--check", action="store_true", help="check the file and each stage's config, run nothing")
    p.set_defaults(func=cmd_pipeline)


def cmd_pipeline(args) -> int:
    try:
        if args.demo == bool(args.file):
            raise spec.PipelineError("give a pipeline file, or --demo (with --output-dir) for the embedded demo")
        if args.output_dir == "":
            raise spec.PipelineError("--output-dir is empty: give the folder for the pipeline's stages (or leave it out)")
        if args.demo:
            from grpokit.demos.r1 import write_demo_pipeline

            out = Path(args.output_dir or "runs/r1-demo")
            path = write_demo_pipeline(out, log=lambda m: print(m, file=sys.stderr, flush=True))
        else:
            path = Path(args.file)
        pipe = spec.load_pipeline(path)
        out = Path(args.output_dir or f"runs/{pipe.name}")
        if args.check:
            spec.check_stage_configs(pipe)
            pipeline_run.check_eval(pipe)
            print(
                f"{path}: {len(pipe.stages)} stages, all checked: " + ", ".join(s.folder for s in pipe.stages)
            )
            return 0
        return pipeline_run.run_pipeline(
            pipe, out, resume=args.resume, overwrite=args.overwrite, rerun_changed=args.rerun_changed
        )
    except spec.PipelineError as e:
        return fail(args, f"pipeline: {e}", 2)
