"""Where a GRPO step's device time goes: torch.profiler over one bench step, after warm-up steps.

    python scripts/profile_step.py --model-size 0.5b --shape standard --out runs/profile.txt

The bench's random model and shape (grpokit.bench), the bench's settings; the phases of the step
(rollout, old/reference log-probs, update) are marked as profiler ranges, so the table shows each
phase's device time beside the kernels that fill it. Prints, and writes to ``--out``: the phases, the
top kernels by self device time, the top operators by self CPU time, and the step's wall clock against
the summed kernel time (how much of the step the device sat idle waiting for the host). A diagnosis
tool for the GPU sessions (scripts/gpu_session.sh, part ``profile``); it asserts nothing.
"""

from __future__ import annotations

import argparse
import functools
import tempfile
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from grpokit.bench.model import build_random_model, n_words, random_prompts, random_reward
from grpokit.bench.run import bench_overrides, resolve_shape
from grpokit.config.schema import load_config
from grpokit.model.loading import load_tokenizer
from grpokit.trainers.grpo import GRPOTrainer


def marked(label: str, fn):
    """``fn`` run inside a profiler range named ``label``."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        with record_function(label):
            return fn(*args, **kwargs)

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-size", default="0.5b")
    ap.add_argument("--shape", default="standard")
    ap.add_argument("--warmup", type=int, default=2, help="unprofiled steps first (CUDA graphs are recorded in step 1)")
    ap.add_argument("--rows", type=int, default=30, help="rows of each table")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a config override")
    ap.add_argument("--out", default="runs/profile.txt")
    args = ap.parse_args()

    _, shape = resolve_shape(args.shape)
    model_dir = build_random_model(args.model_size)
    steps = args.warmup + 1
    rows = random_prompts(shape.prompts * steps, shape.prompt_len, n_words(load_tokenizer(str(model_dir))), 0)
    opts = dict(dtype="auto", precision="auto", device="auto", gradient_checkpointing=True, full_length=True,
                engine="fast", kv_cache="auto", cuda_graphs=True, seed=0)
    cfg = load_config(None, [*bench_overrides(shape, steps, algo="grpo", beta=None, **opts), *args.set])
    cfg.model.name_or_path = str(model_dir)
    cfg.train.output_dir = tempfile.mkdtemp(prefix="grpokit-profile-")  # the run folder: not beside --out
    trainer = GRPOTrainer(cfg, train_rows=rows, reward_functions=[("random", random_reward(0), 1.0)],
                          overwrite=True)
    trainer.sampler.rollout = marked("phase: rollout (generate + score)", trainer.sampler.rollout)
    trainer.updater.rollout_logprobs = marked("phase: old/reference log-probs", trainer.updater.rollout_logprobs)
    trainer.updater.update = marked("phase: update", trainer.updater.update)
    dev = trainer.learner.device
    cuda = dev.type == "cuda"

    for _ in range(args.warmup):
        trainer.train_step()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    if cuda:
        torch.cuda.synchronize(dev)
    t0 = time.perf_counter()
    with profile(activities=activities) as prof:
        trainer.train_step()
        if cuda:
            torch.cuda.synchronize(dev)
    wall = time.perf_counter() - t0

    events = prof.key_averages()
    device_key = "self_device_time_total" if cuda else "self_cpu_time_total"
    kernel_us = sum(getattr(e, "self_device_time_total", 0.0) for e in events) if cuda else 0.0
    phases = [e for e in events if e.key.startswith("phase: ")]
    lines = [f"device: {torch.cuda.get_device_name(dev) if cuda else 'cpu'}; shape {args.shape}, "
             f"model {args.model_size}, overrides {args.set}",
             f"profiled step wall clock {wall:.3f} s (with profiler overhead); summed kernel time "
             f"{kernel_us / 1e6:.3f} s ({kernel_us / 1e6 / wall:.0%} of the wall clock)" if cuda else
             f"profiled step wall clock {wall:.3f} s"]
    for e in phases:
        dev_s = getattr(e, "device_time_total", 0.0) / 1e6
        lines.append(f"  {e.key}: CPU {e.cpu_time_total / 1e6:.3f} s, device {dev_s:.3f} s, calls {e.count}")
    lines += ["", f"top {args.rows} by self {'device' if cuda else 'CPU'} time:",
              events.table(sort_by=device_key, row_limit=args.rows, max_name_column_width=70)]
    if cuda:
        lines += ["", f"top {args.rows} by self CPU time:",
                  events.table(sort_by="self_cpu_time_total", row_limit=args.rows, max_name_column_width=70)]
    text = "\n".join(lines)
    print(text)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
