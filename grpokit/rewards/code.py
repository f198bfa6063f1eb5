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
Reward = passed cases / cases. None when the row's tests are None or empty. One budget per
completion (`timeout_s`, wall clock) covers all its cases, assert-style or stdin/stdout (the cases
left when it runs out fail unrun), so a looping completion costs timeout_s, not cases x timeout_s,
and never another completion's score; the function is `per_completion` for `RewardRunner`.
Completions are spread over `workers` parallel sandboxes (default: the number of CPU cores). See
`sandbox.py` for isolation. An optional `entry_point` column (HumanEval's) names the one function
the candidate supplies.

Why no program can fake a pass: the verdict is decided where the candidate cannot reach.
  - stdin/stdout: the expected output never leaves this process; the sandbox gets the code and
    the input, returns bytes, and this process compares them.
  - Python tests run in a driver process of their own (`_driver.py`), forked fresh for each
    completion from a clean fork server (`_zygote.py`), which never runs a line of the
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
(see `_driver.py` for the rules: arguments are copied in and nothing flows back, whatever the
candidate raises is one opaque error, NaN fails, helpers the prompt defines are the prompt's). Tests that need
anything else of the candidate's (a class and its instances, a generator, a constant, passing a
function to the candidate) are not supported: passing non-plain arguments raises ValueError
naming the row; other uses fail the case.
"""

from __future__ import annotations

import ast
import json
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, replace

from grpokit.rewards._text import to_text
from grpokit.rewards._zygote import fork_server
from grpokit.rewards.sandbox import SandboxLimits, give_slot, resolve_isolation, run_program, take_slot

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


def prompt_sources(prompt: object) -> list[str]:
    """The Python code of a prompt, in any shape the data allows: a string or chat messages (each
    message on its own: a system message does not hide the user's code), and in each text its fenced
    blocks, else every run of lines that parses as Python and starts at a `def`, `class`, `import`,
    `from` or decorator line (instructions before or after the code are left out)."""
    if isinstance(prompt, (list, tuple)) and any(isinstance(m, dict) for m in prompt):
        texts = [to_text(m) for m in prompt if isinstance(m, dict)]
    else:
        texts = [to_text(prompt)]
    sources = []
    for text in texts:
        if "def " not in text and "import " not in text and "class " not in text:
            continue
        fenced = _FENCE_RE.findall(text)
        sources += fenced if fenced else _code_runs(text)
    return sources


_CODE_START_RE = re.compile(r"(?:async\s+def|def|class|import|from\s+\S+\s+import)\b|@")


def _code_runs(text: str, max_lines: int = 400) -> list[str]:
    """The longest runs of lines of `text` that parse as Python, each starting at a line that opens
    code (`_CODE_START_RE`, not indented). The whole text when it parses."""
    if _parses(text):
        return [text]
    lines = text.split("\n")[:max_lines]
    runs, i = [], 0
    while i < len(lines):
        if not _CODE_START_RE.match(lines[i]):
            i += 1
            continue
        for end in range(len(lines), i, -1):
            chunk = "\n".join(lines[i:end])
            if _parses(chunk):
                runs.append(chunk)
                i = end
                break
        else:
            i += 1
    return runs


def _parses(source: str) -> bool:
    try:
        ast.parse(source)
    except (SyntaxError, ValueError):
        return False
    return True


def prompt_definitions(prompt: object, entry_point: str | None = None) -> str | None:
    """The source of the functions, classes and imports the prompt's Python code defines in full
    (HumanEval/32's `poly`, /38's `encode_cyclic`): the tests use these, never the candidate's. Left
    out: the function the candidate is asked for (`entry_point`, else the last function the prompt
    defines, HumanEval's layout, even when it is complete, as in "fix this function"), and stubs
    (a body of only a docstring, `pass` or `...`). The code is found by `prompt_sources`, whatever
    the prompt's shape (plain, fenced, after an instruction line, in a chat with a system message)."""
    nodes = []
    for source in prompt_sources(prompt):
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError):
            continue
        nodes += [(source, node) for node in tree.body]
    functions = [n for _, n in nodes if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    asked = entry_point or (functions[-1].name if functions else None)
    kept = [
        ast.get_source_segment(source, node) or ""
        for source, node in nodes
        if isinstance(node, (ast.Import, ast.ImportFrom, ast.ClassDef))
        or (
            isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.name != asked
            and not _is_stub(node)
        )
    ]
    return "\n\n".join(k for k in kept if k) or None


def _defines(source: str, name: str) -> bool:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return False
    return any(
        isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == name
        for n in tree.body
    )


def asked_function(prompt: object, entry_point: str | None = None) -> str | None:
    """The function the candidate is asked for: `entry_point`, else the last one the prompt's code defines."""
    if entry_point:
        return entry_point
    for source in reversed(prompt_sources(prompt)):
        try:
            functions = [
                n for n in ast.parse(source).body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            ]
        except (SyntaxError, ValueError):
            continue
        if functions:
            return functions[-1].name
    return None


def completed_code(code: str, prompt: object, entry_point: str | None = None) -> str:
    """`code`, or the prompt's code followed by it when the completion continues the prompt (HumanEval's
    layout: the prompt ends with the signature and docstring of the asked function, `asked_function`,
    and the completion is its body). Only when `code` alone does not define that function, the prompt
    leaves it a stub (docstring, `pass` or `...` only) and the two together define it."""
    asked = asked_function(prompt, entry_point)
    if asked is None or _defines(code, asked):
        return code
    for source in reversed(prompt_sources(prompt)):
        try:
            stubs = [
                n
                for n in ast.parse(source).body
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == asked
            ]
        except (SyntaxError, ValueError):
            continue
        if stubs:
            joined = source.rstrip() + "\n" + code
            return joined if _is_stub(stubs[-1]) and _defines(joined, asked) else code
    return code


_CHECK_CALL = re.compile(r"^check\s*\(", re.MULTILINE)


def with_check_call(tests: dict, entry_point: str | None) -> dict:
    """HumanEval's `test` column defines `check(candidate)` and leaves the call to the harness: the call
    `check(<entry_point>)` is added where the tests define `check` and never call it. Without an
    entry point such tests would pass whatever the candidate does: ValueError."""
    if tests["kind"] != "sources" or len(tests["cases"]) != 1:
        return tests
    source = tests["cases"][0]
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return tests
    defines_check = any(isinstance(n, ast.FunctionDef) and n.name == "check" for n in tree.body)
    if not defines_check or _CHECK_CALL.search(source):
        return tests
    if not entry_point or not entry_point.isidentifier():
        raise ValueError(
            "the tests define check(candidate) but never call it, and neither an entry_point column nor the "
            "prompt's code names the function to check: add an entry_point column (HumanEval's) or the call "
            "check(<function>) to the tests"
        )
    return {**tests, "cases": [f"{source.rstrip()}\n\n\ncheck({entry_point})\n"]}


def _is_stub(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return all(
        isinstance(n, ast.Pass) or (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))
        for n in fn.body
    )


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
    slot = take_slot()
    header = {"limits": asdict(limits), "isolate": isolate, "site_packages": site_packages, "slot": slot}
    job = {"code": code, "tests": tests, "prompt_defs": prompt_defs, "entry_point": entry_point}
    try:  # the driver stops itself at wall_s; it is killed 2 s later
        verdict = fork_server(site_packages).run(
            "driver", header, json.dumps(job).encode(), limits.wall_s + 2
        )
    finally:
        give_slot(slot)
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
                spec = with_check_call(spec, asked_function(prompt, entry))
                code = completed_code(code, prompt, entry)
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
