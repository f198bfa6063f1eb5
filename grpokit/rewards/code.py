"""`code_tests`: run a completion's code against the row's tests; pass fraction.

The code is the completion's last fenced code block (```python ... ``` or ``` ... ```; an unclosed
final fence runs to the end), else, in a completion that mixes prose and code, its last Markdown indented
code block (after a blank line, indented by four spaces), else the whole completion.

The tests are the `tests` column, in one of these forms:
  - Python source (assert-style, e.g. HumanEval's `check(candidate)` function and its call). It is
    one all-or-nothing case, unless it defines functions named test_*: then its top level runs
    first and each test_* function is one case.
  - a list of Python sources (MBPP's test_list): each one case, run in order.
  - stdin/stdout cases: a list of {"input": ..., "output": ...}, APPS' {"inputs": [...],
    "outputs": [...]}, or either as a JSON string. Each case is a separate run with that stdin; it
    passes when the program exits normally (status 0, in time) and its stdout equals the expected
    output after normalising whitespace (each line's runs of blanks collapsed, ends trimmed,
    trailing blank lines dropped).
Reward = passed cases / cases. None when the row's tests are None or empty. One budget per
completion (`timeout_s`, wall clock) covers all its cases, assert-style or stdin/stdout (the cases
left when it runs out fail unrun), so a looping completion costs timeout_s, not cases x timeout_s,
and never another completion's score; the function is `per_completion` for `RewardRunner`.
Completions are spread over `workers` parallel sandboxes (default: the number of CPU cores). See
`grpokit.sandbox` for isolation. An optional `entry_point` column (HumanEval's) names the one function
the candidate supplies. The prompt's code (its helpers, such as HumanEval/38's `encode_cyclic`, and the
function asked for) is found in fences that parse, Markdown indented blocks and unfenced runs of code;
tests that define `check(candidate)` without calling it are called on the `entry_point`, else the
prompt's last function, else the first function the prompt uses (a usage example `>>> add(2, 3)`, or
`add` named in its text) that the completion defines. A row none of these settles raises a ValueError
that names the row, which RewardRunner reports on that row alone (`row_errors`): never a silent 0.

Why no program can fake a pass: the verdict is decided where the candidate cannot reach.
  - stdin/stdout: the expected output never leaves this process; the sandbox gets the code and
    the input, returns bytes, and this process compares them.
  - Python tests run in a driver process of their own (`grpokit/sandbox/_driver.py`), forked fresh for each
    completion from a clean fork server (`grpokit/sandbox/_zygote.py`), which never runs a line of the
    candidate's code. The candidate runs in a sandbox started by the driver. The driver executes the tests with its own builtins; every name the
    tests use but do not define (`add`, or `candidate` via `check(add)`) is a stub whose call sends
    the arguments to the sandbox as plain data (JSON: numbers, strings, lists, tuples, dicts, sets,
    None, bools, bytes, Fraction, Decimal) and returns the plain data the sandbox answers, rebuilt
    in the driver as new built-in objects (`_plain.py`). An answer that is not plain data fails
    the case; a sandbox that dies, times out or breaks the protocol fails that case and all later
    ones. So `==`, `abs`, `len`, `assert`, exceptions and the `except` clauses of the tests are the
    driver's, applied to values the candidate could only have produced by computing them: lying
    `__eq__`/`__sub__`/`__bool__`, `unittest.mock.ANY`, shadowed builtins, frame or gc walking,
    exit tricks and fake result lines have nothing to act on. The sandbox holds the code, the
    arguments of the current call and nothing else: no test source, no expected value, no nonce,
    no verdict, before, while or after it runs (its pipes carry only code, calls and answers; its
    argv and environment only limits and fd numbers).
What the tests can do through a stub is call a function with plain data and get plain data back
(see `grpokit/sandbox/_driver.py` for the rules: arguments are copied in and nothing flows back, whatever the
candidate raises is one opaque error, NaN fails, helpers the prompt defines are the prompt's). Tests that need
anything else of the candidate's (a class and its instances, a generator, a constant, passing a
function to the candidate) are not supported: passing non-plain arguments raises ValueError
naming the row; other uses fail the case.
"""

from __future__ import annotations

import ast
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from grpokit.rewards._code_parts import (
    asked_function,
    completed_code,
    extract_code,
    prompt_definitions,
    with_check_call,
)
from grpokit.sandbox import SandboxLimits, resolve_isolation, run_program, run_tests_job
from grpokit.scoring.completions import to_text


def parse_tests(tests: object) -> tuple[str, object] | None:
    """("io", [(input, output), ...]) or ("assert", harness tests dict), None when there are none."""
    if tests is None:
        return None
    if isinstance(tests, str):
        stripped = tests.strip()
        if not stripped:
            return None
        if stripped[0] in "[{":
            try:
                tests = json.loads(stripped)
            except ValueError:
                tests = stripped
        else:
            tests = stripped
    if isinstance(tests, dict) and "inputs" in tests and "outputs" in tests:
        tests = [{"input": i, "output": o} for i, o in zip(tests["inputs"], tests["outputs"])]
    if isinstance(tests, dict) and "input" in tests:
        tests = [tests]
    if isinstance(tests, str):
        names = [
            n.name
            for n in ast.parse(tests).body
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name.startswith("test_")
        ]
        if names:
            return "assert", {"kind": "functions", "cases": [tests], "functions": names}
        return "assert", {"kind": "sources", "cases": [tests]}
    if isinstance(tests, (list, tuple)) and tests:
        if all(isinstance(t, str) for t in tests):
            return "assert", {"kind": "sources", "cases": list(tests)}
        if all(isinstance(t, dict) and "input" in t and "output" in t for t in tests):
            return "io", [(_as_text(t["input"]), _as_text(t["output"])) for t in tests]
    if isinstance(tests, (list, tuple)) and not tests:
        return None
    raise ValueError(f"unrecognised tests: {type(tests).__name__} {str(tests)[:80]!r}")


def run_tests(
    code: str,
    tests: dict,
    *,
    limits: SandboxLimits | None = None,
    isolation: str = "auto",
    site_packages: bool = False,
    prompt_defs: str | None = None,
    entry_point: str | None = None,
) -> list[bool]:
    """Run `tests` (a `parse_tests` "assert" spec) against `code`: the tests in a fresh driver
    process, the code in a sandbox, all within `limits.wall_s`. One bool per case. ValueError when
    the tests pass the candidate something other than plain data."""
    return _run_tests(code, tests, limits, isolation, site_packages, prompt_defs, entry_point)[0]


def _run_tests(code, tests, limits, isolation, site_packages, prompt_defs, entry_point):
    """(one bool per case, whether the budget ran out)."""
    isolate = resolve_isolation(isolation)
    limits = limits or SandboxLimits()
    n = len(tests["functions"]) if tests["kind"] == "functions" else len(tests["cases"])
    job = {"code": code, "tests": tests, "prompt_defs": prompt_defs, "entry_point": entry_point}
    verdict = run_tests_job(job, limits, isolate, site_packages)
    if verdict is None:  # killed: past its time, or out of CPU or memory
        return [False] * n, True
    if verdict["unsupported"]:
        raise ValueError(f"code_tests: unsupported tests: {verdict['unsupported']}")
    return [bool(p) for p in verdict["passed"]], bool(verdict["timed_out"])


def run_io_cases(
    code: str,
    cases: list[tuple[str, str]],
    *,
    limits: SandboxLimits | None = None,
    isolation: str = "auto",
    site_packages: bool = False,
) -> list[bool]:
    """Run `code` on each (stdin, expected stdout) case in turn, one sandbox per case, all cases
    within one budget of `limits.wall_s`: once it is spent the remaining cases fail unrun."""
    return _run_io_cases(code, cases, limits or SandboxLimits(), isolation, site_packages)[0]


def _run_io_cases(code, cases, limits, isolation, site_packages):
    """(one bool per case, whether the budget ran out)."""
    timed_out = False
    deadline = time.monotonic() + limits.wall_s
    passed = []
    for stdin, expected in cases:
        left = deadline - time.monotonic()
        if left <= 0.01:
            passed.append(False)
            timed_out = True
            continue
        result = run_program(
            code, stdin, limits=replace(limits, wall_s=left), isolation=isolation, site_packages=site_packages
        )
        timed_out = timed_out or result.timed_out
        passed.append(
            result.returncode == 0
            and not result.timed_out
            and not result.output_exceeded
            and normalize_output(result.stdout) == normalize_output(expected)
        )
    return passed, timed_out


def _as_text(x: object) -> str:
    if isinstance(x, str):
        return x
    if isinstance(x, (list, tuple)):
        return "\n".join(_as_text(v) for v in x)
    return str(x)


def normalize_output(text: str) -> list[str]:
    lines = [" ".join(line.split()) for line in text.strip().splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def make_code_tests(
    tests_column: str = "tests",
    *,
    timeout_s: float = 10.0,
    memory_mb: int = 512,
    max_processes: int = 16,
    max_output_bytes: int = 1 << 20,
    workers: int | None = None,
    isolation: str = "auto",
    site_packages: bool = False,
):
    """A `code_tests` reward reading tests from `tests_column`. timeout_s is the budget of one
    completion: the wall-clock limit of all its cases together (assert-style or stdin/stdout), and
    the CPU limit of each of its processes."""
    limits = SandboxLimits(
        wall_s=timeout_s,
        cpu_s=timeout_s,
        memory_mb=memory_mb,
        max_processes=max_processes,
        max_output_bytes=max_output_bytes,
    )
    n_workers = workers or os.cpu_count() or 1
    if isolation not in ("auto", "namespaces", "none"):
        raise ValueError(f"isolation must be 'auto', 'namespaces' or 'none', got {isolation!r}")

    def code_tests(prompts: list, completions: list, **columns) -> list[float | None]:
        if tests_column not in columns:
            raise KeyError(f"code_tests needs the tests in column {tests_column!r}; got {sorted(columns)}")
        resolve_isolation(isolation)  # refuse before anything runs when no isolation is available
        entry_points = columns.get("entry_point") or [None] * len(completions)
        jobs = []  # one per completion that has tests: all its cases share one budget
        for i, (prompt, completion, tests) in enumerate(zip(prompts, completions, columns[tests_column])):
            try:
                parsed = parse_tests(tests)
            except (ValueError, SyntaxError) as e:
                raise ValueError(f"code_tests: row {i} of column {tests_column!r}: {e}") from e
            if parsed is not None:
                entry = entry_points[i] if isinstance(entry_points[i], str) else None
                jobs.append((i, parsed, extract_code(to_text(completion)), prompt, entry))

        def run(job):
            i, (kind, spec), code, prompt, entry = job
            if kind == "io":
                return i, _run_io_cases(code, spec, limits, isolation, site_packages)
            try:
                defs = prompt_definitions(prompt, entry)
                code = completed_code(code, prompt, entry)
                spec = with_check_call(spec, asked_function(prompt, entry, code))
                return i, _run_tests(code, spec, limits, isolation, site_packages, defs, entry)
            except ValueError as e:
                raise ValueError(f"code_tests: row {i} of column {tests_column!r}: {e}") from e

        out: list[float | None] = [None] * len(completions)
        timed_out = 0
        with ThreadPoolExecutor(max_workers=n_workers) as pool:
            for i, (oks, late) in pool.map(run, jobs):
                out[i] = sum(oks) / len(oks) if oks else 0.0
                timed_out += late
        if jobs and callable(columns.get("log_metric")):  # reward/code_tests/timed_out: share of completions
            columns["log_metric"]("timed_out", timed_out / len(jobs))
        return out

    code_tests.per_completion = True  # RewardRunner: one budget per completion, not one per batch
    code_tests.columns = (tests_column,)  # checked in the data before the model loads (grpokit.data.prompts)
    return code_tests


code_tests = make_code_tests()
