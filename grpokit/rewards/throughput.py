"""Throughput of the verifiers: `python -m grpokit.rewards.throughput [--programs N] [--math N]`.

Prints the code sandbox's programs per second (assert-style runs and stdin/stdout runs, each a
sandbox forked from the fork server, `_zygote.py`) and the math_accuracy rate on a GSM8K-like mix with 10% symbolic
answers that go to math-verify. Results in docs/benchmarks.md ("Verifiers").
"""

from __future__ import annotations

import argparse
import os
import time

from grpokit.rewards.accuracy import math_accuracy
from grpokit.rewards.code import make_code_tests
from grpokit.sandbox import isolation_report

HUMANEVAL_STYLE = (
    "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(2, 2) == 4\n"
    "    assert candidate(-1, 1) == 0\n    assert candidate(0, 0) == 0\n\ncheck(add)\n"
)


def bench_code(n: int, workers: int) -> dict[str, float]:
    reward = make_code_tests(timeout_s=5.0, workers=workers)
    code = "```python\ndef add(a, b):\n    return a + b\n```"
    out = {}
    for kind, tests in (
        ("assert", HUMANEVAL_STYLE),
        ("stdio", [{"input": "1 2", "output": "3"}]),
    ):
        completions = [code if kind == "assert" else "a, b = map(int, input().split())\nprint(a + b)"] * n
        reward([None], completions[:1], tests=[tests])  # warm-up: the fork server starts
        start = time.perf_counter()
        scores = reward([None] * n, completions, tests=[tests] * n)
        elapsed = time.perf_counter() - start
        assert all(s == 1.0 for s in scores), scores[:5]
        out[kind] = n / elapsed
    return out


def bench_math(n: int) -> float:
    completions, golds = [], []
    for i in range(n):
        if i % 10 == 9:
            completions.append(rf"\boxed{{\frac{{{i}}}{{{i + 1}}} + \sqrt{{{i % 7 + 2}}}}}")
            golds.append(rf"\frac{{{i}}}{{{i + 1}}}+\sqrt{{{i % 7 + 2}}}")
        else:
            completions.append(f"<think>{i} * 2 = {2 * i}</think><answer>{2 * i + (i % 3 == 0)}</answer>")
            golds.append(f"{i} * 2 = <<{i}*2={2 * i}>>{2 * i}\n#### {2 * i}")
    start = time.perf_counter()
    math_accuracy([None] * n, completions, answer=golds)
    return n / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=200)
    parser.add_argument("--math", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    print(f"cpu cores: {os.cpu_count()}, sandbox workers: {args.workers}, isolation: {isolation_report()}")
    for kind, rate in bench_code(args.programs, args.workers).items():
        print(f"code_tests {kind:6s}: {rate:6.1f} programs/s ({args.programs} programs)")
    print(f"math_accuracy (cold, workers start): {bench_math(args.math):7.0f} completions/s ({args.math})")
    print(f"math_accuracy (warm):                {bench_math(args.math):7.0f} completions/s ({args.math})")


if __name__ == "__main__":
    main()
