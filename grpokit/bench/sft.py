"""``grpokit bench --mode sft``: seconds per SFT optimizer step and tokens/s, beside TRL's SFTTrainer.

    grpokit bench --mode sft --shape tiny --model-size tiny --steps 4 --compare trl
    grpokit bench --mode sft --shape standard --model-size 0.5b --compare trl --precision bf16_mixed

Both sides get the same random model (grpokit.bench.model), the same rows and the same batch: a step is
``batch`` prompt/completion rows of exactly ``prompt_len`` + ``completion_len`` tokens (random words of the
word-level tokenizer; the completion's last token is EOS, appended by each trainer), the loss on the
completion only (TRL's ``completion_only_loss``), ``batch / micro_batch`` micro-batches of ``micro_batch``
rows accumulated into one AdamW step (TRL: ``per_device_train_batch_size`` x
``gradient_accumulation_steps``), gradient checkpointing on both or off both, no evaluation, no saving.
Every row has the same length, so neither side pads; ``--packing`` turns on padding-free packing on both
(TRL's ``packing=True``, which packs whole rows, ``bfd``).

s/step is the median of steps 2..N on the wall clock (CUDA synchronised), as the GRPO bench; tokens/s is
the step's input tokens (batch x sequence) over it. Memory: the peak's increase over the memory in use
before the trainer was built (grpokit.bench.memory.PeakMeter, used by both processes): CUDA's
max_memory_allocated on a GPU, the peak resident set (VmHWM) on CPU.
"""

from __future__ import annotations

import dataclasses
import datetime
import gc
import json
import os
import random
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpokit.bench.model import n_words
from grpokit.bench.run import device_name, median, timed_step
from grpokit.bench.shapes import MAX_WORD, BenchError


@dataclass(frozen=True)
class SFTShape:
    batch: int
    """Rows per optimizer step."""
    prompt_len: int
    """Tokens per prompt, exactly (not trained on)."""
    completion_len: int
    """Tokens per completion, exactly, its EOS included (trained on)."""
    micro_batch: int
    """Rows per forward/backward (TRL's per_device_train_batch_size)."""

    @property
    def seq_len(self) -> int:
        return self.prompt_len + self.completion_len


SFT_SHAPES: dict[str, SFTShape] = {
    "tiny": SFTShape(batch=8, prompt_len=16, completion_len=48, micro_batch=8),
    "standard": SFTShape(batch=32, prompt_len=128, completion_len=384, micro_batch=8),
    "long": SFTShape(batch=16, prompt_len=256, completion_len=1792, micro_batch=2),
}


def sft_rows(n: int, shape: SFTShape, vocab_words: int, seed: int = 0) -> list[dict[str, str]]:
    """``n`` prompt/completion rows of random words w5..w{hi-1}: the prompt ``prompt_len`` words, the
    completion a space then ``completion_len - 1`` words (EOS makes it ``completion_len`` tokens)."""
    rng = random.Random(seed)
    hi = min(MAX_WORD, vocab_words)

    def words(k: int) -> str:
        return " ".join(f"w{rng.randrange(5, hi)}" for _ in range(k))

    return [{"prompt": words(shape.prompt_len), "completion": " " + words(shape.completion_len - 1)} for _ in range(n)]


def run_sft_bench(
    model_dir: str | Path,
    shape: str,
    *,
    steps: int,
    packing: bool = False,
    gradient_checkpointing: bool = True,
    dtype: str = "auto",
    precision: str = "auto",
    device: str = "auto",
    seed: int = 0,
) -> dict[str, Any]:
    """Time ``steps`` SFT steps of grpokit's SFTTrainer on ``shape`` (SFT_SHAPES) with the model in
    ``model_dir``; returns per-step times, the median (steps 2..N), tokens/s and the peak memory."""
    import torch

    from grpokit.bench.memory import PeakMeter
    from grpokit.config.sft import load_sft_config
    from grpokit.model.loading import load_tokenizer, pick_device
    from grpokit.trainers.sft import SFTTrainer

    s = SFT_SHAPES[shape]
    rows = sft_rows(s.batch * steps, s, n_words(load_tokenizer(str(model_dir))), seed)
    tmp = tempfile.TemporaryDirectory(prefix="grpokit-bench-sft-")
    cfg = load_sft_config(
        None,
        [
            f"model.dtype={dtype}",
            f"optim.precision={precision}",
            f"model.device={device}",
            f"model.gradient_checkpointing={str(gradient_checkpointing).lower()}",
            "data.template=plain",
            f"data.max_length={s.seq_len}",
            "data.shuffle=false",
            f"sft.batch_size={s.batch}",
            f"sft.packing={str(packing).lower()}",
            f"optim.micro_batch_size={s.micro_batch}",
            "optim.lr=1e-5",
            f"train.steps={steps}",
            f"train.seed={seed}",
            "train.tensorboard=false",
            "eval.enabled=false",
        ],
    )
    cfg.model.name_or_path = str(model_dir)  # set directly: a path is not parsed as YAML
    cfg.train.output_dir = tmp.name
    meter = PeakMeter(pick_device(cfg.model.device))
    meter.baseline()
    trainer = None
    try:
        trainer = SFTTrainer(cfg, train_rows=rows)
        lengths = {len(e.input_ids) for e in trainer.examples}
        trained = {e.num_loss_tokens for e in trainer.examples}
        if lengths != {s.seq_len} or trained != {s.completion_len}:
            raise BenchError(f"rows encode to {lengths} tokens ({trained} trained), not {s.seq_len} ({s.completion_len})")
        dev = trainer.device
        meter.start()
        step_s = []
        for _ in range(steps):
            step_s.append(timed_step(dev, trainer.train_step)[1])
        peak = meter.peak_bytes()
        n_params = sum(p.numel() for p in trainer.model.parameters())
        mode = trainer.learner.precision
    finally:
        trainer = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        tmp.cleanup()
    timed = step_s[1:] if steps > 1 else step_s
    med = median(timed)
    return {
        "system": "grpokit",
        "mode": "sft",
        "date": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "shape": shape,
        "shape_params": dataclasses.asdict(s),
        "packing": packing,
        "gradient_checkpointing": gradient_checkpointing,
        "model_dir": str(model_dir),
        "n_params": n_params,
        "precision": mode.name,
        "device": device_name(dev),
        "steps": steps,
        "step_s": step_s,
        "median_step_s": med,
        "tokens_per_s": s.batch * s.seq_len / med,
        "peak_memory_gib": peak / 2**30,
        "peak_memory_kind": meter.kind,
    }


TRL_SFT_SCRIPT = r'''"""TRL SFTTrainer on a grpokit bench SFT shape: seconds per optimizer step and peak memory (grpokit's
PeakMeter); prints one RESULT {json} line."""
import argparse, json, random, sys, tempfile, time

import torch
from datasets import Dataset
from transformers import PreTrainedTokenizerFast, TrainerCallback
from trl import SFTConfig, SFTTrainer

from grpokit.bench.memory import PeakMeter

ap = argparse.ArgumentParser()
ap.add_argument("model")
ap.add_argument("--rows", required=True, help="JSON file of the prompt/completion rows")
ap.add_argument("--batch", type=int, required=True)
ap.add_argument("--micro", type=int, required=True)
ap.add_argument("--seq-len", type=int, required=True)
ap.add_argument("--completion-len", type=int, required=True)
ap.add_argument("--steps", type=int, required=True)
ap.add_argument("--packing", action="store_true")
ap.add_argument("--no-gradient-checkpointing", dest="gc", action="store_false")
a = ap.parse_args()
rows = json.load(open(a.rows))
cuda = torch.cuda.is_available()


class Timer(TrainerCallback):
    def __init__(self):
        self.t = None
        self.steps = []

    def on_step_begin(self, args, state, control, **kw):
        if cuda:
            torch.cuda.synchronize()
        self.t = time.perf_counter()

    def on_step_end(self, args, state, control, **kw):
        if cuda:
            torch.cuda.synchronize()
        self.steps.append(time.perf_counter() - self.t)


meter = PeakMeter(torch.device("cuda" if cuda else "cpu"))
meter.baseline()
cfg = SFTConfig(
    output_dir=tempfile.mkdtemp(), per_device_train_batch_size=a.micro, gradient_accumulation_steps=a.batch // a.micro,
    max_steps=a.steps, learning_rate=1e-5, lr_scheduler_type="constant", warmup_steps=0, logging_steps=1,
    report_to=[], save_strategy="no", bf16=cuda, use_cpu=not cuda, gradient_checkpointing=a.gc,
    max_length=a.seq_len, completion_only_loss=True, packing=a.packing, dataloader_drop_last=True,
    model_init_kwargs={"dtype": torch.float32},
)
timer = Timer()
trainer = SFTTrainer(
    model=a.model, args=cfg, train_dataset=Dataset.from_list(rows), callbacks=[timer],
    processing_class=PreTrainedTokenizerFast.from_pretrained(a.model),
)
first = trainer.train_dataset[0]
lengths = sorted({len(r) for r in trainer.train_dataset["input_ids"]})
trained = sum(x != -100 for x in first["labels"]) if "labels" in first else sum(first.get("completion_mask", []))
meter.start()
trainer.train()
peak = meter.peak_bytes()
later = sorted(timer.steps[1:])
med = later[len(later) // 2] if later else timer.steps[0]
out = dict(
    system="trl", trl_version=__import__("trl").__version__, step_s=timer.steps, median_step_s=med,
    tokens_per_s=a.batch * a.seq_len / med, peak_memory_gib=peak / 2**30, peak_memory_kind=meter.kind,
    row_lengths=lengths, trained_tokens_row0=trained, packing=a.packing,
)
print("RESULT", json.dumps(out))
'''


def run_trl_sft(
    model_dir: str | Path,
    shape: str,
    *,
    steps: int,
    packing: bool = False,
    gradient_checkpointing: bool = True,
    python: str | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """TRL's SFTTrainer on the same model, rows and batch, in a subprocess; its RESULT dict."""
    from grpokit.bench.trl import check_trl, parse_result_line
    from grpokit.model.loading import load_tokenizer

    check_trl(python)
    s = SFT_SHAPES[shape]
    rows = sft_rows(s.batch * steps, s, n_words(load_tokenizer(str(model_dir))), seed)
    with tempfile.TemporaryDirectory(prefix="grpokit-bench-trl-sft-") as tmp:
        script, data = Path(tmp) / "trl_sft_bench.py", Path(tmp) / "rows.json"
        script.write_text(TRL_SFT_SCRIPT)
        data.write_text(json.dumps(rows))
        cmd = [
            python or sys.executable, str(script), str(model_dir), "--rows", str(data),
            *("--batch", str(s.batch), "--micro", str(s.micro_batch), "--seq-len", str(s.seq_len)),
            *("--completion-len", str(s.completion_len), "--steps", str(steps)),
            *(["--packing"] if packing else []), *([] if gradient_checkpointing else ["--no-gradient-checkpointing"]),
        ]  # fmt: skip
        root = str(Path(__file__).resolve().parents[2])  # this grpokit, for its PeakMeter
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).splitlines()[-25:])
        raise BenchError(f"the TRL SFT run failed (exit {proc.returncode}):\n{tail}")
    result = parse_result_line(proc.stdout)
    if result["row_lengths"] != [s.seq_len] or result["trained_tokens_row0"] != s.completion_len:
        raise BenchError(
            f"TRL tokenized the rows to {result['row_lengths']} tokens ({result['trained_tokens_row0']} trained), "
            f"not {s.seq_len} ({s.completion_len}): not the same work"
        )
    return result


def compare_sft(ours: dict[str, Any], trl: dict[str, Any]) -> dict[str, Any]:
    """Ratios grpokit / TRL: speedup > 1 and peak_memory_ratio < 1 favour grpokit."""
    return {
        "trl": trl,
        "speedup": trl["median_step_s"] / ours["median_step_s"],
        "tokens_per_s_ratio": ours["tokens_per_s"] / trl["tokens_per_s"],
        "peak_memory_ratio": ours["peak_memory_gib"] / trl["peak_memory_gib"] if trl["peak_memory_gib"] > 0 else None,
    }


def print_sft_table(result: dict[str, Any]) -> None:
    rows = [("grpokit", result)]
    if "compare" in result:
        rows.append((f"trl {result['compare']['trl'].get('trl_version', '')}", result["compare"]["trl"]))
    s = result["shape_params"]
    print(
        f"SFT bench, shape {result['shape']} ({s['batch']} rows x {s['prompt_len']}+{s['completion_len']} tokens, "
        f"micro-batch {s['micro_batch']}), {result['n_params'] / 1e6:.1f}M params, {result['device']}, "
        f"precision {result['precision']}, packing {result['packing']}",
        file=sys.stderr,
    )
    print(f"{'system':<14}{'s/step':>10}{'tokens/s':>12}{'peak GiB':>10}", file=sys.stderr)
    for name, r in rows:
        print(f"{name:<14}{r['median_step_s']:>10.3f}{r['tokens_per_s']:>12.0f}{r['peak_memory_gib']:>10.3f}", file=sys.stderr)
    if "compare" in result:
        c = result["compare"]
        memory = f"{c['peak_memory_ratio']:.2f}" if c["peak_memory_ratio"] is not None else "n/a"
        print(f"grpokit vs TRL: {c['speedup']:.2f}x the speed, {memory}x the peak memory", file=sys.stderr)
