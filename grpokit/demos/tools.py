"""The tool-use demo: 4-digit multiplication, which the tiny model cannot do in its head but can with a
``multiply`` tool (multi-turn rollouts, grpokit.rollout.episodes). No download; 2-3 minutes on a CPU.

    grpokit demo tools --output-dir runs/demo_tools    # accuracy before, GRPO, accuracy after

The warm-started model ships with the package (SHIPPED_DIR, built by ``python -m grpokit.demos.shipped
--demo tools``); another ToolDemoSpec is warm-started on first use (4-10 CPU minutes) and cached.

Episode:  <|user|>4321*5678=<|assistant|><tool_call>{"name": "multiply", "arguments": {"a": 4321, "b": 5678}}
          </tool_call><eos><|tool|>24534638<|assistant|><answer>24534638</answer><eos>
Only the model's turns are trained; the tool's answer is context.

Warm start: a supervised phase on a teacher that uses the tool only ``teacher_tool`` of the time and
otherwise answers in its head (always wrong: the last digits are a guess). The model learns both habits;
GRPO's reward (the answer, read from the last turn) then makes it call the tool. Held-out accuracy is
measured with the tool and without it (the call then gets "there is no tool" back).

Copy drills: besides the teacher's episodes, ``copy_drills`` of each warm-start batch are episodes with a
call and its result whose loss is on every token but the first, so the model learns to copy the factors
into the call and the result into the answer without learning to call more often (the first token, a call
or an answer, is the choice; it is not trained in a drill). And every product has 8 digits
(``min_factor``), so the answer copies the result from the same distance in every episode.

Why (measured on this 2-layer model, 1,000 warm-start steps, teacher-forced on 100 held-out episodes):
without either, the calls' factors were right in 100% and the answers copied from a result in 1%, so every
sampled call scored 0 and GRPO had nothing to reinforce (0.0% -> 0.0%); drills training the answer only
gave answers 80%, factors 0%; drills training both, 100% and 0%; with 8-digit products too, both 100%
(from step 200 on). The copy of the result is what this model learns last.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from grpokit.demos.default import WarmStartSpec, _write_rows, cache_root, shipped_model, spec_key

NAME = "demo_tools"
SHIPPED_DIR = Path(__file__).with_name("model") / "tools"
"""The warm-started model shipped with the package (python -m grpokit.demos.shipped --demo tools builds it)."""
CALL_OPEN, CALL_MID, CALL_CLOSE = (
    '<tool_call>{"name": "multiply", "arguments": {"a": ',
    ', "b": ',
    "}}</tool_call>",
)
CHAT_TEMPLATE = (
    "{% if tools %}<|tools|>{% for t in tools %}{{ t['function']['name'] }} {% endfor %}{% endif %}"
    "{% for m in messages %}{% if m['role'] == 'user' %}<|user|>{{ m['content'] }}"
    "{% elif m['role'] == 'tool' %}<|tool|>{{ m['content'] }}"
    "{% else %}<|assistant|>{{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: the first factor
        b: the second factor
    """
    return a * b


@dataclass(frozen=True)
class ToolDemoSpec(WarmStartSpec):
    digits: int = 4
    min_factor: int = 3163
    """Factors are drawn from min_factor to 10**digits - 1: from 3163 (3163**2 > 10**7) every product has
    8 digits, so the answer copies the tool's result from the same distance in every episode (module
    docstring)."""
    train_size: int = 4000
    eval_size: int = 200
    teacher_tool: float = 0.3
    """Share of warm-start episodes in which the teacher calls the tool (else it guesses the product)."""
    copy_drills: float = 0.5
    """Share of each warm-start batch that are copy drills: a call, its result and the answer, the loss on all
    but the first token (the choice to call; module docstring)."""
    sft_steps: int = 1000
    sft_batch: int = 32
    max_positions: int = 96
    """The prompt (22 tokens) plus an episode's budget (rollout.max_episode_tokens = 72) fit."""


def build_tokenizer():
    """Character-level: one token per character; chat markers special; tool and answer tags one token each
    (ordinary tokens, so that decoding keeps them for the tool-call parser and the reward)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<eos>", "<bos>", "<|user|>", "<|assistant|>", "<|tool|>", "<|tools|>"]
    # Multi-character pieces of the call, one token each (as a BPE vocabulary would merge them): a call
    # is 11 tokens, and its decoded text is exactly the Hermes format the parser reads.
    tags = [CALL_OPEN, CALL_MID, CALL_CLOSE, "<tool_call>", "</tool_call>", "<answer>", "</answer>"]
    chars = list('0123456789abcdefghijklmnopqrstuvwxyz+-*=?{}":,_ ')
    vocab = {t: i for i, t in enumerate(specials + tags + chars)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>",
        additional_special_tokens=specials[3:],
    )  # fmt: skip
    tok.add_tokens(tags)
    tok.chat_template = CHAT_TEMPLATE
    return tok


def build_model(tokenizer, spec: ToolDemoSpec):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=spec.hidden_size, intermediate_size=spec.hidden_size * 2,
        num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_heads, num_key_value_heads=spec.num_heads,
        max_position_embeddings=spec.max_positions, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(spec.seed)
    return LlamaForCausalLM(cfg)


def make_problems(spec: ToolDemoSpec) -> tuple[list[dict], list[dict]]:
    """Random pairs of ``digits``-digit numbers from ``min_factor``; the eval rows are never trained on."""
    rng = random.Random(spec.seed)
    low, high = max(10 ** (spec.digits - 1), spec.min_factor), 10**spec.digits - 1
    seen, rows = set(), []
    while len(rows) < spec.train_size + spec.eval_size:
        a, b = rng.randint(low, high), rng.randint(low, high)
        if (a, b) not in seen:
            seen.add((a, b))
            rows.append({"prompt": f"{a}*{b}=", "answer": str(a * b)})
    return rows[spec.eval_size :], rows[: spec.eval_size]


def call_text(a: int, b: int) -> str:
    return f"{CALL_OPEN}{a}{CALL_MID}{b}{CALL_CLOSE}"


def teacher_turns(row: dict, rng: random.Random, spec: ToolDemoSpec) -> list[str]:
    """The teacher's assistant turns: a call then the result copied, or a guess in its head."""
    a, b = map(int, row["prompt"].rstrip("=").split("*"))
    if rng.random() < spec.teacher_tool:
        return [call_text(a, b), f"<answer>{a * b}</answer>"]
    guess = (a * b) // 10**4 * 10**4 + rng.randint(0, 9999)  # right size, wrong last digits
    return [f"<answer>{guess if guess != a * b else guess + 1}</answer>"]


def drill_turns(row: dict) -> list[str]:
    """A copy drill's assistant turns: the call, then the result copied (trained but for the first token)."""
    a, b = map(int, row["prompt"].rstrip("=").split("*"))
    return [call_text(a, b), f"<answer>{a * b}</answer>"]


def episode_ids(
    delta, tokenizer, row: dict, turns: list[str], *, drill: bool = False
) -> tuple[list[int], list[int]]:
    """(ids, labels) of a whole teacher episode, assembled exactly as the rollout engine assembles one:
    prompt, each turn + EOS, the tool's answer as a template delta; labels -100 except on the turns, and
    in a copy ``drill`` on the first turn's first token too (the choice to call)."""
    from grpokit.rollout.envs import first_messages

    eos = tokenizer.eos_token_id
    ids = delta.prompt_ids(first_messages(row, "prompt"))
    labels = [-100] * len(ids)
    a, b = map(int, row["prompt"].rstrip("=").split("*"))
    for k, text in enumerate(turns):
        turn = tokenizer(text, add_special_tokens=False).input_ids + [eos]
        ids, labels = ids + turn, labels + ([-100] + turn[1:] if drill and k == 0 else turn)
        if k < len(turns) - 1:
            obs = delta.observation_ids([{"role": "tool", "content": str(a * b)}], tokenizer.eos_token)
            ids, labels = ids + obs, labels + [-100] * len(obs)
    return ids, labels


def warm_start_batch(delta, tokenizer, rows: list[dict], spec: ToolDemoSpec, rng: random.Random, gen) -> list:
    """One warm-start batch of (ids, labels): ``sft_batch`` random rows, the last ``copy_drills`` share of
    them as copy drills, the others as the teacher answers them."""
    picked = torch.randint(len(rows), (spec.sft_batch,), generator=gen).tolist()
    drills = round(spec.copy_drills * spec.sft_batch)
    teacher = [
        episode_ids(delta, tokenizer, rows[i], teacher_turns(rows[i], rng, spec))
        for i in picked[: spec.sft_batch - drills]
    ]
    drilled = [
        episode_ids(delta, tokenizer, rows[i], drill_turns(rows[i]), drill=True)
        for i in picked[spec.sft_batch - drills :]
    ]
    return teacher + drilled


def warm_start(model, tokenizer, rows: list[dict], spec: ToolDemoSpec, log=print) -> None:
    """Supervised warm start on the teacher's episodes; loss on the model's turns only."""
    from grpokit.rollout.multiturn import ChatDelta
    from grpokit.rollout.tools import load_tools

    delta = ChatDelta(tokenizer, [t.schema for t in load_tools([multiply])])
    rng = random.Random(spec.seed + 1)
    gen = torch.Generator().manual_seed(spec.seed + 2)
    opt = torch.optim.AdamW(model.parameters(), lr=spec.sft_lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 50) * max(0.05, 1 - s / spec.sft_steps)
    )
    model.train()
    start = time.perf_counter()
    for step in range(spec.sft_steps):
        batch = warm_start_batch(delta, tokenizer, rows, spec, rng, gen)
        width = max(len(ids) for ids, _ in batch)
        input_ids = torch.tensor([ids + [tokenizer.pad_token_id] * (width - len(ids)) for ids, _ in batch])
        labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in batch])
        attn = (input_ids != tokenizer.pad_token_id).long()
        loss = model(input_ids=input_ids, attention_mask=attn, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if step % 100 == 0 or step == spec.sft_steps - 1:
            log(
                f"  warm start {step + 1}/{spec.sft_steps}  loss {float(loss.detach()):.3f}  ({time.perf_counter() - start:.0f}s)"
            )
    model.eval()


def prepare(spec: ToolDemoSpec = ToolDemoSpec(), *, cache: Path | None = None, log=print) -> dict[str, Path]:
    """The warm-started model and the train/eval JSONL files: {"model", "train", "eval"}. The model is the
    one shipped with the package (SHIPPED_DIR, built by ``python -m grpokit.demos.shipped --demo tools``)
    when ``spec`` is the one it was built from, else warm-started here and cached."""
    from grpokit.model.loading import save_local_tokenizer

    root = (cache or cache_root()) / f"{NAME}-{spec_key(spec)}"
    paths = {"model": root / "model", "train": root / "train.jsonl", "eval": root / "eval.jsonl"}
    shipped = shipped_model(spec, SHIPPED_DIR)
    if shipped is not None:  # the data is written in a second; the model is the package's own
        if not (paths["train"].is_file() and paths["eval"].is_file()):
            root.mkdir(parents=True, exist_ok=True)
            _write_rows(dict(zip((paths["train"], paths["eval"]), make_problems(spec))))
        log(f"demo_tools: the warm-started model shipped with grpokit ({shipped})")
        return {**paths, "model": shipped}
    if (paths["model"] / "config.json").is_file() and paths["train"].is_file() and paths["eval"].is_file():
        log(f"demo_tools: using the cached warm-start model in {paths['model']}")
        return paths
    root.mkdir(parents=True, exist_ok=True)
    train_rows, eval_rows = make_problems(spec)
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, spec)
    log(
        f"demo_tools: warm start of a {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M-parameter Llama"
    )
    warm_start(model, tokenizer, train_rows, spec, log)
    model.save_pretrained(root / "model.tmp")
    save_local_tokenizer(tokenizer, root / "model.tmp")
    for key, rows in (("train", train_rows), ("eval", eval_rows)):
        paths[key].write_text("".join(json.dumps(r) + "\n" for r in rows))
    if paths["model"].exists():
        import shutil

        shutil.rmtree(paths["model"])
    (root / "model.tmp").rename(paths["model"])
    return paths


def tool_answer(prompts, completions, answer, **kw) -> list[float]:
    """1.0 when the episode's last assistant turn is <answer>N</answer> with N the right product."""
    out = []
    for messages, expected in zip(completions, answer):
        last = [m["content"] for m in messages if m["role"] == "assistant"][-1:]
        text = last[0].strip() if last else ""
        out.append(float(text == f"<answer>{expected}</answer>"))
    return out


def overrides(paths: dict[str, Path], steps: int = 30) -> dict:
    """The GRPO run on the warm-started model: tool episodes of up to 3 turns, scored by tool_answer."""
    return {
        "model": {"name_or_path": str(paths["model"]), "dtype": "float32", "device": "cpu"},
        "data": {"train": str(paths["train"]), "eval": str(paths["eval"]), "max_prompt_tokens": 32},
        "rollout": {
            "group_size": 8,
            "prompts_per_step": 8,
            "max_new_tokens": 40,
            "temperature": 1.0,
            "tools": ["grpokit.demos.tools:multiply"],
            "max_turns": 3,
            "max_episode_tokens": 72,
        },  # fmt: skip
        "algo": {"preset": "grpo"},
        "optim": {"lr": 3e-4, "mini_batches": 1, "warmup_steps": 2, "max_grad_norm": 1.0},
        "rewards": [{"name": "grpokit.demos.tools:tool_answer", "weight": 1.0}],
        "eval": {"enabled": False},
        "train": {
            "steps": steps,
            "output_dir": "runs/demo_tools",
            "samples_every": 10,
            "stop_after_flat_steps": 0,
        },
    }


def accuracy(model, tokenizer, rows: list[dict], *, with_tool: bool, batch: int = 100) -> dict[str, float]:
    """Greedy held-out accuracy of whole episodes (max 3 turns), and the share of episodes that called."""
    from grpokit.rollout.envs import ToolEnvironment
    from grpokit.rollout.generation import FastGenerator
    from grpokit.rollout.multiturn import ChatDelta, run_episodes
    from grpokit.rollout.tools import ToolRunner, hermes, load_tools

    tools = load_tools([multiply])
    runner = ToolRunner(tools if with_tool else [], timeout_s=5.0)
    delta = ChatDelta(tokenizer, [t.schema for t in tools])  # the model is told about the tool either way
    right = called = 0
    try:
        for start in range(0, len(rows), batch):
            part = rows[start : start + batch]
            out = run_episodes(
                FastGenerator(), model, tokenizer, delta, [ToolEnvironment(runner, hermes) for _ in part], part,
                group_size=1, max_turns=3, max_new_tokens=40, max_episode_tokens=72, temperature=0.0,
                eos_token_ids=[tokenizer.eos_token_id], pad_token_id=tokenizer.pad_token_id,
            )  # fmt: skip
            scores = tool_answer(None, [ep.completion for ep in out.episodes], [r["answer"] for r in part])
            right += sum(scores)
            called += sum(ep.tool_calls > 0 for ep in out.episodes)
    finally:
        runner.close()
    return {"accuracy": right / len(rows), "called_tool": called / len(rows)}


def run_demo(
    overrides_given: list[str] = (),
    *,
    resume: bool = False,
    overwrite: bool = False,
    log=print,
) -> dict:
    """Warm start (cached), held-out accuracy with and without the tool, GRPO, the same after; the run in
    ``train.output_dir`` (default runs/demo_tools) follows the run-folder rules of ``grpokit train``
    (refused when it holds a run, unless resume or overwrite). ``grpokit demo tools`` runs it.
    Returns {"before": {...}, "after": {...}, "train_seconds": s, "output_dir": path}; the same JSON is
    written to OUTPUT/demo_results.json."""
    from transformers import AutoModelForCausalLM

    from grpokit.config.schema import apply_overrides, config_from_dict
    from grpokit.model.loading import load_tokenizer
    from grpokit.run.preflight import check_output_dir
    from grpokit.trainers.grpo import GRPOTrainer

    placeholders = {name: Path(f"<demo {name}>") for name in ("model", "train", "eval")}
    checked = config_from_dict(apply_overrides(overrides(placeholders), list(overrides_given)))
    out = Path(checked.train.output_dir)
    check_output_dir(out, resume=resume, overwrite=overwrite)  # before minutes of warm start and evaluation
    paths = prepare(log=log)
    cfg = config_from_dict(apply_overrides(overrides(paths), list(overrides_given)))
    tokenizer = load_tokenizer(str(paths["model"]))
    tokenizer.chat_template = CHAT_TEMPLATE
    eval_rows = [json.loads(line) for line in paths["eval"].read_text().splitlines()]
    model = AutoModelForCausalLM.from_pretrained(paths["model"], dtype=torch.float32)
    log(
        f"demo_tools: held-out accuracy before training ({len(eval_rows)} problems, with and without the tool)"
    )
    results: dict = {
        "before": {
            k: accuracy(model, tokenizer, eval_rows, with_tool=k == "tool") for k in ("tool", "no_tool")
        }
    }
    trainer = GRPOTrainer(cfg, model=model, tokenizer=tokenizer, resume=resume, overwrite=overwrite)
    t0 = time.perf_counter()
    summary = trainer.train()
    results["train_seconds"] = time.perf_counter() - t0
    results["steps"] = summary.get("steps")
    log("demo_tools: held-out accuracy after training")
    results["after"] = {
        k: accuracy(trainer.model, tokenizer, eval_rows, with_tool=k == "tool") for k in ("tool", "no_tool")
    }
    results["output_dir"] = str(out)
    (out / "demo_results.json").write_text(json.dumps(results, indent=2) + "\n")
    return results


def main(steps: int = 30) -> dict:
    """``python -m grpokit.demos.tools [STEPS]``: as ``grpokit demo tools train.steps=STEPS --overwrite``."""
    return run_demo([f"train.steps={steps}"], overwrite=True)


def rollout_speed(
    model, tokenizer, rows: list[dict], *, group_size: int = 8, generator: str = "fast"
) -> dict[str, float]:
    """Episodes per second of sampled tool episodes (T = 1): all of ``rows`` x ``group_size`` batched
    together, then the same episodes one at a time; and the share of the batched time spent in tools."""
    from grpokit.rollout.envs import ToolEnvironment
    from grpokit.rollout.generation import FastGenerator, HFGenerator
    from grpokit.rollout.multiturn import ChatDelta, run_episodes
    from grpokit.rollout.tools import ToolRunner, hermes, load_tools

    tools = load_tools([multiply])
    runner = ToolRunner(tools, timeout_s=5.0)
    delta = ChatDelta(tokenizer, [t.schema for t in tools])
    gen = FastGenerator() if generator == "fast" else HFGenerator()
    settings = dict(
        max_turns=3, max_new_tokens=40, max_episode_tokens=72, temperature=1.0,
        eos_token_ids=[tokenizer.eos_token_id], pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    try:
        t0 = time.perf_counter()
        envs = [ToolEnvironment(runner, hermes) for _ in range(len(rows) * group_size)]
        batched = run_episodes(
            gen, model, tokenizer, delta, envs, rows, group_size=group_size, seed=1, **settings
        )
        t_batched = time.perf_counter() - t0
        t0 = time.perf_counter()
        for k, row in enumerate(rows):
            for j in range(group_size):
                env = [ToolEnvironment(runner, hermes)]
                run_episodes(
                    gen,
                    model,
                    tokenizer,
                    delta,
                    env,
                    [row],
                    group_size=1,
                    seed=k * group_size + j,
                    **settings,
                )
        t_alone = time.perf_counter() - t0
    finally:
        runner.close()
    n = len(rows) * group_size
    return {
        "episodes": n,
        "batched_episodes_per_s": n / t_batched,
        "one_at_a_time_episodes_per_s": n / t_alone,
        "batched_tool_time_share": batched.metrics["time/tools"] / t_batched,
        "turns_mean": batched.metrics["episode/turns_mean"],
    }


if __name__ == "__main__":
    import sys

    print(json.dumps(main(int(sys.argv[1]) if len(sys.argv) > 1 else 30)))
