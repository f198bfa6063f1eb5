"""A math-verify worker process: one JSON request per line on stdin, one reply per line on stdout.

It runs math-verify in its main thread, so math-verify's own signal-based timeouts work here
(they do not in the trainer's worker threads); the parent adds a hard deadline and kills a worker
that does not answer in time (sympy can get stuck in C code that ignores signals).
"""

import json
import math
import resource
import sys
from functools import lru_cache

from math_verify import LatexExtractionConfig, parse, verify

PRED_CONFIG = [LatexExtractionConfig()]  # LaTeX grammar only: no sympy eval of model text


@lru_cache(maxsize=8192)
def _gold(gold: str, timeout: int):
    return parse(gold, parsing_timeout=timeout)


def check(gold: str, pred: str, timeout_s: float) -> bool:
    t = max(1, math.ceil(timeout_s))
    g = _gold(gold, t)
    if not g:
        return False
    p = parse(pred, extraction_config=PRED_CONFIG, parsing_timeout=t)
    return bool(p) and bool(verify(g, p, timeout_seconds=t))


def main() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
    out = sys.stdout
    out.write("@ready\n")
    out.flush()
    for line in sys.stdin:
        try:
            req = json.loads(line)
            ok = check(req["gold"], req["pred"], req["timeout_s"])
        except BaseException:  # MemoryError, RecursionError, timeouts: a wrong answer, not a crash
            ok = False
        out.write("@1\n" if ok else "@0\n")
        out.flush()


if __name__ == "__main__":
    main()
