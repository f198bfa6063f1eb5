"""The objectives of algorithms II side by side on the embedded demo (issue 35, item 7): GRPO, DAPO, CISPO,
SAPO, GMPO, DPPO-TV and GRPO trained on its top 20% entropy tokens, several seeds each, held-out accuracy
against training seconds and the policy's entropy per step, as a table and a plot.

    python scripts/variant_study.py --out runs/variants                       # 7 variants x 3 seeds, 40 steps
    python scripts/variant_study.py --out runs/v --variants grpo,cispo --seeds 0 --steps 10 --jobs 1

Each run is the README's demo (`grpokit train --output-dir OUT/VARIANT/sSEED train.steps=... eval.every=...`)
in its own process with the demo's one torch thread; --jobs runs that many at once (one per core). Training
seconds are the sum of the steps' time/step (evaluations left out). "At equal seconds" reads each variant's
mean accuracy curve (linear between evaluations) at the smallest mean training time of all variants, so no
variant is credited with seconds another did not get. On a machine shared with other work the seconds move
with its load (printed with the table); the accuracies per step do not depend on it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from grpokit.bench.curves import read_run_curve

VARIANTS: dict[str, list[str]] = {  # name -> overrides of the demo's config
    "grpo": ["algo.preset=grpo"],
    "dapo": ["algo.preset=dapo"],
    "cispo": ["algo.preset=cispo"],
    "sapo": ["algo.preset=sapo"],
    "gmpo": ["algo.preset=gmpo"],
    "dppo_tv": ["algo.preset=dppo_tv"],
    "top_entropy_20": ["algo.preset=grpo", "algo.top_entropy_quantile=0.2"],
}


def run_one(out: Path, overrides: list[str], steps: int, eval_every: int, seed: int) -> dict:
    cmd = [
        sys.executable, "-m", "grpokit", "train", "--overwrite", "--output-dir", str(out),
        f"train.steps={steps}", f"eval.every={eval_every}", f"train.seed={seed}", "train.samples_every=0",
        *overrides,
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode != 0:
        raise SystemExit(f"{out} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    curve = read_run_curve(out)  # (step, training seconds, held-out accuracy) per evaluation
    return {
        "seed": seed,
        "train_s": curve.train_s,
        "curve": curve.points,
        "entropy": [(m["step"], m["entropy"]) for m in curve.metrics if "entropy" in m],
    }


def mean_curve(runs: list[dict]) -> list[tuple[int, float, float]]:
    """(step, mean seconds, mean accuracy) at each evaluation step all seeds share."""
    steps = sorted(set.intersection(*({s for s, _, _ in r["curve"]} for r in runs)))
    out = []
    for step in steps:
        at = [next(p for p in r["curve"] if p[0] == step) for r in runs]
        out.append((step, statistics.fmean(p[1] for p in at), statistics.fmean(p[2] for p in at)))
    return out


def accuracy_at(curve: list[tuple[int, float, float]], seconds: float) -> float:
    """The mean curve's accuracy at ``seconds`` of training, linear between evaluations."""
    for (_, s0, a0), (_, s1, a1) in zip(curve, curve[1:]):
        if s0 <= seconds <= s1:
            return a0 if s1 == s0 else a0 + (a1 - a0) * (seconds - s0) / (s1 - s0)
    return curve[-1][2]


def plot(results: dict[str, list[dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, runs in results.items():
        curve = mean_curve(runs)
        (line,) = left.plot([c[1] for c in curve], [c[2] for c in curve], marker="o", ms=3, label=name)
        steps = sorted({s for r in runs for s, _ in r["entropy"]})
        ent = [statistics.fmean(dict(r["entropy"]).get(s, float("nan")) for r in runs) for s in steps]
        right.plot(steps, ent, color=line.get_color(), label=name)
    left.set(xlabel="training seconds (mean over seeds)", ylabel="held-out accuracy (greedy)")
    right.set(xlabel="step", ylabel="entropy of the sampled tokens (nats/token)")
    left.grid(alpha=0.3)
    right.grid(alpha=0.3)
    left.legend(fontsize=8)
    seeds = len(next(iter(results.values())))
    fig.suptitle(f"Variants on the embedded demo, mean of {seeds} seed(s)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/variants"))
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, from: " + ", ".join(VARIANTS))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=2, help="runs at once (each one torch thread)")
    args = parser.parse_args()
    names = args.variants.split(",")
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        parser.error(f"unknown variant(s) {unknown}; choose from {list(VARIANTS)}")
    seeds = [int(s) for s in args.seeds.split(",")]
    load_before = os.getloadavg()
    jobs = [(n, s) for s in seeds for n in names]  # seed-major: an interrupted study still has whole seeds
    with ThreadPoolExecutor(args.jobs) as pool:
        done = list(
            pool.map(lambda j: run_one(args.out / j[0] / f"s{j[1]}", VARIANTS[j[0]], args.steps, args.eval_every, j[1]), jobs)
        )
    load_after = os.getloadavg()
    results: dict[str, list[dict]] = {n: [] for n in names}
    for (name, _), result in zip(jobs, done):
        results[name].append(result)
    budget = min(statistics.fmean(r["train_s"] for r in runs) for runs in results.values())
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "variants.json").write_text(json.dumps(results))
    plot(results, args.out / "variants.png")
    print(f"demo, {args.steps} steps, eval every {args.eval_every}, seeds {seeds}, {args.jobs} run(s) at once")
    print(f"load average (1, 5, 15 min): before {load_before}, after {load_after}")
    print(f"| variant | final accuracy, mean (min-max) | at {budget:.0f} s | train s | entropy first -> last |")
    print("|---|---|---|---|---|")
    for name, runs in results.items():
        finals = [r["curve"][-1][2] for r in runs]
        first = statistics.fmean(r["entropy"][0][1] for r in runs)
        last = statistics.fmean(r["entropy"][-1][1] for r in runs)
        print(
            f"| {name} | {statistics.fmean(finals):.3f} ({min(finals):.3f}-{max(finals):.3f}) | "
            f"{accuracy_at(mean_curve(runs), budget):.3f} | {statistics.fmean(r['train_s'] for r in runs):.1f} | "
            f"{first:.3f} -> {last:.3f} |"
        )


if __name__ == "__main__":
    main()
