"""TRL's side of the comparison: its GRPOTrainer on the same model and shape in a subprocess (the shared
anchor script, or grpokit's copy of it), its RESULT line, and the grpokit / TRL ratios."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from grpokit.bench.model import n_words
from grpokit.bench.shapes import BENCH_SHAPES, MAX_WORD, BenchError, BenchShape

TRL_SCRIPT = r'''"""TRL GRPOTrainer on a bench shape (grpokit's copy of the side-by-side anchor script):
seconds per optimizer step and peak GPU memory; prints one RESULT {json} line."""
import argparse, json, random, time

import torch
from datasets import Dataset
from transformers import PreTrainedTokenizerFast, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

ap = argparse.ArgumentParser()
ap.add_argument("model")
ap.add_argument("--prompts", type=int, default=32)
ap.add_argument("--G", type=int, default=8)
ap.add_argument("--prompt-len", type=int, default=128)
ap.add_argument("--completion-len", type=int, default=256)
ap.add_argument("--steps", type=int, default=4)
ap.add_argument("--micro", type=int, default=32)
ap.add_argument("--beta", type=float, default=0.04)
ap.add_argument("--vocab-hi", type=int, default=150000)
a = ap.parse_args()
random.seed(0)
rows = [
    {"prompt": " ".join(f"w{random.randrange(5, a.vocab_hi)}" for _ in range(a.prompt_len))}
    for _ in range(a.prompts * (a.steps + 1))
]


def rand_reward(completions, **kw):
    return [float(random.random() < 0.5) for _ in completions]


class Timer(TrainerCallback):
    def __init__(self):
        self.t = [time.perf_counter()]

    def on_step_end(self, args, state, control, **kw):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.t.append(time.perf_counter())


cuda = torch.cuda.is_available()
gen_batch = a.prompts * a.G
cfg = GRPOConfig(
    output_dir="/tmp/trl_out", per_device_train_batch_size=a.micro, gradient_accumulation_steps=gen_batch // a.micro,
    num_generations=a.G, max_completion_length=a.completion_len, max_steps=a.steps, logging_steps=1,
    learning_rate=1e-6, beta=a.beta, report_to=[], save_strategy="no", bf16=cuda, use_cpu=not cuda,
    temperature=1.0, gradient_checkpointing=True, loss_type="grpo",
)
timer = Timer()
trainer = GRPOTrainer(
    model=a.model, reward_funcs=rand_reward, args=cfg, train_dataset=Dataset.from_list(rows), callbacks=[timer],
    processing_class=PreTrainedTokenizerFast.from_pretrained(a.model),
)
if cuda:
    torch.cuda.reset_peak_memory_stats()
trainer.train()
steps = [b - a_ for a_, b in zip(timer.t, timer.t[1:])]
later = sorted(steps[1:])
out = dict(
    system="trl", trl_version=__import__("trl").__version__, step_s=steps,
    median_step_s=later[len(later) // 2] if later else steps[0],
    peak_alloc_gib=torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
    peak_reserved_gib=torch.cuda.max_memory_reserved() / 2**30 if cuda else None,
    completions_per_step=gen_batch, completion_len=a.completion_len, prompt_len=a.prompt_len,
)
print("RESULT", json.dumps(out))
'''


def _module_missing(name: str) -> bool:
    if name in sys.modules:
        return sys.modules[name] is None  # None there means "import blocked"
    try:
        return importlib.util.find_spec(name) is None
    except (ImportError, ValueError):
        return True


def check_trl(python: str | None = None) -> None:
    """Raise BenchError naming the missing package when TRL's side cannot run."""
    needed = ("trl", "datasets")
    # compared without resolving links: a virtual environment's python links to the base interpreter
    if python is None or os.path.abspath(python) == os.path.abspath(sys.executable):
        missing = [n for n in needed if _module_missing(n)]
        where = "this Python"
    else:
        code = "import importlib.util as u, sys; print(' '.join(n for n in sys.argv[1:] if u.find_spec(n) is None))"
        try:
            out = subprocess.run(
                [python, "-c", code, *needed], capture_output=True, text=True, check=True
            ).stdout
        except (OSError, subprocess.CalledProcessError) as e:
            raise BenchError(f"--trl-python {python}: cannot run it ({e})") from e
        missing = out.split()
        where = python
    if missing:
        raise BenchError(
            f"--compare trl needs the {' and '.join(repr(m) for m in missing)} package"
            f"{'s' if len(missing) > 1 else ''}, not importable by {where}: "
            "pip install 'grpokit[trl]' (or pip install trl datasets), or point --trl-python at a "
            "Python that has them."
        )


def find_trl_script(path: str | Path | None = None) -> tuple[Path, str]:
    """The TRL script to run and where it came from: PATH, the shared anchor script
    (``../shared/bench/trl_bench.py`` beside the repository, or ``shared/bench/`` inside it), or
    grpokit's own equivalent (``TRL_SCRIPT``) written to a temporary file."""
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise BenchError(f"--trl-script {p}: no such file")
        return p, "given"
    repo = Path(__file__).resolve().parents[2]
    for candidate in (
        repo.parent / "shared" / "bench" / "trl_bench.py",
        repo / "shared" / "bench" / "trl_bench.py",
    ):
        if candidate.is_file():
            return candidate, "shared anchor"
    fd, name = tempfile.mkstemp(prefix="grpokit_trl_bench_", suffix=".py")
    with os.fdopen(fd, "w") as f:
        f.write(TRL_SCRIPT)
    return Path(name), "grpokit.bench.TRL_SCRIPT"


def parse_result_line(text: str) -> dict[str, Any]:
    """The JSON of the last ``RESULT {json}`` line in ``text``."""
    for line in reversed(text.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise BenchError("no 'RESULT {json}' line in the output")


OOM_MARKERS = re.compile(r"OutOfMemoryError|CUDA out of memory|out of memory", re.IGNORECASE)


def run_trl(
    model_dir: str | Path,
    shape: str | BenchShape,
    *,
    steps: int,
    beta: float = 0.04,
    script: str | Path | None = None,
    python: str | None = None,
    timeout_s: float | None = None,
) -> dict[str, Any]:
    """Run TRL's GRPOTrainer on the same model and shape in a subprocess; its RESULT dict.

    When the run dies of out-of-memory, the result says so (``out_of_memory: True``) instead of raising."""
    from grpokit.model.loading import load_tokenizer

    shape = BENCH_SHAPES[shape] if isinstance(shape, str) else shape
    check_trl(python)
    path, origin = find_trl_script(script)
    vocab_hi = min(MAX_WORD, n_words(load_tokenizer(str(model_dir))))
    cmd = [
        python or sys.executable,
        str(path),
        str(model_dir),
        *("--prompts", str(shape.prompts), "--G", str(shape.group_size)),
        *("--prompt-len", str(shape.prompt_len), "--completion-len", str(shape.completion_len)),
        *("--steps", str(steps), "--micro", str(shape.micro_batch)),
        *("--beta", str(beta), "--vocab-hi", str(vocab_hi)),
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    finally:
        if origin == "grpokit.bench.TRL_SCRIPT":
            path.unlink(missing_ok=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).splitlines()[-25:])
        if OOM_MARKERS.search(proc.stderr or "") or OOM_MARKERS.search(proc.stdout or ""):
            # A result, not a failure: TRL does not fit this shape on this device.
            return {
                "system": "trl",
                "out_of_memory": True,
                "median_step_s": None,
                "peak_alloc_gib": None,
                "error_tail": tail,
                "trl_script": f"{path} ({origin})",
            }
        raise BenchError(f"the TRL run failed (exit {proc.returncode}): {' '.join(cmd)}\n{tail}")
    result = parse_result_line(proc.stdout)
    result["trl_script"] = f"{path} ({origin})"
    return result


def compare(ours: dict[str, Any], trl: dict[str, Any]) -> dict[str, Any]:
    """Ratios grpokit / TRL (below 1: grpokit is faster or smaller)."""
    ratio_step = ours["median_step_s"] / trl["median_step_s"] if trl.get("median_step_s") else None
    trl_peak = trl.get("peak_alloc_gib")
    ours_gpu = ours["peak_memory_kind"].startswith("cuda")
    ratio_mem = ours["peak_memory_gib"] / trl_peak if trl_peak and ours_gpu else None
    return {
        "trl": trl,
        "step_s_ratio": ratio_step,
        "speedup": 1 / ratio_step if ratio_step else None,
        "peak_memory_ratio": ratio_mem,
        "trl_out_of_memory": bool(trl.get("out_of_memory")),
    }
