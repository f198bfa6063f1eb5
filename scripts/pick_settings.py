"""The bench settings `scripts/gpu_session.sh tune` measured faster, one bench argument a line (for `standard-chosen`
and the parts after it).

    python scripts/pick_settings.py results.jsonl > chosen.txt

Reads three tune-* results of the standard shape: the defaults (tune-default), optim.shared_prefix off (tune-padded),
and that with rollout.compile and model.compile (tune-compiled). Each setting is kept where its phases were faster:
optim.shared_prefix=false where tune-padded's reference pass + update beat the default's; rollout.compile where
tune-compiled's generation beat tune-padded's; model.compile where its reference pass + update did. A run that
failed, or whose peak memory is over 1.2x the default's (issue 49: never above TRL's memory), keeps nothing. The
numbers and the choice go to stderr.
"""

from __future__ import annotations

import json
import sys

CAP = 1.2  # x the default's peak memory


def _passes(r: dict) -> float:
    """The reference pass and the update, seconds."""
    return r["median"]["reference_s"] + r["median"]["update_s"]


def pick(results: dict[str, dict]) -> list[str]:
    """The chosen bench arguments from ``results`` (label -> bench JSON result)."""
    ok = {k: r for k, r in results.items() if k.startswith("tune-") and "median" in r}
    for k, r in ok.items():
        m = r["median"]
        print(f"{k}: generation {m['generation_s']:.3f} s, reference {m['reference_s']:.3f} s, update "
              f"{m['update_s']:.3f} s, peak {r['peak_memory_gib']:.1f} GiB", file=sys.stderr)  # fmt: skip
    base = ok.get("tune-default")
    if base is None:
        return []
    ok = {k: r for k, r in ok.items() if r["peak_memory_gib"] <= CAP * base["peak_memory_gib"]}
    chosen: list[str] = []
    padded, compiled = ok.get("tune-padded"), ok.get("tune-compiled")
    if padded is not None and _passes(padded) < _passes(base):
        chosen += ["--set", "optim.shared_prefix=false"]
    if padded is not None and compiled is not None:
        if compiled["median"]["generation_s"] < padded["median"]["generation_s"]:
            chosen += ["--set", "rollout.compile=true"]
        if _passes(compiled) < _passes(padded):
            chosen += ["--set", "model.compile=true"]
    print(f"chosen: {' '.join(chosen) or 'the defaults'}", file=sys.stderr)
    return chosen


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
