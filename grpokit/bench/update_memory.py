"""``grpokit bench --memory``: where the memory of a GRPO update goes, padded vs packed, on a long-tailed batch.
(Over 500 lines: one benchmark, grpokit's update and TRL's on the same long-tailed batch, measured and tabled
side by side: its two halves are read together.)

The memory of a step is set by its update (the reference pass, the policy's forward and backward, the
optimizer step); generation on a CPU at the real vocabulary would take most of the time and say nothing
about packing. So this bench runs the update alone, as grpokit train runs it (PolicyUpdate on a Learner),
on a fixed synthetic rollout with a long-tailed length mix (most completions short, a few long), with a
random Qwen2 of Qwen2.5's shapes and the real 151,936-word vocabulary but few layers (a CPU holds it):

    padded   the batch's rows in one micro-batch padded to its longest row (optim.micro_batch_size=auto on
             CUDA; TRL pads each per_device_train_batch_size the same way)
    packed   optim.packing: micro-batches of at most 4,096 real tokens, no padding

    trl      (with ``trl=True``; ``grpokit bench --memory --compare trl``) TRL's GRPOTrainer on the same model,
             rows and token ids: its generation replaced by a ``rollout_func`` that returns the batch's
             prompt and completion ids, so a TRL step is its reference pass, its forward and backward on
             per_device_train_batch_size = all the rows (padded to the longest, as TRL pads) and its AdamW
             step; the settings the two differ in are listed (TRL's read through grpokit.config.trl)

Each variant runs in its own process (a process's peak RSS cannot be reset below what an earlier run
touched), steps ``steps`` times, and reports its peak (grpokit.bench.memory.PeakMeter: the increase over
the RSS before the model was built; in TRL's process the same meter, its baseline taken once the model is
saved for TRL to load and before TRL builds anything), its memory by role, the median update time
(TRL: from each ``on_step_begin`` to its ``on_step_end``, which holds its reference pass), and the
prediction of grpokit.bench.plan for the same settings beside it (none for TRL).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

QWEN_FEW_LAYERS: dict[str, Any] = dict(
    vocab_size=151936,
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=2,
    num_attention_heads=14,
    num_key_value_heads=2,
    tie_word_embeddings=True,
)
"""Qwen2.5-0.5B's dimensions and vocabulary with 2 of its 24 layers (166M parameters, 136M of them the
tied embeddings / LM head)."""


@dataclass(frozen=True)
class LongTail:
    """The batch: ``rows`` completions; ``long_rows`` of them run to a length drawn uniformly from
    [long_min, long_len] (long_min None: exactly long_len), the others from [short_min, short_max]; each
    prompt has ``prompt_len`` tokens, or with ``prompt_min`` a length drawn from [prompt_min, prompt_len]
    (left-padded to the longest, as a sampler leaves them). Fixed by ``seed``."""

    rows: int = 8
    prompt_len: int = 16
    short_min: int = 4
    short_max: int = 24
    long_rows: int = 1
    long_len: int = 256
    prompt_min: int | None = None
    long_min: int | None = None

    def lengths(self, seed: int = 0) -> list[int]:
        """Completion lengths, row by row."""
        import random

        rng = random.Random(seed)
        short = [rng.randint(self.short_min, self.short_max) for _ in range(self.rows - self.long_rows)]
        if self.long_min is None:
            long = [self.long_len] * self.long_rows
        else:
            long = [rng.randint(self.long_min, self.long_len) for _ in range(self.long_rows)]
        out = short + long
        rng.shuffle(out)
        return out

    def prompt_lengths(self, seed: int = 0) -> list[int]:
        """Prompt lengths, row by row (a stream of their own: the completions' draws stay as they were)."""
        import random

        if self.prompt_min is None:
            return [self.prompt_len] * self.rows
        rng = random.Random(f"prompts {seed}")
        return [rng.randint(self.prompt_min, self.prompt_len) for _ in range(self.rows)]


BATCHES: dict[str, LongTail] = {
    "short-8": LongTail(),
    "long-tail-16": LongTail(
        rows=16, prompt_min=16, prompt_len=64, short_min=8, short_max=64, long_rows=2, long_min=512, long_len=1024
    ),
}
"""The named batches of ``grpokit bench --memory --batch NAME``. short-8: 8 rows, prompts of 16 tokens,
seven completions of 4-24 tokens and one of 256 (the fixed roles and the logits chunk dominate its peak).
long-tail-16: 16 rows, prompts of 16-64 tokens, 7/8 of the completions 8-64 tokens and 1/8 of 512-1024, so
that padding to the longest row costs activations: the padded micro-batch is rows x (longest prompt +
longest completion), several times its real tokens."""


VARIANTS: dict[str, list[str]] = {
    "padded": ["optim.micro_batch_size=8"],
    "packed": ["optim.packing=true", "optim.micro_batch_tokens=4096"],
}
"""The settings compared (config overrides): padded, the whole batch in one micro-batch (what
optim.micro_batch_size=auto does on CUDA; 8 rows is short-8's whole batch, ``variant_settings`` gives another
batch its own row count); packed, micro-batches of at most 4,096 real tokens (what optim.micro_batch_tokens=auto
does on a CPU)."""


def variant_settings(variant: str, tail: LongTail) -> list[str]:
    """``variant``'s overrides for ``tail``: padded takes all of its rows in one micro-batch."""
    if variant == "padded":
        return [f"optim.micro_batch_size={tail.rows}"]
    return list(VARIANTS[variant])


def long_tailed_rollout(tail: LongTail, vocab: int, seed: int = 0):
    """A Rollout of ``tail``'s rows: random token ids, prompts left-padded to the longest (token 0 in the
    padding), completions right-padded."""
    import torch

    from grpokit.rollout.generation import Rollout

    g = torch.Generator().manual_seed(seed)
    lengths = tail.lengths(seed)
    Lc = max(lengths)
    completion_mask = torch.tensor([[1] * k + [0] * (Lc - k) for k in lengths])  # (N, Lc)
    prompts = tail.prompt_lengths(seed)
    Lp = max(prompts)
    prompt_mask = torch.tensor([[0] * (Lp - k) + [1] * k for k in prompts])  # (N, Lp)
    return Rollout(
        prompt_ids=torch.randint(3, vocab, (tail.rows, Lp), generator=g) * prompt_mask,
        prompt_mask=prompt_mask,
        completion_ids=torch.randint(3, vocab, (tail.rows, Lc), generator=g) * completion_mask,
        completion_mask=completion_mask,
        logprobs=torch.zeros(tail.rows, Lc),
        truncated=torch.zeros(tail.rows, dtype=torch.bool),
    )


def measure_variant(
    variant: str,
    *,
    layers: int = 2,
    steps: int = 2,
    beta: float = 0.04,
    tail: LongTail | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    model: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run ``steps`` GRPO updates of ``variant`` in this process; its peak, roles, time and the plan's
    prediction. Call it in a fresh process (``measure`` does) for a peak of its own. ``model``: other Qwen2
    dimensions than QWEN_FEW_LAYERS (tests)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from grpokit.bench.memory import PeakMeter, role_bytes

    tail = tail or LongTail()
    from grpokit.bench.plan import ModelDims, Settings, predict
    from grpokit.config.schema import load_config, resolve_algo
    from grpokit.train.learner import Learner, load_model
    from grpokit.train.update import PolicyUpdate

    torch.manual_seed(0)
    dims = {**QWEN_FEW_LAYERS, "num_hidden_layers": layers} if model is None else dict(model)
    cfg = load_config(None, [*_grpokit_overrides(beta), *variant_settings(variant, tail), *overrides])
    meter = PeakMeter(torch.device("cpu"))
    meter.baseline()
    model = Qwen2ForCausalLM(Qwen2Config(**dims, max_position_embeddings=4096))
    model, _, precision, device = load_model(cfg, model, None)
    learner = Learner(model, precision, device, cfg.optim, total_steps=steps)
    algo = resolve_algo(cfg)
    ref = None
    if algo.uses_reference:
        ref = Qwen2ForCausalLM(Qwen2Config(**dims, max_position_embeddings=4096)).to(precision.weight_dtype)
        ref.requires_grad_(False).eval()
    updater = PolicyUpdate(learner, algo, cfg.optim, temperature=1.0, seed=0, ref_model=ref)
    r = long_tailed_rollout(tail, dims["vocab_size"])
    advantages = torch.linspace(-1.0, 1.0, tail.rows)
    meter.start()
    seconds = []
    for s in range(steps):
        t0 = time.perf_counter()
        metrics, _ = updater.update(r, advantages, step=s)
        seconds.append(time.perf_counter() - t0)
    peak = meter.peak_bytes()
    roles = role_bytes(_Parts(model, learner, ref))
    settings = Settings.from_config(cfg, beta=beta)
    completions, prompts = tail.lengths(), tail.prompt_lengths()
    predicted = predict(
        ModelDims.from_dict(dims),
        settings,
        [p + c for p, c in zip(prompts, completions)],
        device="cpu",
        scored=sum(completions),
        prompt_lengths=prompts,
    )
    return {
        "variant": variant,
        "settings": variant_settings(variant, tail) + list(overrides),
        "model": dims,
        "n_params": sum(p.numel() for p in model.parameters()),
        "tail": asdict(tail),
        "steps": steps,
        "beta": beta,
        "update_s": seconds,
        "median_update_s": float(statistics.median(seconds[1:] if steps > 1 else seconds)),
        "micro_batch_rows": metrics["micro_batch_size"],
        "peak_bytes": peak,
        "peak_kind": meter.kind,
        "roles": roles,
        "activations_other_bytes": peak - sum(roles.values()),
        "predicted": predicted,
    }


class _Parts:
    """What grpokit.bench.memory.role_bytes reads of a trainer."""

    def __init__(self, model, learner, ref):
        self.model, self.learner, self.ref_model, self.critic = model, learner, ref, None


# --- TRL's GRPOTrainer on the same batch ----------------------------------------------------------------


def trl_values(tail: LongTail, steps: int, beta: float) -> dict[str, Any]:
    """The GRPOConfig fields TRL's run is given: grpokit's values where both have the setting (all rows in
    one micro-batch and one optimizer step per batch, the learning rate, beta, temperature, gradient
    checkpointing, float32 on the CPU, the grpo loss, grpokit's AdamW beta2 and constant schedule), the rest
    TRL's defaults (``trl_setting_differences`` lists what then still differs)."""
    return {
        "per_device_train_batch_size": tail.rows,
        "gradient_accumulation_steps": 1,
        "num_generations": tail.rows,  # one group: the rows' prompts differ, which changes no memory
        "max_completion_length": max(tail.lengths()),
        "learning_rate": 1e-6,
        "beta": beta,
        "temperature": 1.0,
        "loss_type": "grpo",
        "use_bias_correction_kl": False,  # grpokit's grpo preset: the plain k3 estimate
        "adam_beta2": 0.99,  # grpokit's default (TRL's 0.999)
        "lr_scheduler_type": "constant",  # grpokit's default (TRL's linear)
        "gradient_checkpointing": True,
        "max_steps": steps,
        "seed": 0,
        "use_cpu": True,
        "bf16": False,
        "save_strategy": "no",
        "report_to": "none",
        "logging_steps": 1,
        "disable_tqdm": True,
    }


def trl_setting_differences(
    tail: LongTail, steps: int, beta: float, overrides: list[str] | tuple[str, ...] = ()
) -> list[dict[str, Any]]:
    """{key, grpokit, trl} of every model / algo / optim setting the padded variant and TRL's run differ in:
    TRL's fields (``trl_values`` over its defaults) mapped to grpokit's by grpokit.config.trl.from_trl,
    grpokit's as load_config and the preset resolve them. The rollout's settings are left out: both are
    handed the same fixed batch."""
    from grpokit.config.schema import load_config, resolve_algo
    from grpokit.config.trl import from_trl

    values = trl_values(tail, steps, beta)
    for inert in ("use_cpu", "save_strategy", "disable_tqdm", "logging_steps", "report_to"):
        values.pop(inert)  # where it runs and what it prints: nothing the update computes
    theirs, _ = from_trl(values)
    cfg = load_config(None, [*_grpokit_overrides(beta), *variant_settings("padded", tail), *overrides])
    algo = resolve_algo(cfg).flat()
    out = []
    for section in ("model", "algo", "optim"):
        for name, value in theirs[section].items():
            if section == "algo" and name == "preset":
                continue
            ours = algo.get(name) if section == "algo" else getattr(getattr(cfg, section), name, None)
            same = ours == value or (
                isinstance(ours, (int, float))
                and isinstance(value, (int, float))
                and float(ours) == float(value)
            )
            if not same:
                out.append({"key": f"{section}.{name}", "grpokit": ours, "trl": value})
    return out


def _grpokit_overrides(beta: float) -> list[str]:
    """The bench's own settings of every grpokit variant (before the variant's and the user's)."""
    return [
        "model.device=cpu",
        "model.dtype=float32",
        "model.gradient_checkpointing=true",
        "algo.preset=grpo",
        f"algo.beta={beta}",
        "optim.lr=1e-6",
    ]


def measure_trl(
    *,
    layers: int = 2,
    steps: int = 2,
    beta: float = 0.04,
    tail: LongTail | None = None,
    model: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run ``steps`` steps of TRL's GRPOTrainer on ``long_tailed_rollout``'s rows in this process; its peak,
    roles and step time, in ``measure_variant``'s form. The model (the same seed and dimensions as
    grpokit's) is saved with a word-level tokenizer to a temporary folder before the baseline, since TRL
    builds its reference model from the policy's path; TRL then loads the policy and the reference from it.
    Call it in a fresh process (``measure`` does)."""
    import tempfile
    from types import SimpleNamespace

    import torch
    import trl
    from datasets import Dataset
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from grpokit.bench.memory import PeakMeter, role_bytes
    from grpokit.bench.model import _build_tokenizer
    from grpokit.model.loading import save_local_tokenizer

    tail = tail or LongTail()
    dims = {**QWEN_FEW_LAYERS, "num_hidden_layers": layers} if model is None else dict(model)
    r = long_tailed_rollout(tail, dims["vocab_size"])
    lengths = r.completion_mask.sum(1).tolist()
    prompt_ids = [ids[len(ids) - k :] for ids, k in zip(r.prompt_ids.tolist(), r.prompt_mask.sum(1).tolist())]
    completion_ids = [ids[:k] for ids, k in zip(r.completion_ids.tolist(), lengths)]

    def rollout_func(prompts: list, trainer) -> dict[str, Any]:
        """The same rows every step in place of TRL's generation (``prompts`` are the dataset's rows)."""
        if len(prompts) != tail.rows:
            raise RuntimeError(f"TRL asked for {len(prompts)} completions, the batch has {tail.rows}")
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": None}

    advantages = torch.linspace(-1.0, 1.0, tail.rows).tolist()  # TRL standardises them per group

    def reward(completions, **kw) -> list[float]:
        return advantages[: len(completions)]

    class StepClock(TrainerCallback):
        """Seconds from each on_step_begin to its on_step_end: the reference pass and the update."""

        def __init__(self):
            self.t0, self.seconds = 0.0, []

        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.seconds.append(time.perf_counter() - self.t0)

    with tempfile.TemporaryDirectory(prefix="grpokit-memory-trl-") as tmp:
        model_dir, out_dir = Path(tmp) / "model", Path(tmp) / "out"
        torch.manual_seed(0)  # measure_variant's policy, bit for bit
        policy = Qwen2ForCausalLM(Qwen2Config(**dims, max_position_embeddings=4096))
        tokenizer = _build_tokenizer(dims["vocab_size"])
        policy.save_pretrained(model_dir)
        save_local_tokenizer(tokenizer, model_dir)
        del policy
        rows = [{"prompt": "w5"} for _ in range(tail.rows * (steps + 1))]
        meter = PeakMeter(torch.device("cpu"))
        meter.baseline()
        clock = StepClock()
        trainer = GRPOTrainer(
            model=str(model_dir),
            reward_funcs=reward,
            args=GRPOConfig(output_dir=str(out_dir), **trl_values(tail, steps, beta)),
            train_dataset=Dataset.from_list(rows),
            processing_class=AutoTokenizer.from_pretrained(str(model_dir)),
            callbacks=[clock],
            rollout_func=rollout_func,
        )
        meter.start()
        trainer.train()
        peak = meter.peak_bytes()
        optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)  # accelerate's wrapper
        roles = role_bytes(
            SimpleNamespace(
                model=trainer.model,
                learner=SimpleNamespace(optimizer=optimizer),
                ref_model=trainer.ref_model,
                critic=None,
            )
        )
        dtype = str(next(trainer.model.parameters()).dtype)
        n_params = sum(p.numel() for p in trainer.model.parameters())
    seconds = clock.seconds
    if len(seconds) != steps:
        raise RuntimeError(f"TRL ran {len(seconds)} optimizer steps, {steps} were asked for")
    return {
        "variant": "trl",
        "settings": [f"{k}={v}" for k, v in trl_values(tail, steps, beta).items()],
        "trl_version": trl.__version__,
        "model": dims,
        "dtype": dtype,
        "n_params": n_params,
        "tail": asdict(tail),
        "steps": steps,
        "beta": beta,
        "update_s": seconds,
        "median_update_s": float(statistics.median(seconds[1:] if steps > 1 else seconds)),
        "micro_batch_rows": tail.rows,
        "peak_bytes": peak,
        "peak_kind": meter.kind,
        "roles": roles,
        "activations_other_bytes": peak - sum(roles.values()),
        "predicted": None,
    }


def measure(
    variants: list[str],
    *,
    layers: int = 2,
    steps: int = 2,
    beta: float = 0.04,
    overrides: list[str] | tuple[str, ...] = (),
    model: dict[str, Any] | None = None,
    trl: bool = False,
    batch: str = "short-8",
) -> dict[str, Any]:
    """``measure_variant`` of each variant in its own process: {"variants": {name: result}, and
    "padded_over_packed": the peak's and the update time's ratios}. ``model``: other Qwen2 dimensions.
    ``trl``: also ``measure_trl`` in its own process (variant "trl"), with "over_trl" (each grpokit
    variant's peak and update time over TRL's) and "trl_setting_differences" (``overrides`` are grpokit's
    only, so they show there). ``batch``: a name of BATCHES."""
    if batch not in BATCHES:
        raise ValueError(f"--batch {batch!r}: not a batch of grpokit bench --memory; one of {', '.join(BATCHES)}")
    results = {}
    for variant in [*variants, *(["trl"] if trl else [])]:
        print(f"grpokit bench --memory: {variant} (its own process)", file=sys.stderr, flush=True)
        cmd = [sys.executable, "-m", "grpokit.bench.update_memory", variant, "--layers", str(layers)]
        cmd += ["--steps", str(steps), "--beta", str(beta), "--batch", batch]
        if model is not None:
            cmd += ["--model", json.dumps(model)]
        for o in overrides if variant != "trl" else ():
            cmd += ["--set", o]
        done = subprocess.run(cmd, capture_output=True, text=True)
        line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
        if done.returncode != 0 or line is None:
            raise RuntimeError(f"the {variant} run failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
        results[variant] = json.loads(line.removeprefix("RESULT "))
    out: dict[str, Any] = {"system": "grpokit", "kind": "update memory", "batch": batch, "variants": results}
    if "padded" in results and "packed" in results:
        a, b = results["padded"], results["packed"]
        out["padded_over_packed"] = {
            "peak": a["peak_bytes"] / b["peak_bytes"],
            "update_s": a["median_update_s"] / b["median_update_s"],
        }
    if trl:
        t = results["trl"]
        out["over_trl"] = {
            name: {
                "peak": v["peak_bytes"] / t["peak_bytes"],
                "update_s": v["median_update_s"] / t["median_update_s"],
            }
            for name, v in results.items()
            if name != "trl"
        }
        out["trl_setting_differences"] = trl_setting_differences(BATCHES[batch], steps, beta, overrides)
    return out


def print_memory_table(result: dict[str, Any]) -> None:
    """The variants side by side (TRL's column, when run, with no plan), the ratios and the settings TRL's
    run differs in."""
    gib = 2**30
    variants = result["variants"]
    names = list(variants)
    print(f"{'GiB':<28}" + "".join(f"{n:>12}{'(plan)':>9}" for n in names))

    def planned(v: dict, role: str | None) -> float | None:
        if v["predicted"] is None:  # TRL's run: the plan predicts grpokit's
            return None
        return v["predicted"]["peak_bytes"] if role is None else v["predicted"]["roles"].get(role)

    def row(label: str, values: list[float], plans: list[float | None]) -> None:
        cells = "".join(
            f"{v / gib:>12.3f}" + (f"{p / gib:>9.3f}" if p is not None else f"{'':>9}")
            for v, p in zip(values, plans)
        )
        print(f"{label:<28}{cells}")

    row(
        "peak (increase)",
        [v["peak_bytes"] for v in variants.values()],
        [planned(v, None) for v in variants.values()],
    )
    for role in ("policy_weights", "policy_gradients", "policy_optimizer", "reference_model"):
        row(
            f"  {role.replace('_', ' ')}",
            [v["roles"][role] for v in variants.values()],
            [planned(v, role) for v in variants.values()],
        )
    row(
        "  activations/other",
        [v["activations_other_bytes"] for v in variants.values()],
        [planned(v, "activations") for v in variants.values()],
    )
    print(
        f"{'update s (median)':<28}"
        + "".join(f"{v['median_update_s']:>12.2f}{'':>9}" for v in variants.values())
    )
    if "padded_over_packed" in result:
        r = result["padded_over_packed"]
        print(f"padded / packed: peak {r['peak']:.2f}x, update time {r['update_s']:.2f}x")
    for name, r in result.get("over_trl", {}).items():
        print(f"{name} / trl: peak {r['peak']:.2f}x, update time {r['update_s']:.2f}x")
    if "trl_setting_differences" in result:
        print(f"settings TRL's run differs in (TRL {variants['trl']['trl_version']}, in grpokit's terms):")
        for d in result["trl_setting_differences"]:
            print(f"  {d['key']}: grpokit {d['grpokit']!r}, trl {d['trl']!r}")
        if not result["trl_setting_differences"]:
            print("  none")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m grpokit.bench.update_memory")
    ap.add_argument("variant", choices=[*VARIANTS, "trl"])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--beta", type=float, default=0.04)
    ap.add_argument("--set", action="append", default=[], help="a grpokit config override (not for trl)")
    ap.add_argument("--model", type=json.loads, help="Qwen2 config keys as JSON (default QWEN_FEW_LAYERS)")
    ap.add_argument("--batch", choices=list(BATCHES), default="short-8", help="the rows' lengths (BATCHES)")
    a = ap.parse_args(argv)
    if a.variant == "trl":
        if a.set:
            ap.error(f"--set {a.set[0]}: grpokit config overrides do not apply to TRL's run")
        result = measure_trl(layers=a.layers, steps=a.steps, beta=a.beta, model=a.model, tail=BATCHES[a.batch])
    else:
        result = measure_variant(
            a.variant,
            layers=a.layers,
            steps=a.steps,
            beta=a.beta,
            overrides=a.set,
            model=a.model,
            tail=BATCHES[a.batch],
        )
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
