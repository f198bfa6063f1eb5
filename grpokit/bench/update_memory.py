"""``grpokit bench --memory``: where the memory of a GRPO update goes, padded vs packed, on a long-tailed batch.

The memory of a step is set by its update (the reference pass, the policy's forward and backward, the
optimizer step); generation on a CPU at the real vocabulary would take most of the time and say nothing
about packing. So this bench runs the update alone, as grpokit train runs it (PolicyUpdate on a Learner),
on a fixed synthetic rollout with a long-tailed length mix (most completions short, a few long), with a
random Qwen2 of Qwen2.5's shapes and the real 151,936-word vocabulary but few layers (a CPU holds it):

    padded   the batch's rows in one micro-batch padded to its longest row (optim.micro_batch_size=auto on
             CUDA; TRL pads each per_device_train_batch_size the same way)
    packed   optim.packing: micro-batches of at most 4,096 real tokens, no padding

Each variant runs in its own process (a process's peak RSS cannot be reset below what an earlier run
touched), steps ``steps`` times, and reports its peak (grpokit.bench.memory.PeakMeter: the increase over
the RSS before the model was built), its memory by role, the median update time, and the prediction of
grpokit.bench.plan for the same settings beside it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
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
    """The batch: ``rows`` completions of a ``prompt_len``-token prompt; ``long_rows`` of them run to
    ``long_len`` tokens, the others to a length drawn uniformly from [short_min, short_max]."""

    rows: int = 8
    prompt_len: int = 16
    short_min: int = 4
    short_max: int = 24
    long_rows: int = 1
    long_len: int = 256

    def lengths(self, seed: int = 0) -> list[int]:
        import random

        rng = random.Random(seed)
        short = [rng.randint(self.short_min, self.short_max) for _ in range(self.rows - self.long_rows)]
        out = short + [self.long_len] * self.long_rows
        rng.shuffle(out)
        return out


VARIANTS: dict[str, list[str]] = {
    "padded": ["optim.micro_batch_size=8"],
    "packed": ["optim.packing=true", "optim.micro_batch_tokens=4096"],
}
"""The settings compared (config overrides): padded, the whole batch in one micro-batch (what
optim.micro_batch_size=auto does on CUDA); packed, micro-batches of at most 4,096 real tokens (what
optim.micro_batch_tokens=auto does on a CPU)."""


def long_tailed_rollout(tail: LongTail, vocab: int, seed: int = 0):
    """A Rollout of ``tail``'s rows: random token ids, prompts of exactly prompt_len tokens."""
    import torch

    from grpokit.rollout.generation import Rollout

    g = torch.Generator().manual_seed(seed)
    lengths = tail.lengths(seed)
    Lc = max(lengths)
    completion_mask = torch.tensor([[1] * k + [0] * (Lc - k) for k in lengths])  # (N, Lc)
    return Rollout(
        prompt_ids=torch.randint(3, vocab, (tail.rows, tail.prompt_len), generator=g),
        prompt_mask=torch.ones(tail.rows, tail.prompt_len, dtype=torch.long),
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
    cfg = load_config(
        None,
        [
            "model.device=cpu",
            "model.dtype=float32",
            "model.gradient_checkpointing=true",
            "algo.preset=grpo",
            f"algo.beta={beta}",
            "optim.lr=1e-6",
            *VARIANTS[variant],
            *overrides,
        ],
    )
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
    lengths = [tail.prompt_len + k for k in tail.lengths()]
    predicted = predict(
        ModelDims.from_dict(dims), settings, lengths, device="cpu", scored=sum(tail.lengths())
    )
    return {
        "variant": variant,
        "settings": VARIANTS[variant] + list(overrides),
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


def measure(
    variants: list[str],
    *,
    layers: int = 2,
    steps: int = 2,
    beta: float = 0.04,
    overrides: list[str] | tuple[str, ...] = (),
    model: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``measure_variant`` of each variant in its own process: {"variants": {name: result}, and
    "padded_over_packed": the peak's and the update time's ratios}. ``model``: other Qwen2 dimensions."""
    results = {}
    for variant in variants:
        print(f"grpokit bench --memory: {variant} (its own process)", file=sys.stderr, flush=True)
        cmd = [sys.executable, "-m", "grpokit.bench.update_memory", variant, "--layers", str(layers)]
        cmd += ["--steps", str(steps), "--beta", str(beta)]
        if model is not None:
            cmd += ["--model", json.dumps(model)]
        for o in overrides:
            cmd += ["--set", o]
        done = subprocess.run(cmd, capture_output=True, text=True)
        line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
        if done.returncode != 0 or line is None:
            raise RuntimeError(f"the {variant} run failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
        results[variant] = json.loads(line.removeprefix("RESULT "))
    out: dict[str, Any] = {"system": "grpokit", "kind": "update memory", "variants": results}
    if "padded" in results and "packed" in results:
        a, b = results["padded"], results["packed"]
        out["padded_over_packed"] = {
            "peak": a["peak_bytes"] / b["peak_bytes"],
            "update_s": a["median_update_s"] / b["median_update_s"],
        }
    return out


def print_memory_table(result: dict[str, Any]) -> None:
    gib = 2**30
    variants = result["variants"]
    names = list(variants)
    print(f"{'GiB':<28}" + "".join(f"{n:>12}{'(plan)':>9}" for n in names))

    def row(label: str, values: list[float], planned: list[float | None]) -> None:
        cells = "".join(
            f"{v / gib:>12.3f}" + (f"{p / gib:>9.3f}" if p is not None else f"{'':>9}")
            for v, p in zip(values, planned)
        )
        print(f"{label:<28}{cells}")

    row(
        "peak (increase)",
        [v["peak_bytes"] for v in variants.values()],
        [v["predicted"]["peak_bytes"] for v in variants.values()],
    )
    for role in ("policy_weights", "policy_gradients", "policy_optimizer", "reference_model"):
        row(
            f"  {role.replace('_', ' ')}",
            [v["roles"][role] for v in variants.values()],
            [v["predicted"]["roles"].get(role) for v in variants.values()],
        )
    row(
        "  activations/other",
        [v["activations_other_bytes"] for v in variants.values()],
        [v["predicted"]["roles"]["activations"] for v in variants.values()],
    )
    print(
        f"{'update s (median)':<28}"
        + "".join(f"{v['median_update_s']:>12.2f}{'':>9}" for v in variants.values())
    )
    if "padded_over_packed" in result:
        r = result["padded_over_packed"]
        print(f"padded / packed: peak {r['peak']:.2f}x, update time {r['update_s']:.2f}x")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m grpokit.bench.update_memory")
    ap.add_argument("variant", choices=list(VARIANTS))
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--beta", type=float, default=0.04)
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--model", type=json.loads, help="Qwen2 config keys as JSON (default QWEN_FEW_LAYERS)")
    a = ap.parse_args(argv)
    result = measure_variant(
        a.variant, layers=a.layers, steps=a.steps, beta=a.beta, overrides=a.set, model=a.model
    )
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
