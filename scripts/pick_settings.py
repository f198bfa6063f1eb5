"""The bench settings `scripts/gpu_session.sh tune` measured fastest, one bench argument a line (for `standard-chosen`).

    python scripts/pick_settings.py results.jsonl > chosen.txt

Reads the tune-* results: rollout.compile is kept when its generation was faster than the default's; of the reference
pass and update settings (optim.shared_prefix on or off, then without gradient checkpointing and the prefix), the one with the least
reference + update seconds, where its peak memory is no more than 1.2x the default's (a faster step that takes
more memory than TRL would miss issue 49's memory goal). A run that failed is not a candidate. The choice and the
numbers behind it go to stderr.
"""

from __future__ import annotations

import json
import sys

VARIANTS = {  # label: (generation arguments, update arguments)
    "tune-default": ([], []),
    "tune-compile-padded": (["--set", "rollout.compile=true"], ["--set", "optim.shared_prefix=false"]),
    "tune-nockpt-padded": ([], ["--no-gradient-checkpointing", "--set", "optim.shared_prefix=false"]),  # not run now
}


def pick(results: dict[str, dict]) -> list[str]:
    """The chosen bench arguments from ``results`` (label -> bench JSON result)."""
    ok = {k: r for k, r in results.items() if k in VARIANTS and "median" in r}
    if "tune-default" not in ok:
        return []
    base = ok["tune-default"]
    generation = []
    compiled = ok.get("tune-compile-padded")
    if compiled and compiled["median"]["generation_s"] < base["median"]["generation_s"]:
        generation = VARIANTS["tune-compile-padded"][0]
    cap = 1.2 * base["peak_memory_gib"]

    def cost(r: dict) -> float:
        return r["median"]["reference_s"] + r["median"]["update_s"]

    fits = [k for k, r in ok.items() if r["peak_memory_gib"] <= cap]
    best = min(fits, key=lambda k: (cost(ok[k]), k != "tune-default"))
    for k, r in ok.items():
        m = r["median"]
        print(f"{k}: generation {m['generation_s']:.3f} s, reference {m['reference_s']:.3f} s, update "
              f"{m['update_s']:.3f} s, peak {r['peak_memory_gib']:.1f} GiB", file=sys.stderr)  # fmt: skip
    print(f"chosen: generation {generation or 'default'}, update {best}", file=sys.stderr)
    return [*generation, *VARIANTS[best][1]]


def main(path: str) -> None:
    results = {}
    for line in open(path):
        row = json.loads(line)
        if "result" in row:
            results[row["label"]] = row["result"]
    chosen = pick(results)
    if chosen:
        print("\n".join(chosen))


if __name__ == "__main__":
    main(sys.argv[1])
