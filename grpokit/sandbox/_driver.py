"""Test driver of `code_tests`: runs one completion's tests in a clean process of its own, outside
the sandbox: a child of the fork server (`_zygote.py`, which loads this file by path; grpokit never
imports it), one per completion.

The header {"limits", "isolate", "site_packages", "slot"} comes with the fork; the job {"code",
"tests", "prompt_defs", "entry_point"} is read from a pipe once the sandbox is started, so the
sandbox (forked from here) never holds it; the verdict is {"passed": [bool, ...], "unsupported":
null | message, "timed_out": bool}. The tests never leave this process: the candidate's code runs in a sandbox started from here
(`sandbox.Sandbox`, serve mode), and each name the tests use but do not define (the candidate's
functions) is a `CandidateFunction` whose call sends plain-data arguments to the sandbox and returns
the plain data it answers, rebuilt here as new built-in objects (`_plain.decode`). Comparisons,
`assert`, `abs`, `len`, ... are this interpreter's own; nothing the candidate defines runs here.

What the verdict may rest on (plain data only):
  - a call's value; the arguments are copied into the sandbox and nothing flows back (a change the
    candidate makes to them in place is not seen: tests that expect one fail);
  - an exception in the candidate is one opaque `CandidateRaised` (an Exception, never a built-in
    one): `except Exception` sees it, `except ValueError` does not, and it cannot end a `map`,
    `zip` or `for` loop early as a `StopIteration` would;
  - NaN (a float, a complex part or a Decimal, at any depth) fails the case: no comparison with it
    is true, so `if abs(got - want) > tol: raise` would pass. +-inf is a value like any other;
  - anything that is not plain data fails the case; so does an answer whose sets or dict keys
    collide in hash (built to make this process spend its CPU), or a Decimal beyond 1e+-10000;
  - names the tests use that the prompt defines completely (HumanEval's `poly`, `encode_cyclic`)
    are the prompt's own definitions, run here (`prompt_defs`); only the others, and at most the
    `entry_point` when it is known, reach the candidate.
The run has one budget, `wall_s`: past it the running case and all later ones fail (an interval
timer here; the caller kills this process 2 s later, whatever it is doing).
"""

import ast
import builtins
import importlib
import json
import os
import resource
import select
import signal
import sys
import time
from importlib.util import module_from_spec, spec_from_file_location

HERE = os.path.dirname(os.path.abspath(__file__))


def _load(name, filename):
    spec = spec_from_file_location(name, os.path.join(HERE, filename))
    module = module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


plain = _load("_grpokit_plain", "_plain.py")
sandbox = _load("_grpokit_sandbox", "parent.py")


class SandboxLost(BaseException):
    """The sandbox died, timed out or broke the protocol: every case from now on fails.
    A BaseException so that `except Exception` in a test cannot turn it into a pass."""


class NotPlainResult(BaseException):
    """The candidate returned something that is not plain data: the running case fails."""


class Unsupported(BaseException):
    """The tests pass the candidate something that cannot travel as plain data."""


class CandidateRaised(Exception):
    """The candidate raised: one opaque error whatever it raised (never a built-in the tests catch)."""


class Overtime(BaseException):
    """The completion's budget is spent: the running case and every later one fail."""


class Channel:
    def __init__(self, box, limits, deadline):
        self.box, self.limit, self.deadline = box, limits["max_output_bytes"], deadline
        self.lost = self.case_failed = self.timed_out = False
        self.unsupported = None

    def _fail(self, why):
        self.lost = True
        self.box.close(grace_s=1.0)
        raise SandboxLost(why)

    def _write(self, data):
        fd = self.box.req_w
        os.set_blocking(fd, False)
        view = memoryview(data)
        while view:
            left = self.deadline - time.monotonic()
            if left <= 0 or not select.select([], [fd], [], left)[1]:
                self.timed_out = True
                self._fail("timed out")
            try:
                view = view[os.write(fd, view) :]
            except BlockingIOError:
                continue
            except OSError:
                self._fail("sandbox closed its input")

    def _read(self, n):
        fd, out = self.box.resp_r, bytearray()
        while len(out) < n:
            left = self.deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                self.timed_out = True
                self._fail("timed out")
            chunk = os.read(fd, min(n - len(out), 1 << 20))
            if not chunk:
                self._fail("sandbox ended")
            out += chunk
        return bytes(out)

    def exchange(self, message):
        if self.lost:
            raise SandboxLost("sandbox already lost")
        self._write(plain.dumps(message))
        n = int.from_bytes(self._read(plain.HEADER), "little")
        if n > self.limit:
            self._fail(f"answer of {n} bytes")
        try:
            answer = json.loads(self._read(n))
            if type(answer) is not dict or len(answer) != 1:
                raise ValueError("bad answer")
            return answer
        except (ValueError, RecursionError):
            self._fail("malformed answer")

    def call(self, name, args, kwargs):
        try:
            message = {"name": name, "args": plain.encode(list(args)), "kwargs": plain.encode(dict(kwargs))}
        except plain.NotPlain as e:
            self.unsupported = (
                f"the tests pass {e} to `{name}`; only plain data (numbers, strings, lists, tuples, "
                "dicts, sets, None, bools, bytes) can be sent to the sandboxed candidate"
            )
            raise Unsupported(self.unsupported) from None
        answer = self.exchange(message)
        if "raise" in answer:
            raise CandidateRaised(f"{name} raised")
        if "ok" not in answer:
            self.case_failed = True
            raise NotPlainResult(f"{name}: not plain data")
        try:
            return plain.decode(answer["ok"], strict=True)
        except plain.Refused as e:
            self.case_failed = True
            raise NotPlainResult(f"{name}: {e}") from None
        except (ValueError, TypeError, RecursionError, OverflowError, ArithmeticError):
            self._fail("malformed answer")


class CandidateFunction:
    """Stands for a function of the candidate's code in the tests' namespace."""

    __slots__ = ("__name__", "_channel")

    def __init__(self, channel, name):
        self.__name__, self._channel = name, channel

    def __call__(self, *args, **kwargs):
        return self._channel.call(self.__name__, args, kwargs)

    def __repr__(self):
        return f"<candidate function {self.__name__}>"


def free_names(trees):
    """Names the tests read but that are not builtins: the candidate's, or stdlib modules used as
    `math.isclose` without an import (MBPP relies on the candidate's imports)."""
    loaded, called = set(), set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                loaded.add(node.id)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                called.add(node.func.id)
    return sorted(n for n in loaded if not hasattr(builtins, n)), called


def namespace(channel, trees, prompt_defs=None, entry_point=None):
    """The tests' globals: the prompt's own definitions, stdlib modules, and a stub per other name."""
    ns = {"__name__": "__tests__", "__builtins__": builtins}
    if prompt_defs:
        try:
            nodes = ast.parse(prompt_defs).body
        except (SyntaxError, ValueError):
            nodes = []
        for node in nodes:  # one by one: an import this interpreter lacks costs only its own names
            try:
                exec(compile(ast.Module([node], []), "<prompt>", "exec", dont_inherit=True), ns)
            except Exception:  # noqa: BLE001 - a name left undefined: the case that uses it fails
                pass
        prompts_own = {
            n.name for n in nodes if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        }
    else:
        prompts_own = set()
    names, called = free_names(trees)
    for name in names:
        if name in ns or name in prompts_own:
            continue  # the prompt defines it (if that failed here, a NameError fails the case)
        if entry_point and name != entry_point and name not in sys.stdlib_module_names:
            continue  # only the entry point is the candidate's: a NameError fails the case
        if name in sys.stdlib_module_names and name not in called:
            try:
                ns[name] = importlib.import_module(name)
                continue
            except ImportError:
                pass
        ns[name] = CandidateFunction(channel, name)
    return ns


def run_cases(channel, tests, prompt_defs=None, entry_point=None):
    """One bool per case: the case ran to its end here, every call it made was answered with
    plain data, and the sandbox was still alive."""
    if tests["kind"] == "functions":
        tree = ast.parse(tests["cases"][0])
        ns = namespace(channel, [tree], prompt_defs, entry_point)
        try:
            exec(compile(tree, "<tests>", "exec"), ns)
            functions = [ns[f] for f in tests["functions"]]
        except BaseException:  # noqa: BLE001 - the tests' top level failed: no case passes
            return [False] * len(tests["functions"])
        cases = [(fn, None) for fn in functions]
    else:
        trees = []
        for src in tests["cases"]:
            try:
                trees.append(ast.parse(src))
            except SyntaxError:
                trees.append(None)
        ns = namespace(channel, [t for t in trees if t is not None], prompt_defs, entry_point)
        cases = [(None, t) for t in trees]
    passed = []
    for fn, tree in cases:
        channel.case_failed = False
        ok = False
        if not channel.lost and (fn is not None or tree is not None):
            try:
                fn() if fn is not None else exec(compile(tree, "<tests>", "exec"), ns)
                ok = True
            except Unsupported:
                break
            except Overtime:
                channel.lost = channel.timed_out = True
            except BaseException:  # noqa: BLE001 - a failed assert, an error, a lost sandbox
                ok = False
        passed.append(ok and not channel.case_failed and not channel.lost)
    return passed


def main(header, job_fd, verdict_fd):
    """In a child of the fork server: start the sandbox first (forked from this process, which has
    not read the tests yet), then read the job from `job_fd`, run it, write the verdict to `verdict_fd`."""
    started = time.monotonic()
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)  # what the tests print goes nowhere
    limits = sandbox.SandboxLimits(**header["limits"])
    resource.setrlimit(resource.RLIMIT_AS, ((2048 + limits.memory_mb) << 20,) * 2)
    cpu = int(limits.wall_s) + 3  # the caller kills this process at wall_s + 2 s anyway
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
    box = sandbox.Sandbox("serve", limits, header["isolate"], header["site_packages"], header["slot"])
    deadline = started + limits.wall_s
    channel = Channel(box, header["limits"], deadline)

    def overtime(signum, frame):
        signal.setitimer(signal.ITIMER_REAL, 0)
        channel.lost = True
        raise Overtime

    signal.signal(signal.SIGALRM, overtime)
    signal.setitimer(signal.ITIMER_REAL, max(0.001, deadline - time.monotonic()))
    passed, unsupported = [], None
    try:
        with os.fdopen(job_fd, "rb") as f:
            job = json.loads(f.read())
        tests = job["tests"]
        n = len(tests["functions"]) if tests["kind"] == "functions" else len(tests["cases"])
        passed = [False] * n
        loaded = False
        try:
            loaded = "ok" in channel.exchange(job["code"])
        except SandboxLost:
            pass
        if loaded:
            got = run_cases(channel, tests, job.get("prompt_defs"), job.get("entry_point"))
            passed[: len(got)] = got
            unsupported = channel.unsupported
    except Overtime:
        channel.timed_out = True
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        box.close(grace_s=2.0)
    return {"passed": passed, "unsupported": unsupported, "timed_out": channel.timed_out}
