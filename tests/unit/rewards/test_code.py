"""code_tests and the sandbox: real subprocesses, small limits. Each adversarial row is something a
reward-hacking policy would try; it must score 0 (or its honest partial value) and leave the host alone.
The larger hostile suite, run as root and as an unprivileged user, is tests/unit/rewards/test_sandbox_hostile.py."""

import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
import uuid

import pytest
from paths import REPO

from grpokit.rewards.code import extract_code, make_code_tests, normalize_output, parse_tests
from grpokit.sandbox import isolation_report

ISOLATED = isolation_report()["namespaces"]
needs_isolation = pytest.mark.skipif(
    not ISOLATED, reason=f"no user namespaces here, code_tests refuses to run: {isolation_report()['reason']}"
)
SECRET = uuid.uuid4().hex  # only in this process's memory and the test pipe
MARK = f"/tmp/grpokit_pwned_{uuid.uuid4().hex[:8]}"
HERE_MARK = os.path.join(os.path.dirname(__file__), f"pwned_{uuid.uuid4().hex[:8]}")
reward = make_code_tests(timeout_s=2.0, memory_mb=256, max_processes=8, max_output_bytes=64_000, workers=2)

ASSERT_TESTS = "assert add(2, 3) == 5\nassert add(-1, 1) == 0\n"
FUNC_TESTS = "def test_a():\n    assert add(1, 1) == 2\n\ndef test_b():\n    assert add(2, 2) == 4\n\ndef test_c():\n    assert add(0, 5) == 5\n"
IO_TESTS = [{"input": "2 3\n", "output": "5\n"}, {"input": "10 -4", "output": "6"}]
SECRET_TESTS = f"assert solve() == {SECRET!r}\n"
GOOD = "def add(a, b):\n    return a + b\n"


def fenced(code: str) -> str:
    return f"Here is my solution.\n```python\n{code}```\nDone."


# name, completion, tests, expected score
ROWS = [
    # positive
    ("assert-style correct", fenced(GOOD), ASSERT_TESTS, 1.0),
    ("test_* functions correct", fenced(GOOD), FUNC_TESTS, 1.0),
    ("stdin/stdout correct", fenced("a, b = map(int, input().split())\nprint(a + b)\n"), IO_TESTS, 1.0),
    (
        "stdin/stdout as JSON string",
        "import sys\na, b = map(int, sys.stdin.read().split())\nprint(a + b)",
        __import__("json").dumps(IO_TESTS),
        1.0,
    ),
    ("MBPP list of asserts", fenced(GOOD), ["assert add(1, 2) == 3", "assert add(2, 2) == 4"], 1.0),
    (
        "check(candidate) HumanEval style",
        fenced(GOOD),
        "def check(candidate):\n    assert candidate(2, 2) == 4\n\ncheck(add)\n",
        1.0,
    ),
    (
        "numpy-free Fraction result",
        fenced("from fractions import Fraction\ndef add(a, b):\n    return Fraction(a) + b\n"),
        ASSERT_TESTS,
        1.0,
    ),
    # negative and partial
    ("wrong function", fenced("def add(a, b):\n    return a - b\n"), ASSERT_TESTS, 0.0),
    ("partial test_* functions", fenced("def add(a, b):\n    return a + b if a else 0\n"), FUNC_TESTS, 2 / 3),
    ("partial stdin cases", fenced("print(5)"), IO_TESTS, 0.5),
    (
        "partial MBPP list",
        fenced("def add(a, b):\n    return 3\n"),
        ["assert add(1, 2) == 3", "assert add(2, 2) == 4"],
        0.5,
    ),
    ("syntax error", fenced("def add(a, b) return a + b"), ASSERT_TESTS, 0.0),
    ("runtime error in stdin program", fenced("print(5)\nraise ValueError"), IO_TESTS, 0.0),
    # adversarial
    ("sys.exit(0) before the tests", fenced("import sys\nsys.exit(0)\n"), ASSERT_TESTS, 0.0),
    ("os._exit(0) before the tests", fenced("import os\nos._exit(0)\n"), ASSERT_TESTS, 0.0),
    (
        "os._exit(0) inside the function",
        fenced("import os\ndef add(a, b):\n    os._exit(0)\n"),
        FUNC_TESTS,
        0.0,
    ),
    (
        "sys.exit inside the function",
        fenced("import sys\ndef add(a, b):\n    sys.exit(0)\n"),
        FUNC_TESTS,
        0.0,
    ),
    ("raise SystemExit from a test", fenced("def add(a, b):\n    raise SystemExit(0)\n"), ASSERT_TESTS, 0.0),
    (
        "always-equal object",
        fenced(
            "class A:\n    def __eq__(self, o): return True\n    def __ne__(self, o): return False\ndef add(a, b):\n    return A()\n"
        ),
        ASSERT_TESTS,
        0.0,
    ),
    (
        "always-equal via builtin bound method",
        fenced("class A:\n    __eq__ = (1).__ne__\ndef add(a, b):\n    return A()\n"),
        ASSERT_TESTS,
        0.0,
    ),
    (
        "always-equal inside a list",
        fenced("class A:\n    __eq__ = lambda s, o: True\ndef add(a, b):\n    return [A()]\n"),
        ["assert add(1, 2) == [3]"],
        0.0,
    ),
    (
        "always-equal made at call time",
        fenced("def add(a, b):\n    return type('A', (), {'__eq__': lambda s, o: True})()\n"),
        FUNC_TESTS,
        0.0,
    ),
    (
        "truthy object for bare asserts",
        fenced("class T:\n    __bool__ = lambda s: True\ndef is_ok():\n    return T()\n"),
        "assert is_ok()\n",
        0.0,
    ),
    (
        "shadow builtins the tests use",  # the tests' len/abs are the driver's own
        fenced("len = lambda x: 0\nabs = lambda x: 0\ndef add(a, b): return a * 10\n"),
        ["assert abs(add(1, 2) - 3) < 1e-9", "assert len([1]) == 1"],
        0.5,
    ),
    (
        "override __builtins__ (breaks only its own sandbox)",
        fenced(
            "import builtins\nbuiltins.AssertionError = type('E', (Exception,), {})\nbuiltins.len = lambda x: 0\n__builtins__ = {}\ndef add(a, b): return 0\n"
        ),
        ["assert add(1, 2) == 3", "assert len([1]) == 1"],
        0.0,
    ),
    (
        "disable the assert rewriting",
        fenced(
            "import ast\nast.NodeTransformer.visit = lambda self, node: node\nast.parse = lambda s: ast.Module([], [])\nclass A:\n    __eq__ = lambda s, o: True\ndef add(a, b): return A()\n"
        ),
        ASSERT_TESTS,
        0.0,
    ),
    (
        "patch the harness module",
        fenced(
            "import __main__, sys\nfor m in list(sys.modules.values()):\n    for k in ('_make_guards', '_compile_tests', '_read_blob'):\n        if hasattr(m, k): setattr(m, k, lambda *a, **k: (lambda *a: True, lambda *a: True))\ndef add(a, b): return 0\n"
        ),
        ASSERT_TESTS,
        0.0,
    ),
    (
        "define the test helpers itself",
        fenced(
            "__grpokit_cmp__ = lambda *a: True\n__grpokit_truth__ = lambda v: True\ndef check(c): pass\ndef add(a, b): return 0\n"
        ),
        "def check(candidate):\n    assert candidate(2, 2) == 4\n\ncheck(add)\n",
        0.0,
    ),
    (
        "print fake results",
        fenced(
            "print('ok 0 1\\nok 1 1\\ndone')\nimport sys\nsys.stderr.write('PASSED')\ndef add(a, b): return 0\n"
        ),
        ASSERT_TESTS,
        0.0,
    ),
    (
        "write fake results to every fd",
        fenced(
            "import os\nfor fd in range(3, 64):\n    try: os.write(fd, b'x 0 1\\nx 1 1\\nx done\\n')\n    except OSError: pass\nos._exit(0)\n"
        ),
        ASSERT_TESTS,
        0.0,
    ),
    (
        "atexit and threads after exit",
        fenced(
            "import atexit, threading, os\natexit.register(lambda: os.write(1, b'0 1'))\nthreading.Thread(target=lambda: None).start()\nraise SystemExit(0)\n"
        ),
        ASSERT_TESTS,
        0.0,
    ),
    (
        "reads the tests from disk or environment",
        fenced(
            "import os, glob\n"
            "def solve():\n"
            "    hay = repr(dict(os.environ))\n"
            "    for pattern in ('*', '../*', '/tmp/*', '/tmp/*/*', '/proc/*/cmdline', '/proc/*/environ', '/proc/self/fd/*', '/dev/shm/*'):\n"
            "        for p in glob.glob(pattern):\n"
            "            try: hay += open(p, errors='ignore').read(100000)\n"
            "            except Exception: pass\n"
            '    i = hay.find("solve() == \'")\n'
            "    return hay[i + 12:i + 44] if i >= 0 else ''\n"
        ),
        SECRET_TESTS,
        0.0,
    ),
    ("infinite loop", fenced("def add(a, b):\n    while True: pass\n"), ASSERT_TESTS, 0.0),
    ("infinite loop at top level of a stdin program", fenced("while True: pass"), IO_TESTS, 0.0),
    (
        "fork bomb",
        fenced("import os\nwhile True:\n    try: os.fork()\n    except OSError: pass\n"),
        ASSERT_TESTS,
        0.0,
    ),
    (
        "memory bomb, one allocation",
        fenced("x = bytearray(10**11)\ndef add(a, b): return a + b\n"),
        ASSERT_TESTS,
        0.0,
    ),
    ("memory bomb, growing", fenced("x = []\nwhile True: x.append(' ' * 10**7)\n"), ASSERT_TESTS, 0.0),
    ("output flood", fenced("while True: print('x' * 10000)"), IO_TESTS, 0.0),
    ("returns None", fenced("def add(a, b):\n    a + b\n"), ASSERT_TESTS, 0.0),
    (
        "mock.ANY",
        fenced("from unittest import mock\ndef add(a, b): return mock.ANY\n"),
        FUNC_TESTS,
        0.0,
    ),
    (
        "writes outside its directory",
        fenced(
            f"import os\nfor p in ({MARK!r}, {HERE_MARK!r}, '/pwned', os.path.expanduser('~/../pwned')):\n"
            "    try: open(p, 'w').write('x')\n    except OSError: pass\n"
            "def add(a, b): return a + b\n"
        ),
        ASSERT_TESTS,
        1.0,
    ),
]


@pytest.fixture(scope="module")
def scores():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    socket_code = fenced(
        "import socket\ndef add(a, b):\n"
        f"    s = socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
        "    s.sendall(b'leak')\n    return a + b\n"
    )
    rows = ROWS + [("opens a socket", socket_code, ASSERT_TESTS, 0.0 if ISOLATED else 1.0)]
    connections = []

    def accept():
        try:
            connections.append(listener.accept())
        except OSError:
            pass

    out = reward([None] * len(rows), [r[1] for r in rows], tests=[r[2] for r in rows])
    accept()
    listener.close()
    return {r[0]: (s, r[3]) for r, s in zip(rows, out)}, connections


@pytest.mark.slow
@needs_isolation
@pytest.mark.parametrize("name", [r[0] for r in ROWS] + ["opens a socket"])
def test_row(scores, name):
    got, expected = scores[0][name]
    assert got == pytest.approx(expected), name


@needs_isolation
def test_host_unharmed(scores):
    assert not os.path.exists(MARK)
    assert not os.path.exists(HERE_MARK)
    assert not os.path.exists("/pwned")


@needs_isolation
def test_no_network(scores):
    assert scores[1] == []


@needs_isolation
def test_not_applicable_and_missing_column():
    assert reward([None, None], ["x", "y"], tests=[None, "[]"]) == [None, None]
    with pytest.raises(KeyError, match="tests"):
        reward([None], ["x"], test_list=["assert True"])


HUMANEVAL = [  # (canonical solution, test, entry point): HumanEval/0, /32, /107, /111
    (
        """
        from typing import List
        def has_close_elements(numbers: List[float], threshold: float) -> bool:
            for idx, elem in enumerate(numbers):
                for idx2, elem2 in enumerate(numbers):
                    if idx != idx2:
                        distance = abs(elem - elem2)
                        if distance < threshold:
                            return True
            return False
        """,
        """
        METADATA = {'author': 'jt', 'dataset': 'test'}
        def check(candidate):
            assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3) == True
            assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.05) == False
            assert candidate([1.0, 2.0, 5.9, 4.0, 5.0], 0.95) == True
            assert candidate([1.1, 2.2, 3.1, 4.1, 5.1], 1.0) == True
        """,
        "has_close_elements",
    ),
    (
        """
        import math
        def poly(xs: list, x: float):
            return sum([coeff * math.pow(x, i) for i, coeff in enumerate(xs)])
        def find_zero(xs: list):
            begin, end = -1., 1.
            while poly(xs, begin) * poly(xs, end) > 0:
                begin *= 2.0
                end *= 2.0
            while end - begin > 1e-10:
                center = (begin + end) / 2.0
                if poly(xs, center) * poly(xs, begin) > 0:
                    begin = center
                else:
                    end = center
            return begin
        """,
        """
        def check(candidate):
            import math
            import random
            rng = random.Random(42)
            import copy
            for _ in range(30):
                ncoeff = 2 * rng.randint(1, 4)
                coeffs = []
                for _ in range(ncoeff):
                    coeff = rng.randint(-10, 10)
                    if coeff == 0:
                        coeff = 1
                    coeffs.append(coeff)
                solution = candidate(copy.deepcopy(coeffs))
                assert math.fabs(poly(coeffs, solution)) < 1e-4
        """,
        "find_zero",
    ),
    (
        """
        def even_odd_palindrome(n):
            def is_palindrome(n):
                return str(n) == str(n)[::-1]
            even_palindrome_count = 0
            odd_palindrome_count = 0
            for i in range(1, n+1):
                if i%2 == 1 and is_palindrome(i):
                    odd_palindrome_count += 1
                elif i%2 == 0 and is_palindrome(i):
                    even_palindrome_count += 1
            return (even_palindrome_count, odd_palindrome_count)
        """,
        """
        def check(candidate):
            assert candidate(123) == (8, 13)
            assert candidate(12) == (4, 6)
            assert candidate(9) == (4, 5), "This prints if this assert fails 1 (good for debugging!)"
            assert candidate(1) == (0, 1), "This prints if this assert fails 2 (also good for debugging!)"
        """,
        "even_odd_palindrome",
    ),
    (
        """
        def histogram(test):
            dict1={}
            list1=test.split(" ")
            t=0
            for i in list1:
                if(list1.count(i)>t) and i!='':
                    t=list1.count(i)
            if t>0:
                for i in list1:
                    if(list1.count(i)==t):
                        dict1[i]=t
            return dict1
        """,
        """
        def check(candidate):
            assert candidate('a b b a') == {'a':2,'b': 2}, "This prints if this assert fails 1 (good for debugging!)"
            assert candidate('a b c a b') == {'a': 2, 'b': 2}
            assert candidate('') == {}
            assert candidate('a') == {'a': 1}
        """,
        "histogram",
    ),
]


@needs_isolation
def test_humaneval_canonical_solutions_pass_and_none_fails():
    completions, tests = [], []
    for solution, test, entry in HUMANEVAL:
        body = textwrap.dedent(test) + f"\ncheck({entry})\n"
        completions += [fenced(textwrap.dedent(solution)), fenced(f"def {entry}(*args):\n    return None\n")]
        tests += [body, body]
    assert reward([None] * len(tests), completions, tests=tests) == [1.0, 0.0] * len(HUMANEVAL)


@needs_isolation
def test_plain_data_semantics():
    rows = [  # (code, tests, expected)
        (  # arguments are copied in, nothing flows back: an in-place change is not seen
            "def sort_in_place(xs):\n    xs.sort()\n",
            "l = [3, 1, 2]\nsort_in_place(l)\nassert l == [1, 2, 3]\n",
            0.0,
        ),
        (  # whatever the candidate raises is one opaque error: except Exception sees it...
            "def div(a, b):\n    return a / b\n",
            "try:\n    div(1, 0)\nexcept Exception:\n    pass\nelse:\n    raise AssertionError\n",
            1.0,
        ),
        (  # ... a built-in class does not
            "def div(a, b):\n    return a / b\n",
            "try:\n    div(1, 0)\nexcept ZeroDivisionError:\n    pass\n",
            0.0,
        ),
        ("def big():\n    return float('inf')\n", "assert big() == float('inf')\n", 1.0),  # inf is a value
        (
            "import math\ndef area(r):\n    return math.pi * r * r\n",
            ["assert math.isclose(area(2), 12.566, rel_tol=0.001)"],
            1.0,
        ),
        (
            "from collections import Counter\ndef count(s):\n    return Counter(s)\n",
            "assert count('aab') == {'a': 2, 'b': 1}\n",
            1.0,
        ),
        (
            "def pairs():\n    return {(1, 2): {3}, 4: frozenset([5]), 'x': b'y'}\n",
            "assert pairs() == {(1, 2): {3}, 4: frozenset([5]), 'x': b'y'}\n",
            1.0,
        ),
        ("def pair():\n    return [1, 2]\n", "assert pair() == (1, 2)\n", 0.0),  # a list is not a tuple
        ("def missing():\n    return 1\n", "assert other() == 1\n", 0.0),
    ]
    assert reward([None] * len(rows), [fenced(r[0]) for r in rows], tests=[r[1] for r in rows]) == [
        r[2] for r in rows
    ]


@needs_isolation
def test_tests_passing_a_function_are_refused_with_a_clear_error():
    with pytest.raises(ValueError, match=r"row 0 .*plain data"):
        reward(
            [None],
            [fenced("def apply(f, x):\n    return f(x)\n")],
            tests=["assert apply(lambda x: x + 1, 1) == 2"],
        )


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs util-linux's unshare")
def test_refuses_without_isolation_unless_asked():
    """In a user namespace whose max_user_namespaces is 0, the sandbox cannot isolate: `auto`
    refuses to run the code, `isolation="none"` runs it with a warning."""
    script = textwrap.dedent(
        """
        import logging, sys
        from grpokit.rewards.code import make_code_tests
        args = ([None], ["def add(a, b):\\n    return a + b\\n"])
        try:
            make_code_tests()(*args, tests=["assert add(1, 2) == 3"])
            print("ran")
        except RuntimeError as e:
            print("refused" if "isolation='none'" in str(e) else e)
        logging.basicConfig(level=logging.WARNING)
        print(make_code_tests(isolation="none", timeout_s=5)(*args, tests=["assert add(1, 2) == 3"]))
        """
    )
    root = str(REPO)
    proc = subprocess.run(
        [
            "unshare",
            "-Ur",
            "sh",
            "-c",
            'echo 0 > /proc/sys/user/max_user_namespaces && exec "$0" -c "$1"',
            sys.executable,
            script,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=root,
    )
    if proc.returncode != 0 and "unshare failed" in proc.stderr:
        pytest.skip(f"user namespaces unavailable: {proc.stderr.strip()}")
    assert proc.stdout.split() == ["refused", "[1.0]"], proc.stderr[-2000:]
    assert "isolation='none'" in proc.stderr and "signal or ptrace" in proc.stderr


@pytest.mark.slow
def test_fallback_isolation_none_still_scores_and_limits():
    weak = make_code_tests(timeout_s=2.0, memory_mb=256, isolation="none", workers=2)
    rows = [
        (fenced(GOOD), ASSERT_TESTS, 1.0),
        (fenced("import sys\nsys.exit(0)\n"), ASSERT_TESTS, 0.0),
        (fenced("class A:\n    __eq__ = lambda s, o: True\ndef add(a, b): return A()\n"), ASSERT_TESTS, 0.0),
        (fenced("def add(a, b):\n    while True: pass\n"), ASSERT_TESTS, 0.0),
        (fenced("x = bytearray(10**11)\n"), ASSERT_TESTS, 0.0),
    ]
    assert weak([None] * 5, [r[0] for r in rows], tests=[r[1] for r in rows]) == [r[2] for r in rows]


def test_extract_code_and_parse_tests():
    assert extract_code("a\n```python\nx = 1\n```\nb\n```\ny = 2\n```") == "y = 2\n"
    assert extract_code("no fences") == "no fences"
    assert extract_code("```python\nx = 1\ny = 2") == "x = 1\ny = 2"  # truncated final block
    assert parse_tests({"inputs": ["1"], "outputs": ["2"]}) == ("io", [("1", "2")])
    assert parse_tests('[{"input": "1", "output": 2}]') == ("io", [("1", "2")])
    assert parse_tests(FUNC_TESTS)[1]["functions"] == ["test_a", "test_b", "test_c"]
    assert normalize_output("  5 \n6   7\n\n") == normalize_output("5\n6 7")
    with pytest.raises(ValueError):
        parse_tests(42)


@needs_isolation
def test_many_threads_are_limited():
    code = fenced(
        "import threading, time\nn = 0\nfor _ in range(100):\n    try:\n"
        "        threading.Thread(target=time.sleep, args=(1,)).start(); n += 1\n"
        "    except RuntimeError: break\ndef count(): return n\n"
    )
    assert reward([None], [code], tests=["assert count() < 100"]) == [1.0]


@pytest.mark.slow
@needs_isolation
def test_one_looping_completion_costs_one_budget_and_no_other_score():
    """8 stdin/stdout cases and 4 completions, one looping: the loop costs one budget (not 8), scores 0,
    is counted as timed out, and the honest completions keep 1.0 through the runner; the run goes on."""
    from grpokit.scoring.runner import RewardRunner

    cases = [{"input": f"{i} {i}\n", "output": f"{2 * i}\n"} for i in range(8)]
    honest = fenced("a, b = map(int, input().split())\nprint(a + b)\n")
    looping = fenced("while True:\n    pass\n")
    budget = make_code_tests(timeout_s=2.5, memory_mb=256, workers=2)
    start = time.monotonic()
    assert budget([None], [looping], tests=[cases]) == [0.0]
    assert time.monotonic() - start < 2.5 + 7.5  # one budget (+ slack for a busy machine), not 8 x 2.5 s
    runner = RewardRunner([("code", budget, 1.0)], timeout_s=20.0, completion_timeout_s=8.0, workers=2)
    res = runner([None] * 4, [honest, looping, honest, honest], {"tests": [cases] * 4})
    runner.close()
    assert res.per_function["code"] == [1.0, 0.0, 1.0, 1.0]
    assert res.failure(0.0, None, [honest] * 4) is None
    assert res.logged["reward/code/timed_out"] == pytest.approx(0.25)  # one of four, one call each


def test_the_driver_refuses_answers_built_to_cost_it_cpu_or_to_fool_comparisons():
    """decode(strict=True), as the driver reads answers: 30,000 ints that all hash to 0 would take it
    ~20 s to put in a set; a Decimal of 1e999999999 would take int() forever; NaN passes `abs(g - w) > tol`."""
    from grpokit.sandbox import _plain

    collide = {"s": [k * (2**61 - 1) for k in range(1, 30000)]}
    pairs = {"d": [[k * (2**61 - 1), 0] for k in range(1, 30000)]}
    start = time.process_time()  # this process's CPU time: a busy machine does not move it (~0.05 s here)
    with pytest.raises(_plain.Refused):
        _plain.decode(collide, strict=True)
    with pytest.raises(_plain.Refused):
        _plain.decode(pairs, strict=True)
    assert time.process_time() - start < 4.0  # the set the refusal avoids costs ~20 s of CPU
    for value in (
        {"f": "nan"},
        [1.0, {"t": [{"f": "nan"}]}],
        {"c": [0.0, {"f": "nan"}]},
        {"dec": "NaN"},
        {"dec": "1e999999999"},
    ):
        with pytest.raises(_plain.Refused):
            _plain.decode(value, strict=True)
        _plain.decode(value)  # the sandbox side reads the tests' arguments as they are
    # honest values pass: -1 and -2 share a hash, so do a few ints; inf is a value
    assert _plain.decode({"s": [-1, -2, 2**61 - 1, 0]}, strict=True) == {-1, -2, 2**61 - 1, 0}
    assert _plain.decode([{"f": "inf"}, {"dec": "1e100"}], strict=True)[0] == float("inf")
    assert len(_plain.decode({"s": list(range(100_000))}, strict=True)) == 100_000


def test_prompt_definitions_are_the_prompts_helpers_not_the_function_asked_for():
    from grpokit.rewards.code import prompt_definitions

    humaneval_32 = (
        "import math\n\n\ndef poly(xs: list, x: float):\n    return sum(c * math.pow(x, i) for i, c in enumerate(xs))\n\n\n"
        'def find_zero(xs: list):\n    """ find x such that poly(x) = 0 """\n'
    )
    defs = prompt_definitions(humaneval_32)
    assert "import math" in defs and "def poly" in defs and "find_zero" not in defs
    fix_this = "Fix it:\n```python\ndef helper(x):\n    return 2 * x\n\ndef add(a, b):\n    return a - b\n```"
    assert prompt_definitions(fix_this).startswith("def helper") and "def add" not in prompt_definitions(
        fix_this
    )
    assert "def add" not in prompt_definitions(fix_this, entry_point="add")
    assert "def add" in prompt_definitions(
        fix_this, entry_point="helper"
    )  # the entry point is the one left out
    assert prompt_definitions("Write a function that adds two numbers.") is None
    chat = [
        {"role": "user", "content": "```python\ndef sq(x):\n    return x * x\n\ndef f(x):\n    pass\n```"}
    ]
    assert prompt_definitions(chat) == "def sq(x):\n    return x * x"


@needs_isolation
def test_the_fork_server_dies_with_the_process_that_scores():
    """A scoring process killed with SIGKILL leaves no fork server (nor any run of it) behind."""
    script = "from grpokit.sandbox import run_program\nimport time\nprint(run_program('print(1)').stdout, flush=True)\ntime.sleep(60)\n"
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "1"

    def servers():
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if ppid == proc.pid and b"_zygote.py" in f.read():
                        found.append(int(pid))
            except (OSError, ValueError, IndexError):
                pass
        return found

    server = servers()
    assert len(server) == 1
    proc.kill()
    proc.wait()

    def alive(pid):
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended
        except OSError:
            return False

    deadline = time.monotonic() + 10
    while alive(server[0]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(server[0])


POLY_HELPER = (  # HumanEval/32's prompt: the tests call its poly
    "import math\n\n\ndef poly(xs: list, x: float):\n    return sum(c * math.pow(x, i) for i, c in enumerate(xs))\n\n\n"
    'def find_zero(xs: list):\n    """ find x such that poly(x) = 0 """\n'
)
POLY_CHECK = (
    "def check(candidate):\n    import math, random\n    rng = random.Random(3)\n    for _ in range(10):\n"
    "        coeffs = [rng.randint(1, 10) * rng.choice([-1, 1]) for _ in range(2 * rng.randint(1, 3))]\n"
    "        assert math.fabs(poly(coeffs, candidate(list(coeffs)))) < 1e-4\n"
)
POLY_BISECT = (
    "import math\ndef find_zero(xs):\n    f = lambda x: sum(c * math.pow(x, i) for i, c in enumerate(xs))\n    lo, hi = -1.0, 1.0\n"
    "    while f(lo) * f(hi) > 0:\n        lo, hi = lo * 2, hi * 2\n    while hi - lo > 1e-10:\n        mid = (lo + hi) / 2\n"
    "        if f(mid) * f(lo) > 0: lo = mid\n        else: hi = mid\n    return lo\n"
)
STUB_HELPER = "def poly(xs, x):\n    return 0.0\n\ndef find_zero(xs):\n    return 0.0\n"


@needs_isolation
def test_the_prompts_helpers_are_found_in_every_prompt_shape():
    """A candidate that redefines the prompt's helper as a stub (poly -> 0, so any x "is a root") must not
    pass, whatever the prompt's shape; the bisection passes in each. Before: with an instruction line
    before the code, or a chat prompt with a system message, the stub passed."""
    shapes = {
        "plain": POLY_HELPER,
        "instruction first": "Complete the following function.\n" + POLY_HELPER,
        "instruction after": POLY_HELPER + "\nWrite only the body.",
        "fenced": f"Complete it:\n```python\n{POLY_HELPER}```\n",
        "chat with a system message": [
            {"role": "system", "content": "You are a careful Python programmer."},
            {"role": "user", "content": "Complete the following function.\n" + POLY_HELPER},
        ],
        "chat, content parts": [
            {"role": "system", "content": [{"type": "text", "text": "Answer with code."}]},
            {"role": "user", "content": [{"type": "text", "text": "Here:\n" + POLY_HELPER}]},
        ],
    }
    tests = POLY_CHECK + "\ncheck(find_zero)\n"
    prompts, completions = [], []
    for prompt in shapes.values():
        prompts += [prompt, prompt]
        completions += [fenced(POLY_BISECT), fenced(STUB_HELPER)]
    scores = reward(prompts, completions, tests=[tests] * len(prompts))
    assert dict(zip(shapes, zip(scores[::2], scores[1::2]))) == {name: (1.0, 0.0) for name in shapes}


HUMANEVAL_0 = (  # HumanEval/0 as the dataset has it: prompt, canonical solution (a body), test, entry point
    "from typing import List\n\n\ndef has_close_elements(numbers: List[float], threshold: float) -> bool:\n"
    '    """ Check if in given list of numbers, are any two numbers closer to each other than\n'
    '    given threshold.\n    >>> has_close_elements([1.0, 2.0, 3.0], 0.5)\n    False\n    """\n',
    "    for idx, elem in enumerate(numbers):\n        for idx2, elem2 in enumerate(numbers):\n            if idx != idx2:\n"
    "                distance = abs(elem - elem2)\n                if distance < threshold:\n                    return True\n\n"
    "    return False\n",
    "\n\nMETADATA = {\n    'author': 'jt',\n    'dataset': 'test'\n}\n\n\ndef check(candidate):\n"
    "    assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3) == True\n    assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.05) == False\n"
    "    assert candidate([1.0, 2.0, 5.9, 4.0, 5.0], 0.95) == True\n    assert candidate([1.1, 2.2, 3.1, 4.1, 5.1], 1.0) == True\n\n",
    "has_close_elements",
)


@needs_isolation
def test_entry_point_rows_score_canonical_solutions_and_call_check():
    """HumanEval's own columns: the completion is the body that continues the prompt, and the test defines
    check(candidate) without calling it. The canonical body scores 1 (before: 0, it did not define the
    function); a wrong body or a wrong full function scores 0 (before: 1, check was never called), with
    or without the entry_point column (the prompt's last function is the one asked)."""
    prompt, body, test, entry = HUMANEVAL_0
    wrong_body = "    return False\n"
    wrong_function = "def has_close_elements(numbers, threshold):\n    return False\n"
    completions = [body, wrong_body, fenced(wrong_function), fenced(prompt + body)]
    expected = [1.0, 0.0, 0.0, 1.0]
    n = len(completions)
    assert reward([prompt] * n, completions, tests=[test] * n, entry_point=[entry] * n) == expected
    assert reward([prompt] * n, completions, tests=[test] * n) == expected
    with pytest.raises(ValueError, match="entry_point"):  # nothing names the function check should get
        reward([None], [fenced(wrong_function)], tests=[test])


@needs_isolation
def test_answers_past_pythons_integer_string_limit():
    """Python refuses ints of more than 4,300 digits in str() and int(); a right answer that large
    scored 0: the value now travels as hex, and the program's own print/int have no limit."""
    tests = "assert power(7, 20000) == 7 ** 20000\nassert power(2, 10) == 1024\n"
    right, wrong = "def power(a, b):\n    return a ** b\n", "def power(a, b):\n    return a ** b + 1\n"
    assert reward([None, None], [fenced(right), fenced(wrong)], tests=[tests, tests]) == [1.0, 0.0]
    io = [{"input": "8" * 5000 + "\n", "output": "8" * 4999 + "9\n"}]
    add_one = "print(int(input()) + 1)\n"
    assert reward([None, None], [fenced(add_one), fenced("print(1)\n")], tests=[io, io]) == [1.0, 0.0]


ADD_CHECK = "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-4, 1) == -3\n"
WRONG_ADD = "def add(a, b):\n    return a - b\n"
USAGE_FENCE = (
    "Write a function that returns the sum of a and b.\n\nFor example:\n```python\n>>> add(2, 3)\n5\n```\n"
)
INDENTED_STUB = 'Complete the following function.\n\n    def add(a, b):\n        """The sum of a and b."""\n\nReturn only code.'
NAMED_IN_TEXT = "Implement `add(a, b)`, which returns the sum of its arguments."
INDENTED_HELPER = (  # HumanEval/38's layout as a Markdown indented block: the tests call the prompt's helper
    "Complete decode_cyclic.\n\n    def encode_cyclic(s: str):\n"
    "        groups = [s[(3 * i):min((3 * i + 3), len(s))] for i in range((len(s) + 2) // 3)]\n"
    "        groups = [(group[1:] + group[0]) if len(group) == 3 else group for group in groups]\n"
    '        return "".join(groups)\n\n\n    def decode_cyclic(s: str):\n        """Decode what encode_cyclic made."""\n'
)
CYCLIC_CHECK = "def check(candidate):\n    for s in ('abcdefg', 'xyzzy', 'ab'):\n        assert candidate(encode_cyclic(s)) == s\n"
CYCLIC_RIGHT = (
    "def decode_cyclic(s):\n    groups = [s[3 * i:min(3 * i + 3, len(s))] for i in range((len(s) + 2) // 3)]\n"
    "    return ''.join(g[-1] + g[:-1] if len(g) == 3 else g for g in groups)\n"
)
CYCLIC_STUB = "def encode_cyclic(s):\n    return s\n\ndef decode_cyclic(s):\n    return s\n"


@needs_isolation
def test_the_function_asked_is_found_in_every_prompt_shape_without_an_entry_point_column():
    """HumanEval-style tests that define check(candidate) and never call it, no entry_point column (issue 51):
    the prompt's only fence is a usage example, its code is a Markdown indented block (a stub the completion
    continues or replaces, or a helper the tests call), or its text only names the function; the completion's
    code may itself be an indented block after a line of prose. Right scores 1, wrong 0 in each (before: a
    ValueError for the whole batch in all but the helper shape, where the stub that redefines the helper
    scored 1 because the prompt's helper was not found)."""
    prose = "Here is my solution:\n\n" + textwrap.indent(GOOD, "    ") + "\nIt adds the two numbers."
    rows = [  # name, prompt, completion, tests, expected
        ("usage fence", USAGE_FENCE, fenced(GOOD), ADD_CHECK, 1.0),
        ("usage fence, wrong", USAGE_FENCE, fenced(WRONG_ADD), ADD_CHECK, 0.0),
        ("indented stub, body", INDENTED_STUB, "    return a + b\n", ADD_CHECK, 1.0),
        ("indented stub, wrong body", INDENTED_STUB, "    return a - b\n", ADD_CHECK, 0.0),
        ("indented stub, whole function", INDENTED_STUB, fenced(GOOD), ADD_CHECK, 1.0),
        ("named in the text", NAMED_IN_TEXT, fenced(GOOD), ADD_CHECK, 1.0),
        ("named in the text, wrong", NAMED_IN_TEXT, fenced(WRONG_ADD), ADD_CHECK, 0.0),
        ("completion as an indented block", USAGE_FENCE, prose, ADD_CHECK, 1.0),
        ("indented helper", INDENTED_HELPER, fenced(CYCLIC_RIGHT), CYCLIC_CHECK, 1.0),
        ("indented helper, stub redefines it", INDENTED_HELPER, fenced(CYCLIC_STUB), CYCLIC_CHECK, 0.0),
    ]
    scores = reward([r[1] for r in rows], [r[2] for r in rows], tests=[r[3] for r in rows])
    assert dict(zip([r[0] for r in rows], scores)) == {r[0]: r[4] for r in rows}


@needs_isolation
def test_a_row_whose_function_nothing_names_fails_alone_with_its_reason():
    """When neither an entry_point column, the prompt's code, nor a name the prompt uses says which function
    check(candidate) should get, that row is not scored 0 and not left out silently: through the runner it
    fails alone with the reason (row_errors, reward/code_tests/failed_rows), the other rows are scored."""
    from grpokit.rewards import RewardRunner

    runner = RewardRunner([("code_tests", reward, 1.0)], timeout_s=60)
    try:
        result = runner(
            [USAGE_FENCE, "Write a function that adds two numbers."],
            [fenced(GOOD), fenced(GOOD)],
            {"tests": [ADD_CHECK, ADD_CHECK]},
        )
    finally:
        runner.close()
    assert result.per_function["code_tests"] == [1.0, None]
    assert list(result.row_errors["code_tests"]) == [1]
    assert "never call it" in result.row_errors["code_tests"][1]
    assert "entry_point" in result.row_errors["code_tests"][1]


def test_indented_blocks_and_extract_code():
    from grpokit.rewards._code_parts import indented_blocks, prompt_names

    text = "Prose.\n\n    def f():\n        return 1\n\n    x = f()\nMore prose.\n\n\tg()\n"
    assert indented_blocks(text) == ["def f():\n    return 1\n\nx = f()\n", "g()\n"]
    assert indented_blocks("    return a + b\n") == []  # no prose: the text is code (a HumanEval body)
    assert extract_code("    return a + b\n") == "    return a + b\n"
    assert extract_code("Prose:\n\n    print(1)\n") == "print(1)\n"
    assert (
        extract_code("Prose:\n    not a block (no blank line before)\n")
        == "Prose:\n    not a block (no blank line before)\n"
    )
    assert prompt_names(USAGE_FENCE) == ["add"] and prompt_names(NAMED_IN_TEXT) == ["add"]
