"""A math-verify worker process: one JSON request per line on stdin, one reply per line on stdout.

It runs math-verify in its main thread, so math-verify's own signal-based timeouts work here
(they do not in the trainer's worker threads); the parent adds a hard deadline and kills a worker
that does not answer in time (sympy can get stuck in C code that ignores signals).

Decimals are exact (see accuracy.py): when one side is a plain number the parent sends its exact
rational values and the other side must equal one of them exactly; and a math-verify "equal" between
two scalars that rests on a decimal (its float tolerance: 1.4142135\\ldots for \\sqrt{2}) is
re-checked with the decimals read as exact rationals.
"""

import json
import math
import os
import resource
import sys
import time
from functools import lru_cache

import sympy
from math_verify import LatexExtractionConfig, parse, verify

PRED_CONFIG = [LatexExtractionConfig()]  # LaTeX grammar only: no sympy eval of model text


@lru_cache(maxsize=8192)
def _gold(gold: str, timeout: int):
    return parse(gold, parsing_timeout=timeout)


def _scalar(parsed: list) -> sympy.Expr | None:
    """The parsed value as a constant sympy expression ("x = v" gives v), else None."""
    item = parsed[0] if parsed else None
    if isinstance(item, sympy.Eq) and isinstance(item.lhs, sympy.Symbol):
        item = item.rhs
    if isinstance(item, sympy.Expr) and not item.free_symbols:
        return item
    return None


def _exactly(a: sympy.Expr, b: sympy.Expr) -> bool:
    """a == b with every decimal read as the exact rational it spells (no float tolerance)."""
    a, b = (sympy.nsimplify(x, rational=True) if x.atoms(sympy.Float) else x for x in (a, b))
    return sympy.simplify(a - b) == 0


def check(gold: str, pred: str, timeout_s: float, exact: list | None = None) -> bool:
    t = max(1, math.ceil(timeout_s))
    g = _gold(gold, t)
    if not g:
        return False
    p = parse(pred, extraction_config=PRED_CONFIG, parsing_timeout=t)
    if not p:
        return False
    if exact is not None:  # one side is a plain number: the other must equal it exactly
        side, values = exact
        other = _scalar(g if side == "pred" else p)
        return other is not None and any(_exactly(other, sympy.Rational(n, d)) for n, d in values)
    if not verify(g, p, timeout_seconds=t):
        return False
    gs, ps = _scalar(g), _scalar(p)
    if gs is not None and ps is not None and (gs.atoms(sympy.Float) or ps.atoms(sympy.Float)):
        return _exactly(gs, ps)
    return True


def main() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
    delay = float(os.environ.get("GRPOKIT_TEST_MATH_START_DELAY_S", "0"))  # tests: a slow start
    if delay > 0:
        time.sleep(delay)
    try:
        check("$1$", "\\boxed{1}", 1.0)  # the first parse builds math-verify's grammar: before @ready
    except Exception:  # noqa: BLE001, S110 - the requests' own checks report such a worker
        pass
    out = sys.stdout
    out.write("@ready\n")
    out.flush()
    for line in sys.stdin:
        try:
            req = json.loads(line)
            ok = check(req["gold"], req["pred"], req["timeout_s"], req.get("exact"))
        except BaseException:  # MemoryError, RecursionError, timeouts: a wrong answer, not a crash
            ok = False
        out.write("@1\n" if ok else "@0\n")
        out.flush()


if __name__ == "__main__":
    main()
