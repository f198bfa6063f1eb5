"""The embedded default: a task, a tiny real transformer and its warm start, built locally.

Task: two-number addition, ``"23+45="`` -> ``"<answer>68</answer>"``, scored by the project's
math verifier (``math_accuracy`` against the ``answer`` column).

Warm start: a short supervised phase on a *noisy teacher* that is right only 30% of the time
(50% it answers sum+1, 20% sum-1). The model learns the format and the arithmetic but copies the
teacher's habit, so its greedy answers are mostly off by one: held-out accuracy well under 40%.
Its samples still contain the right answer often enough for GRPO to find it, and the reward
(not the teacher) then moves it to the right answer: accuracy rises to 80%+ within minutes on a CPU.

The default demo's warm-started model ships with the package (``grpokit/demos/model``, float16
weights, built by ``python -m grpokit.demos.shipped``), so the first run goes straight to GRPO; a spec
other than ``DemoSpec()`` (and the variants) is warm-started here and cached (``$GRPOKIT_CACHE`` or
``~/.cache/grpokit``), so a second run skips that phase.

The process-reward variant (``grpokit train data.train=demo_steps``, in ``grpokit.demos.steps``):
three-number addition written in steps, ``"3+14+9="`` -> ``"17 26 <answer>26</answer>"``, each
step checked by rule (``step_checks``) and trained with GRPO process supervision (``grpo_process``).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

DEMO_VERSION = 1
SHIPPED_DIR = Path(__file__).with_name("model")
"""The default demo's warm-started model, shipped with the package (grpokit.demos.shipped builds it)."""
SHIPPED_MANIFEST = "warm_start.json"


@dataclass(frozen=True)
class WarmStartSpec:
    """The tiny Llama of a demo task and its warm start on a noisy teacher (shared by the variants)."""

    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    sft_steps: int = 1500
    sft_batch: int = 128
    sft_lr: float = 3e-3
    seed: int = 0


@dataclass(frozen=True)
class DemoSpec(WarmStartSpec):
    max_operand: int = 49
    """Operands are drawn from 0..max_operand."""
    eval_size: int = 200
    """Held-out problems (never seen in the warm start or in training)."""
    teacher_right: float = 0.3
    """Probability the warm-start teacher writes the true sum ..."""
    teacher_plus_one: float = 0.5
    """... sum + 1 (the rest: sum - 1)."""


def cache_root() -> Path:
    return Path(os.environ.get("GRPOKIT_CACHE", Path.home() / ".cache" / "grpokit"))


def build_tokenizer():
    """Character-level tokenizer: digits and operators one token each, <answer> tags one token."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<eos>", "<bos>"]
    tags = ["<answer>", "</answer>"]
    chars = list("0123456789+-*=? ")
    vocab = {t: i for i, t in enumerate(specials + tags + chars)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>"
    )
    tok.add_tokens(tags)
    return tok


def build_model(tokenizer, spec: WarmStartSpec):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.hidden_size * 2,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_heads,
        max_position_embeddings=64,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(spec.seed)
    return LlamaForCausalLM(cfg)


def make_problems(spec: DemoSpec) -> tuple[list[dict], list[dict]]:
    """All (a, b) pairs, shuffled; the first eval_size are held out."""
    pairs = [(a, b) for a in range(spec.max_operand + 1) for b in range(spec.max_operand + 1)]
    random.Random(spec.seed).shuffle(pairs)
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a, b in pairs]
    return rows[spec.eval_size :], rows[: spec.eval_size]


def teacher_answer(total: int, rng: random.Random, spec: DemoSpec) -> int:
    u = rng.random()
    if u < spec.teacher_right:
        return total
    if u < spec.teacher_right + spec.teacher_plus_one:
        return total + 1
    return total - 1 if total > 0 else total + 2


def completion_text(value: int | str) -> str:
    return f"<answer>{value}</answer>"


def warm_start(model, tokenizer, rows: list[dict], spec: WarmStartSpec, progress=None, teacher=None) -> None:
    """Supervised warm start on the noisy teacher; loss on the completion tokens (and EOS) only.
    teacher(row, rng) -> completion text; default: `teacher_answer` in `completion_text`."""
    rng = random.Random(spec.seed + 1)
    gen = torch.Generator().manual_seed(spec.seed + 2)
    opt = torch.optim.AdamW(model.parameters(), lr=spec.sft_lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 100) * max(0.05, 1 - s / spec.sft_steps)
    )
    eos = tokenizer.eos_token_id
    prompt_ids = [tokenizer(r["prompt"], add_special_tokens=False).input_ids for r in rows]
    model.train()
    for step in range(spec.sft_steps):
        idx = torch.randint(len(rows), (spec.sft_batch,), generator=gen).tolist()
        seqs, labels = [], []
        for i in idx:
            if teacher is None:
                text = completion_text(teacher_answer(int(rows[i]["answer"]), rng, spec))
            else:
                text = teacher(rows[i], rng)
            comp = tokenizer(text, add_special_tokens=False).input_ids + [eos]
            seqs.append(prompt_ids[i] + comp)
            labels.append([-100] * len(prompt_ids[i]) + comp)
        width = max(map(len, seqs))
        input_ids = torch.tensor([s + [tokenizer.pad_token_id] * (width - len(s)) for s in seqs])
        label_t = torch.tensor([lab + [-100] * (width - len(lab)) for lab in labels])
        attn = (torch.arange(width)[None, :] < torch.tensor([len(s) for s in seqs])[:, None]).long()
        loss = model(input_ids=input_ids, attention_mask=attn, labels=label_t).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if progress is not None and (step % 50 == 0 or step == spec.sft_steps - 1):
            progress(step + 1, spec.sft_steps, float(loss.detach()))
    model.eval()


def spec_key(spec: WarmStartSpec) -> str:
    import transformers

    blob = json.dumps({"spec": asdict(spec), "v": DEMO_VERSION, "tf": transformers.__version__.split(".")[0]})
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def shipped_key(spec: WarmStartSpec) -> str:
    """The key the shipped model is recorded under: the spec and DEMO_VERSION (not the library versions:
    weights in safetensors read the same under any of them)."""
    blob = json.dumps({"spec": asdict(spec), "v": DEMO_VERSION})
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def shipped_model(spec: WarmStartSpec, folder: Path = SHIPPED_DIR) -> Path | None:
    """The shipped warm-started model's ``folder`` (the default demo's, or grpokit.demos.tools.SHIPPED_DIR)
    when it was built from ``spec``, else None."""
    try:
        manifest = json.loads((folder / SHIPPED_MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if manifest.get("key") != shipped_key(spec) or not (folder / "model.safetensors").is_file():
        return None
    return folder


def prepare_demo(
    spec: DemoSpec = DemoSpec(),
    *,
    cache: Path | None = None,
    log=print,
    problems=make_problems,
    teacher=None,
    prefix: str = "demo",
) -> dict[str, Path]:
    """Build (or reuse from the cache) the warm-started model and the train/eval JSONL files.
    problems(spec) -> (train rows, eval rows) and teacher (see warm_start) make a variant of the task.

    Returns {"model": dir, "train": jsonl, "eval": jsonl}."""
    root = (cache or cache_root()) / f"{prefix}-{spec_key(spec)}"
    model_dir, train_path, eval_path = root / "model", root / "train.jsonl", root / "eval.jsonl"
    shipped = shipped_model(spec) if prefix == "demo" and problems is make_problems and teacher is None else None
    if shipped is not None:  # the data is written in a second; the model is the package's own
        if not (train_path.is_file() and eval_path.is_file()):
            root.mkdir(parents=True, exist_ok=True)
            _write_rows(dict(zip((train_path, eval_path), problems(spec))))
        log(f"demo: the warm-started model shipped with grpokit ({shipped})")
        return {"model": shipped, "train": train_path, "eval": eval_path}
    if (model_dir / "config.json").is_file() and train_path.is_file() and eval_path.is_file():
        log(f"demo: using the cached warm-start model in {model_dir}")
        return {"model": model_dir, "train": train_path, "eval": eval_path}
    from grpokit.model.loading import save_local_tokenizer

    root.mkdir(parents=True, exist_ok=True)
    train_rows, eval_rows = problems(spec)
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, spec)
    log(
        f"demo: warm start of a {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M-parameter Llama "
        f"on a noisy teacher ({spec.sft_steps} steps; cached afterwards)"
    )
    start = time.perf_counter()

    def progress(step: int, total: int, loss: float) -> None:
        log(f"  warm start {step}/{total}  loss {loss:.3f}  ({time.perf_counter() - start:.0f}s)")

    warm_start(model, tokenizer, train_rows, spec, progress, teacher)
    tmp = root / "model.tmp"
    model.save_pretrained(tmp)
    save_local_tokenizer(tokenizer, tmp)
    _write_rows({train_path: train_rows, eval_path: eval_rows})
    if model_dir.exists():
        import shutil

        shutil.rmtree(model_dir)
    tmp.rename(model_dir)
    return {"model": model_dir, "train": train_path, "eval": eval_path}


def _write_rows(files: dict[Path, list[dict]]) -> None:
    """Each JSONL file whole or not at all (a second process may be reading the cache)."""
    for path, rows in files.items():
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
        tmp.replace(path)


def demo_overrides(paths: dict[str, Path]) -> dict:
    """The demo run's config: GRPO on the warm-started model, scored by math_accuracy (the variants in
    grpokit.demos.variants start from it)."""
    return {
        "model": {"name_or_path": str(paths["model"]), "dtype": "float32", "device": "cpu"},
        "data": {
            "train": str(paths["train"]),
            "eval": str(paths["eval"]),
            "template": "plain",
            "max_prompt_tokens": 16,
        },
        "rollout": {"group_size": 8, "prompts_per_step": 16, "max_new_tokens": 8, "temperature": 1.0},
        "algo": {"preset": "grpo"},
        "optim": {
            "lr": 2e-4,
            "mini_batches": 2,
            "warmup_steps": 2,
            "max_grad_norm": 1.0,
        },
        "rewards": [{"name": "math_accuracy", "weight": 1.0}],
        "eval": {"every": 10, "num_samples": 4},
        "train": {"steps": 40, "output_dir": "runs/demo", "samples_every": 10},
    }
