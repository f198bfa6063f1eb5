"""Wall-clock to the same held-out accuracy: the embedded demo trained synchronously and with asynchronous
rollouts (rollout.max_staleness = 1, 2), one run after the other in this invocation (issue 34).

    python scripts/async_bench.py --out runs/async_bench            # K = 0, 1, 2; 40 steps, eval every 5
    python scripts/async_bench.py --out runs/ab --ks 0,1 --steps 20
    python scripts/async_bench.py --out runs/ab --ks 0,1 --reward-latency 1.0   # a verifier that waits 1 s a call

Each run is `grpokit train --demo`-style (`grpokit train --output-dir OUT/kK ...`) in its own process with the
demo's one torch thread; with K >= 1 the sampler process takes a second core. The training time is the sum of
the steps' time/step (evaluations left out); "to target" is that sum up to the first evaluation whose
held-out accuracy reaches the synchronous run's final accuracy (or --target). The load average before and
after is printed with the table: on a machine shared with other work the figures move with it.

--reward-latency S: the demo's reward (math_accuracy) waits S seconds a call first, as a remote verifier or a
sandbox would; the wait uses no CPU, so what overlap hides there does not depend on a spare core.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


SLOW_REWARD = """import time
from grpokit.rewards import resolve_reward

_accuracy = resolve_reward("math_accuracy")


def slow_accuracy(prompts, completions, **columns):
    time.sleep({latency})  # a remote verifier's round trip: no CPU used
    return _accuracy(prompts, completions, **columns)
"""


def run_one(out: Path, k: int, steps: int, eval_every: int, seed: int, latency: float = 0.0) -> dict:
    cmd = [
        sys.executable, "-m", "grpokit", "train", "--overwrite", "--output-dir", str(out),
        f"train.steps={steps}", f"eval.every={eval_every}", f"train.seed={seed}", "train.samples_every=0",
    ]  # fmt: skip
    if latency:
        out.parent.mkdir(parents=True, exist_ok=True)
        reward = out.parent / "slow_reward.py"
        reward.write_text(SLOW_REWARD.replace("{latency}", repr(latency)))
        cmd.append(f"rewards=[{{name: '{reward}:slow_accuracy'}}]")
    if k:
        cmd.append(f"rollout.max_staleness={k}")
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"K={k} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    metrics, evals = read_jsonl(out / "metrics.jsonl"), read_jsonl(out / "eval.jsonl")
    clock, elapsed = 0.0, {0: 0.0}
    for m in metrics:
        clock += m["time/step"]
        elapsed[m["step"]] = clock
    curve = [(e["step"], e["accuracy"], elapsed.get(e["step"], clock)) for e in evals]
    stale = [m["async/staleness_mean"] for m in metrics if "async/staleness_mean" in m]
    busy = [m["async/trainer_busy"] for m in metrics if "async/trainer_busy" in m]
    return {
        "k": k,
        "wall_s": wall,
        "train_s": clock,
        "curve": curve,
        "final_accuracy": curve[-1][1],
        "dropped": sum(m.get("async/dropped", 0.0) for m in metrics),
        "staleness_mean": sum(stale) / len(stale) if stale else 0.0,
        "trainer_busy": sum(busy) / len(busy) if busy else 1.0,
    }


def to_target(result: dict, target: float) -> float | None:
    for _, accuracy, seconds in result["curve"]:
        if accuracy >= target:
            return seconds
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/async_bench"))
    parser.add_argument("--ks", default="0,1,2", help="rollout.max_staleness values, comma-separated (0 first)")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target", type=float, default=None, help="held-out accuracy (default: K=0's final)")
    parser.add_argument("--reward-latency", type=float, default=0.0, help="seconds the reward waits a call")
    args = parser.parse_args()
    ks = [int(k) for k in args.ks.split(",")]
    load_before = os.getloadavg()
    results = []
    for k in ks:
        results.append(run_one(args.out / f"k{k}", k, args.steps, args.eval_every, args.seed, args.reward_latency))
        print(f"K={k}: {json.dumps(results[-1])}", file=sys.stderr, flush=True)
    load_after = os.getloadavg()
    target = args.target if args.target is not None else results[0]["final_accuracy"]
    base = to_target(results[0], target)
    waits = f", reward latency {args.reward_latency:g} s" if args.reward_latency else ""
    print(f"demo, {args.steps} steps, eval every {args.eval_every}, seed {args.seed}{waits}; target accuracy {target:.3f}")
    print(f"load average (1, 5, 15 min): before {load_before}, after {load_after}")
    print("| K | train s | to target s | speed-up to target | final accuracy | staleness mean | dropped | trainer busy |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        reach = to_target(r, target)
        speed = f"{base / reach:.2f}x" if reach and base else "-"
        shown = f"{reach:.1f}" if reach is not None else "not reached"
        print(
            f"| {r['k']} | {r['train_s']:.1f} | {shown} | {speed} | {r['final_accuracy']:.3f} | "
            f"{r['staleness_mean']:.2f} | {r['dropped']:.0f} | {r['trainer_busy']:.2f} |"
        )
    (args.out / "results.json").write_text(json.dumps({"target": target, "runs": results}, indent=1))


if __name__ == "__main__":
    main()
