"""The embedded R1 demo (``grpokit pipeline --demo --output-dir DIR``): the four stages of DeepSeek-R1
(arXiv 2501.12948) on a tiny model, on the CPU, with no download, and RL alone from the cold start beside
them for the same training CPU seconds.

Task: the demo's two-number addition (``grpokit.demos.default``) with a *required output format*: a think block,
then the answer, ``"27+45="`` -> ``"<think>27+45</think><answer>72</answer>"`` (the cold-start chains
restate the problem: a model of 0.33M parameters learns no longer chain from a few dozen examples).
Scored by ``math_accuracy`` (the answer) and ``format_lenient`` (think block, then answer block).

Base model: the embedded demo's warm-started tiny Llama (it answers ``<answer>N</answer>`` with no
reasoning, mostly off by one), with ``<think>`` and ``</think>`` added to its tokenizer (embedding rows
resized; the new rows start at the mean of the others). Its format score is 0: it has never seen the
layout, which is the point of a cold start.

Stages (``pipeline.yaml`` in DIR, which the command writes and then runs):
1. ``cold_start`` (sft): a few dozen chains in the layout, from a teacher that is always right;
2. ``reason`` (rl): GRPO with accuracy + 0.5 x format, from the cold start;
3. ``rejection`` (sample): 4 samples per training prompt from stage 2's model, keep the correct,
   well-formatted ones, the shortest per prompt; ``distill`` (sft): the base model fine-tuned on them
   (R1 fine-tunes the base, not the RL model);
4. ``final`` (rl): GRPO again from the distilled model.
``rl_alone`` (rl, from ``cold_start``): GRPO only, for the CPU seconds that ``reason``, ``rejection``, ``distill``
and ``final`` used together (their training steps; the sampling), measured as they ran (the pipeline's
``cpu_budget_of``, train.max_cpu_seconds): the same compute, whatever the machine's load.

``seed`` (``demo_pipeline``) seeds every stage's training and sampling; ``grpokit.demos.r1_compare`` runs the
demo over several seeds and compares the two arms.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import yaml

R1_DEMO_VERSION = 2
THINK_TAGS = ["<think>", "</think>"]
COLD_START_EXAMPLES = 48
"""Chains of the cold-start data ("a few thousand" in R1; a few dozen for a model of 0.4M parameters)."""
MAX_NEW_TOKENS = 16
"""The longest chain, "<think>49+49</think><answer>98</answer>" and EOS, is 13 tokens."""
RECIPE_AFTER_COLD_START = ["reason", "rejection", "distill", "final"]
"""The recipe's stages after the cold start, whose CPU seconds together are RL alone's budget."""
RL_ALONE_MAX_STEPS = 1000
"""RL alone's train.steps: a bound its CPU budget reaches first (78-80 steps measured; the learning rate is
constant after warm-up, so the bound changes nothing else)."""


def chain(prompt: str) -> str:
    """The cold-start teacher's completion of ``"a+b="``: the problem restated in the think block, then
    the answer.

    >>> chain("27+45=")
    '<think>27+45</think><answer>72</answer>'
    """
    a, b = (int(x) for x in prompt.rstrip("=").split("+"))
    return f"<think>{a}+{b}</think><answer>{a + b}</answer>"


def prepare_r1_demo(cache: Path | None = None, log=print) -> dict[str, Path]:
    """Build (or reuse) the base model with think tags and the stage data, next to the demo's cache.
    Returns {"base", "cold_start", "train", "eval"}."""
    from grpokit.demos.default import cache_root, prepare_demo

    demo = prepare_demo(cache=cache, log=log)
    key = hashlib.sha256(f"{demo['model']}|{R1_DEMO_VERSION}|{COLD_START_EXAMPLES}".encode()).hexdigest()[:12]
    root = (cache or cache_root()) / f"r1demo-{key}"
    paths = {
        "base": root / "base",
        "cold_start": root / "cold_start.jsonl",
        "train": demo["train"],
        "eval": demo["eval"],
    }
    if (paths["base"] / "config.json").is_file() and paths["cold_start"].is_file():
        log(f"r1 demo: using the cached base model in {paths['base']}")
        return paths
    root.mkdir(parents=True, exist_ok=True)
    _add_think_tags(demo["model"], root / "base.tmp")
    if paths["base"].exists():
        import shutil

        shutil.rmtree(paths["base"])
    (root / "base.tmp").rename(paths["base"])
    rows = [json.loads(line) for line in Path(demo["train"]).read_text().splitlines()]
    chosen = random.Random(0).sample(rows, COLD_START_EXAMPLES)
    cold = [{"prompt": r["prompt"], "completion": chain(r["prompt"]), "answer": r["answer"]} for r in chosen]
    paths["cold_start"].write_text("".join(json.dumps(r) + "\n" for r in cold))
    log(f"r1 demo: base model with think tags in {paths['base']}, {len(cold)} cold-start chains")
    return paths


def _add_think_tags(source: Path, target: Path) -> None:
    """The demo model and tokenizer with <think> and </think> as single tokens (embeddings resized)."""
    from transformers import AutoModelForCausalLM

    from grpokit.model.loading import load_tokenizer, save_local_tokenizer

    model = AutoModelForCausalLM.from_pretrained(source, dtype="float32")
    tokenizer = load_tokenizer(str(source))
    tokenizer.add_tokens(THINK_TAGS)
    model.resize_token_embeddings(len(tokenizer), mean_resizing=True)
    model.save_pretrained(target)
    save_local_tokenizer(tokenizer, target)


def demo_pipeline(paths: dict[str, Path], seed: int = 0) -> dict:
    """The pipeline file's content for the prepared paths; ``seed``: every stage's train.seed (sample.seed)."""
    common = {
        "model.device": "cpu",
        "model.dtype": "float32",
        "data.template": "plain",
        "train.tensorboard": False,
        "train.seed": seed,
    }
    rewards = [{"name": "math_accuracy", "weight": 1.0}, {"name": "format_lenient", "weight": 0.5}]

    def sft(steps: int, batch: int, lr: float) -> dict:
        return {
            **common,
            "train.steps": steps,
            "train.save_every": 25,
            "sft.batch_size": batch,
            "optim.lr": lr,
            "optim.warmup_steps": 5,
            "data.max_length": 48,
            "eval.enabled": False,
        }

    def rl(steps: int) -> dict:
        return {
            **common,
            "data.train": str(paths["train"]),
            "data.max_prompt_tokens": 16,
            "rollout.group_size": 8,
            "rollout.prompts_per_step": 16,
            "rollout.max_new_tokens": MAX_NEW_TOKENS,
            "optim.lr": 2e-4,
            "optim.mini_batches": 2,
            "optim.warmup_steps": 2,
            "rewards": rewards,
            "train.steps": steps,
            "train.save_every": 10,
            "train.samples_every": 10,
            "eval.enabled": False,
        }

    sample = {
        **common,
        "data.train": str(paths["train"]),
        "sample.limit": 768,
        "sample.n": 4,
        "sample.max_new_tokens": MAX_NEW_TOKENS,
        "sample.batch_prompts": 64,
        "rewards": [{"name": "math_accuracy", "min": 1.0}, {"name": "format_lenient", "min": 1.0}],
        "keep.max_per_prompt": 1,
        "keep.prefer_shortest": True,
    }
    sample.pop("train.tensorboard")
    sample["sample.seed"] = sample.pop("train.seed")
    stages = [
        {"name": "cold_start", "kind": "sft", "data": str(paths["cold_start"]), "set": sft(100, 16, 2e-3)},
        {"name": "reason", "kind": "rl", "set": rl(30)},
        {"name": "rejection", "kind": "sample", "set": sample},
        {"name": "distill", "kind": "sft", "model": "base", "data": "rejection", "set": sft(150, 32, 1e-3)},
        {"name": "final", "kind": "rl", "set": rl(20)},
        {
            "name": "rl_alone",
            "kind": "rl",
            "model": "cold_start",
            "cpu_budget_of": RECIPE_AFTER_COLD_START,
            "set": rl(RL_ALONE_MAX_STEPS),
        },
    ]
    return {
        "name": "r1-demo",
        "model": str(paths["base"]),
        "eval": {
            "data": str(paths["eval"]),
            "template": "plain",
            "max_prompt_tokens": 16,
            "max_new_tokens": MAX_NEW_TOKENS,
            "accuracy": "math_accuracy",
            "format": "format_lenient",
        },
        "stages": stages,
    }


def write_demo_pipeline(out: Path, log=print, seed: int = 0) -> Path:
    """Prepare the demo's model and data, write DIR/pipeline.yaml (``seed``: demo_pipeline's), return its path."""
    paths = prepare_r1_demo(log=log)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "pipeline.yaml"
    path.write_text(yaml.safe_dump(demo_pipeline(paths, seed=seed), sort_keys=False))
    return path
