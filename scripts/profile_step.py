"""Where a GRPO step's device time goes: torch.profiler over one bench step, after warm-up steps, phase by phase.

    python scripts/profile_step.py --model-size 0.5b --shape standard --out runs/profile.txt --json runs/profile.json
    python scripts/profile_step.py --model-size tiny --shape tiny --warmup 1      # a CPU smoke run

The bench's random model and shape (grpokit.bench), the bench's settings. Each phase of the step (generation, the
reference's and old log-probs, the update) is a profiler range (grpokit.bench.profile.MARKS); for each, printed and
written to ``--out`` (and as JSON to ``--json``): its wall time, the time its kernels (operators on a CPU) ran, the
gaps between them (the device idle, waiting on the host) with the largest named by the kernels on either side, and
its top kernels by time; then the whole step's top kernels and, on CUDA, its top operators by host time. A
diagnosis tool for the GPU sessions (scripts/gpu_session.sh, parts ``profile-update`` and ``profile-decode``).

On a GPU profile the decode apart from the passes: a whole step's decode is hundreds of thousands of kernel events,
whose processing by the profiler did not finish in 150 s on an H200 (2026-11-29). ``--skip generation`` profiles the
reference pass and the update; ``--skip reference --skip update --set rollout.max_new_tokens=24`` a short decode.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from grpokit.bench.model import build_random_model, n_words, random_prompts, random_reward
from grpokit.bench.profile import MARKS, format_report, mark_phases, phase_report, profile_spans
from grpokit.bench.run import bench_overrides, resolve_shape
from grpokit.config.schema import load_config
from grpokit.model.loading import load_tokenizer
from grpokit.trainers.grpo import GRPOTrainer


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-size", default="0.5b")
    ap.add_argument("--shape", default="standard")
    ap.add_argument("--warmup", type=int, default=2, help="unprofiled steps first (CUDA graphs are recorded in step 1)")
    ap.add_argument("--rows", type=int, default=15, help="kernels listed per phase, and rows of the step's tables")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a config override")
    ap.add_argument("--cache-dir", help="where the random model is built and kept (default $GRPOKIT_CACHE/bench)")
    ap.add_argument("--skip", action="append", default=[], choices=sorted(MARKS), metavar="PHASE",
                    help="a phase left out of the profile (run, not recorded): on a GPU the decode's thousands of "
                         "kernels a step make the profiler's own processing take minutes")  # fmt: skip
    ap.add_argument("--out", default="runs/profile.txt")
    ap.add_argument("--json", help="also write the per-phase report as JSON here")
    args = ap.parse_args(argv)
    if args.warmup < 0 or args.rows < 1:
        ap.error(f"--warmup must be >= 0 and --rows >= 1, got {args.warmup} and {args.rows}")

    _, shape = resolve_shape(args.shape)
    model_dir = build_random_model(args.model_size, args.cache_dir)
    steps = args.warmup + 1
    rows = random_prompts(shape.prompts * steps, shape.prompt_len, n_words(load_tokenizer(str(model_dir))), 0)
    opts = dict(dtype="auto", precision="auto", device="auto", gradient_checkpointing=True, full_length=True,
                engine="fast", kv_cache="auto", cuda_graphs=True, seed=0)  # fmt: skip
    cfg = load_config(None, [*bench_overrides(shape, steps, algo="grpo", beta=None, **opts), *args.set])
    cfg.model.name_or_path = str(model_dir)
    cfg.train.output_dir = tempfile.mkdtemp(prefix="grpokit-profile-")  # the run folder: not beside --out
    trainer = GRPOTrainer(cfg, train_rows=rows, reward_functions=[("random", random_reward(0), 1.0)],
                          overwrite=True)  # fmt: skip
    mark_phases(trainer)
    dev = trainer.learner.device
    cuda = dev.type == "cuda"

    for _ in range(args.warmup):
        trainer.train_step()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    prof = profile(activities=activities)
    for phase in args.skip:
        _pause_during(trainer, phase, prof, activities, dev if cuda else None)
    if cuda:
        torch.cuda.synchronize(dev)
    t0 = time.perf_counter()
    with prof:
        trainer.train_step()
        if cuda:
            torch.cuda.synchronize(dev)
    wall = time.perf_counter() - t0

    report = phase_report(*profile_spans(prof, cuda), top=args.rows)
    report = {phase: r for phase, r in report.items() if phase not in args.skip}
    kernel = "kernel" if cuda else "operator"
    device = torch.cuda.get_device_name(dev) if cuda else f"cpu ({torch.get_num_threads()} threads)"
    skipped = f"; not recorded: {', '.join(args.skip)}" if args.skip else ""
    lines = [f"device: {device}; shape {args.shape}, model {args.model_size}, overrides {args.set}{skipped}",
             f"profiled step: {wall:.3f} s wall clock (with the profiler's overhead)", ""]  # fmt: skip
    lines += format_report(report, kernel)
    events = prof.key_averages()
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    lines += ["", f"the whole step, top {args.rows} {kernel}s by self {'device' if cuda else 'CPU'} time:",
              events.table(sort_by=key, row_limit=args.rows, max_name_column_width=70)]  # fmt: skip
    if cuda:
        lines += ["", f"top {args.rows} operators by self CPU time (the host's side):",
                  events.table(sort_by="self_cpu_time_total", row_limit=args.rows, max_name_column_width=70)]  # fmt: skip
    text = "\n".join(lines)
    print(text)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text + "\n")
    result = {"device": device, "shape": args.shape, "model_size": args.model_size, "overrides": args.set,
              "step_wall_s": wall, "phases": report}  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return result


def _pause_during(trainer, phase: str, prof, activities, cuda_device) -> None:
    """Run ``phase``'s method (MARKS) with ``prof``'s collection off: the phase runs, nothing of it is recorded (its
    device work finished before collection resumes)."""
    part_path, method = MARKS[phase]
    part = trainer
    for attr in part_path.split("."):
        part = getattr(part, attr)
    fn = getattr(part, method)

    def paused(*args, **kwargs):
        prof.toggle_collection_dynamic(False, activities)
        try:
            return fn(*args, **kwargs)
        finally:
            if cuda_device is not None:
                torch.cuda.synchronize(cuda_device)
            prof.toggle_collection_dynamic(True, activities)

    setattr(part, method, paused)


if __name__ == "__main__":
    main()
