"""`code_tests`: run a completion's code against the row's tests; pass fraction.

The code is the completion's last fenced code block (```python ... ``` or ``` ... ```; an unclosed
final fence runs to the end), or the whole completion when it has none.

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
Reward = passed cases / cases. None when the row's tests are None or empty. Runs are spread over
`workers` parallel sandboxes (default: the number of CPU cores). See `sandbox.py` for isolation.

Why no program can fake a pass: the verdict is decided where the candidate cannot reach.
  - stdin/stdout: the expected output never leaves this process; the sandbox gets the code and
    the input, returns bytes, and this process compares them.
  - Python tests run in a driver process of their own (`_driver.py`), started fresh for each
    completion, which never runs a line of the candidate's code. The candidate runs in a sandbox
    started by the driver. The driver executes the tests with its own builtins; every name the
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
What the tests can do through a stub is call a function with plain data and get plain data back;
changes the call makes in place to a list/dict/set argument are copied back. Tests that need
anything else of the candidate's (a class and its instances, a generator, a constant, passing a
function to the candidate) are not supported: passing non-plain arguments raises ValueError
naming the row; other uses fail the case.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

from grpokit.rewards._text import to_text
from grpokit.rewards.sandbox import SandboxLimits, give_slot, resolve_isolation, run_program, take_slot

DRIVER = str(Path(__file__).with_name("_driver.py"))

_FENCE_RE = re.compile(r"```[^\n`]*\n(.*?)```", re.DOTALL)


def extract_code(completion: str) -> str:
    """The last fenced code block, else the text after an unclosed final fence, else everything."""
    blocks = _FENCE_RE.findall(completion)
    tail = completion.rsplit("```", 1)
    if completion.count("```") % 2 == 1 and "\n" in tail[1]:  # truncated inside a final block
        return tail[1].split("\n", 1)[1]
    return blocks[-1] if blocks else completion


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
) -> list[bool]:
    """Run `tests` (a `parse_tests` "assert" spec) against `code`: the tests in a fresh driver
    process, the code in a sandbox. One bool per case. ValueError when the tests pass the
    candidate something other than plain data."""
    isolate = resolve_isolation(isolation)
    limits = limits or SandboxLimits()
    n = len(tests["functions"]) if tests["kind"] == "functions" else len(tests["cases"])
    slot = take_slot()
    job = {"code": code, "tests": tests, "limits": asdict(limits), "isolate": isolate}
    job.update(site_packages=site_packages, slot=slot)
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
    try:
        proc = subprocess.run(
            [sys.executable, "-I", "-B", *([] if site_packages else ["-S"]), DRIVER],
            input=json.dumps(job).encode(),
            capture_output=True,
            env=env,
            cwd="/",
            timeout=limits.wall_s + 30,  # the driver enforces wall_s itself; this is for a hung test
            start_new_session=True,
        )
    except subprocess.TimeoutExpired:
        return [False] * n
    finally:
        give_slot(slot)
    try:
        verdict = json.loads(proc.stdout)
    except ValueError:
        raise RuntimeError(
            f"code_tests: the test driver failed: {proc.stderr.decode(errors='replace')[-2000:]}"
        ) from None
    if verdict["unsupported"]:
        raise ValueError(f"code_tests: unsupported tests: {verdict['unsupported']}")
    return [bool(p) for p in verdict["passed"]]


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
    """A `code_tests` reward reading tests from `tests_column`. timeout_s is the wall and CPU limit
    of one sandboxed run (all assert cases of a completion share one run; each stdin case has its own)."""
    limits = SandboxLimits(
        wall_s=timeout_s,
        cpu_s=timeout_s,
        memory_mb=memory_mb,
        max_processes=max_processes,
        max_output_bytes=max_output_bytes,
    )
    n_workers = workers or os.cpu_count() or 1
    opts = {"limits": limits, "isolation": isolation, "site_packages": site_packages}
    if isolation not in ("auto", "namespaces", "none"):
        raise ValueError(f"isolation must be 'auto', 'namespaces' or 'none', got {isolation!r}")

    def code_tests(prompts: list, completions: list, **columns) -> list[float | None]:
        if tests_column not in columns:
            raise KeyError(f"code_tests needs the tests in column {tests_column!r}; got {sorted(columns)}")
        resolve_isolation(isolation)  # refuse before anything runs when no isolation is available
        jobs, slots = [], []  # one job per sandboxed run; slots[i] = number of cases of row i
        for i, (completion, tests) in enumerate(zip(completions, columns[tests_column])):
            try:
                parsed = parse_tests(tests)
            except (ValueError, SyntaxError) as e:
                raise ValueError(f"code_tests: row {i} of column {tests_column!r}: {e}") from e
            slots.append(None if parsed is None else parsed)
            if parsed is None:
                continue
            code = extract_code(to_text(completion))
            if parsed[0] == "assert":
                jobs.append((i, "assert", code, parsed[1]))
            else:
                jobs.extend((i, "io", code, case) for case in parsed[1])

        def run(job):
            i, kind, code, spec = job
            if kind == "assert":
                try:
                    return i, run_tests(code, spec, **opts)
                except ValueError as e:
                    raise ValueError(f"code_tests: row {i} of column {tests_column!r}: {e}") from e
            result = run_program(code, spec[0], **opts)
            ok = (
                result.returncode == 0
                and not result.timed_out
                and not result.output_exceeded
                and normalize_output(result.stdout) == normalize_output(spec[1])
            )
            return i, [ok]

        passed: dict[int, list[bool]] = {}
        with ThreadPoolExecutor(max_workers=n_workers) as pool:
            for i, oks in pool.map(run, jobs):
                passed.setdefault(i, []).extend(oks)
        out: list[float | None] = []
        for i, parsed in enumerate(slots):
            if parsed is None:
                out.append(None)
            else:
                oks = passed.get(i, [])
                out.append(sum(oks) / len(oks) if oks else 0.0)
        return out

    return code_tests


code_tests = make_code_tests()
