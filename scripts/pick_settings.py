"""The bench settings `scripts/gpu_session.sh tune` measured faster than the defaults, one bench argument a line (for
`standard-chosen` and the parts after it).

    python scripts/pick_settings.py results.jsonl > chosen.txt

Reads the tune-* results of the standard shape: tune-default (the defaults) and one run per candidate setting
(CANDIDATES: its bench arguments and the phases it acts on). A candidate is kept where those phases took less time
than the defaults' and its peak memory is at most 1.2x theirs (issue 49: never above TRL's memory); a run that
failed keeps nothing. The numbers and the choice go to stderr.

History: on 2026-11-29 (docs/benchmarks.md) the candidates were optim.shared_prefix=false and rollout.compile, both
kept and since made the GPU's defaults; model.compile was slower.
"""

from __future__ import annotations

import json
import sys

CAP = 1.2  # x the defaults' peak memory
CANDIDATES = {  # label: (bench arguments, the phases it acts on)
    "tune-fused-logprobs": (["--set", "optim.fused_logprobs=true"], ("reference", "update")),
    "tune-shared-prefix": (["--set", "optim.shared_prefix=true"], ("reference", "update")),
    "tune-chunk-2048": (["--set", "optim.logprob_chunk_size=2048"], ("reference", "update")),
}


def _seconds(r: dict, phases: tuple[str, ...]) -> float:
    return sum(r["median"][f"{phase}_s"] for phase in phases)


def pick(results: dict[str, dict]) -> list[str]:
    """The chosen bench arguments from ``results`` (label -> bench JSON result)."""
    ok = {k: r for k, r in results.items() if k.startswith("tune-") and "median" in r}
    for k, r in ok.items():
        m = r["median"]
        print(f"{k}: generation {m['generation_s']:.3f} s, reference {m['reference_s']:.3f} s, update "
              f"{m['update_s']:.3f} s, peak {r['peak_memory_gib']:.1f} GiB", file=sys.stderr)  # fmt: skip
    base = ok.get("tune-default")
    chosen: list[str] = []
    if base is not None:
        for label, (args, phases) in CANDIDATES.items():
            r = ok.get(label)
            if r is None or r["peak_memory_gib"] > CAP * base["peak_memory_gib"]:
                continue
            if _seconds(r, phases) < _seconds(base, phases):
                chosen += args
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
