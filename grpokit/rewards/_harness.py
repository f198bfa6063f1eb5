"""Child side of the code sandbox. Run as a script by `grpokit.rewards.sandbox`, never imported.

argv[1] is a JSON config (limits, uid, mode); it holds no test data. A pipe (payload_fd) carries the payload as
two length-prefixed blobs: the candidate's code, then (read only after the candidate's top-level
code has run) the tests and a per-run nonce. Another pipe (result_fd) receives one line per finished test case,
"<nonce> <index> <0|1>", written by this harness after the case actually ran. Anything the
candidate prints goes to stdout/stderr, which the parent never parses for results.

Order of events (root, isolation on):
  outer (host pid ns) -> unshare(net, mount, pid, ipc) -> fork
    init (pid 1 of the new ns, root): private mounts, tmpfs on /tmp /var/tmp /dev/shm /run/lock,
      fresh /proc, / remounted read-only, dies with outer (PDEATHSIG) -> fork
      worker: rlimits, chdir /tmp/work, drop to the slot uid, exec candidate, run tests
When init exits the kernel kills everything left in the namespace (forks, daemons).
"""

import ast
import builtins
import ctypes
import json
import os
import resource
import signal
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG = 1
WORKDIR = "/tmp/work"


def _read_exact(fd, n):
    chunks = []
    while n > 0:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise EOFError("payload pipe closed early")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _read_blob(fd):
    n = int.from_bytes(_read_exact(fd, 8), "little")
    return _read_exact(fd, n).decode("utf-8", "replace")


def _isolate(cfg):
    """New namespaces and a private filesystem view. Returns in the worker process only."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    if libc.unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC) != 0:
        raise OSError(ctypes.get_errno(), "unshare failed")
    if libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        raise OSError(ctypes.get_errno(), "making / private failed")
    pid = os.fork()
    if pid:  # outer: relay init's exit status
        _, status = os.waitpid(pid, 0)
        os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    size = f"size={int(cfg['tmpfs_mb'])}m,mode=755".encode()
    for target in (b"/tmp", b"/var/tmp", b"/dev/shm", b"/run/lock"):
        if os.path.isdir(target):
            libc.mount(b"tmpfs", target, b"tmpfs", MS_NOSUID | MS_NODEV, size)
    libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV, None)
    libc.mount(None, b"/", None, MS_REMOUNT | MS_BIND | MS_RDONLY, None)
    # The interpreter may live where the sandbox uid cannot read (e.g. /root/.pyenv): bind its
    # prefixes read-only under /tmp and point sys.path there.
    prefixes = {sys.base_prefix, sys.prefix, sys.exec_prefix, sys.base_exec_prefix}
    moved = []
    for i, src in enumerate(sorted(prefixes, key=len, reverse=True)):
        dst = f"/tmp/.python{i}"
        os.mkdir(dst, 0o755)
        if libc.mount(src.encode(), dst.encode(), None, MS_BIND | MS_REC, None) == 0:
            libc.mount(None, dst.encode(), None, MS_REMOUNT | MS_BIND | MS_RDONLY, None)
            moved.append((src.rstrip("/") + "/", dst + "/"))

    def relocate(paths):
        for j, entry in enumerate(paths):
            for src, dst in moved:
                if isinstance(entry, str) and (entry.rstrip("/") + "/").startswith(src):
                    paths[j] = dst + entry[len(src) :]
                    break

    relocate(sys.path)
    for module in list(sys.modules.values()):  # packages already imported look up submodules here
        if isinstance(getattr(module, "__path__", None), list):
            relocate(module.__path__)
    sys.path_importer_cache.clear()
    os.makedirs(WORKDIR, mode=0o700)
    os.chown(WORKDIR, cfg["uid"], cfg["uid"])
    pid = os.fork()
    if pid:  # init: reap everything, exit with the worker's status (then the ns dies)
        code = 1
        while True:
            try:
                p, status = os.wait()
            except ChildProcessError:
                break
            if p == pid:
                code = os.waitstatus_to_exitcode(status) & 0xFF
                break
        os._exit(code)


def _limit(cfg):
    def both(which, value):
        resource.setrlimit(which, (value, value))

    cpu = int(cfg["cpu_s"]) + (0 if float(cfg["cpu_s"]).is_integer() else 1)
    resource.setrlimit(resource.RLIMIT_CPU, (max(1, cpu), max(1, cpu) + 1))
    both(resource.RLIMIT_AS, int(cfg["memory_mb"]) << 20)
    both(resource.RLIMIT_FSIZE, int(cfg["file_mb"]) << 20)
    both(resource.RLIMIT_NOFILE, 64)
    both(resource.RLIMIT_CORE, 0)
    both(resource.RLIMIT_NPROC, int(cfg["max_processes"]))


def _drop_privileges(uid):
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)


# --- comparisons the candidate's objects cannot fake --------------------------------------------
_PLAIN_SCALARS = frozenset([int, float, complex, bool, str, bytes, type(None)])
_PLAIN_CONTAINERS = frozenset([list, tuple, set, frozenset, dict])
_HEAPTYPE = 1 << 9
_PREIMPORT = (
    "collections",
    "fractions",
    "decimal",
    "math",
    "itertools",
    "functools",
    "heapq",
    "bisect",
    "re",
)


def _make_guards(trusted_types, prefixes):
    """`cmp`/`truth` used by the rewritten tests. An operand is trusted when it is plain data (exact
    builtin types, recursively) or an instance of a type that existed before the candidate ran, that
    the tests define, that is a C type, or that an installed module defines. Objects of classes the
    candidate made (the "always equal" hack: __eq__ returning True, a truthy __bool__) make the
    comparison fail. Every helper is bound here, after builtins were restored, so later patches by
    the candidate's functions do not reach them."""
    _type, _id, _set, _map, _len, _list, _zip, _bool = type, id, set, map, len, list, zip, bool
    _getattr, _isinstance, _str, _modules = getattr, isinstance, str, sys.modules
    mro_of = type.__dict__["__mro__"].__get__
    flags_of = type.__dict__["__flags__"].__get__
    module_of = type.__dict__["__module__"].__get__
    qualname_of = type.__dict__["__qualname__"].__get__
    ops = {
        "Eq": lambda a, b: a == b,
        "NotEq": lambda a, b: a != b,
        "Lt": lambda a, b: a < b,
        "LtE": lambda a, b: a <= b,
        "Gt": lambda a, b: a > b,
        "GtE": lambda a, b: a >= b,
        "In": lambda a, b: a in b,
        "NotIn": lambda a, b: a not in b,
    }

    def installed(cls):
        try:
            mod = _modules.get(module_of(cls))
            path = _getattr(mod, "__file__", None)
            if not _isinstance(path, _str) or not path.startswith(prefixes):
                return False
            obj = mod
            for part in qualname_of(cls).split("."):
                obj = _getattr(obj, part)
            return obj is cls
        except BaseException:
            return False

    def trusted_type(t):
        for c in mro_of(t):
            if _id(c) in trusted_types or not flags_of(c) & _HEAPTYPE:
                continue
            if not installed(c):
                return False
        return True

    def trusted(x, budget=200_000):
        stack = [x]
        while stack:
            budget -= 1
            if budget < 0:
                return False
            v = stack.pop()
            t = _type(v)
            if t in _PLAIN_SCALARS:
                continue
            if t in _PLAIN_CONTAINERS:
                items = _list(dict.items(v)) if t is dict else v
                if _set(_map(_type, items)) <= _PLAIN_SCALARS:
                    budget -= _len(items)
                    continue
                if t is dict:
                    for k, w in items:
                        stack.append(k)
                        stack.append(w)
                else:
                    stack.extend(items)
                continue
            if not trusted_type(t):
                return False
        return True

    def cmp(names, *operands):
        for op, a, b in _zip(names, operands, operands[1:]):
            if not (trusted(a) and trusted(b)):
                return False
            if not ops[op](a, b):
                return False
        return True

    def truth(value):
        return trusted(value) and _bool(value)

    return cmp, truth


class _Rewrite(ast.NodeTransformer):
    """Route comparisons and assert conditions in the tests through the guards."""

    def visit_Compare(self, node):
        self.generic_visit(node)
        names = [type(op).__name__ for op in node.ops]
        if any(n in ("Is", "IsNot") for n in names):
            return node  # identity cannot be faked
        call = ast.Call(
            func=ast.Name("__grpokit_cmp__", ast.Load()),
            args=[ast.Constant(tuple(names)), node.left, *node.comparators],
            keywords=[],
        )
        return ast.copy_location(call, node)

    def visit_Assert(self, node):
        self.generic_visit(node)
        node.test = ast.copy_location(
            ast.Call(func=ast.Name("__grpokit_truth__", ast.Load()), args=[node.test], keywords=[]), node.test
        )
        return node


def _compile_tests(src, name):
    tree = ast.fix_missing_locations(_Rewrite().visit(ast.parse(src)))
    return compile(tree, name, "exec", optimize=0, dont_inherit=True), tree


def _snapshot():
    """Module and class dicts the harness relies on after the candidate ran (restored before tests)."""
    import gc
    import json.decoder
    import json.scanner

    for name in _PREIMPORT:
        __import__(name)
    modules = [builtins, ast, json, json.decoder, json.scanner, os, sys.modules[__name__]]
    classes = [_Rewrite, ast.NodeTransformer, ast.NodeVisitor, ast.AST, json.JSONDecoder]
    saved = [(vars(m), dict(vars(m))) for m in modules]
    saved_cls = [(c, dict(vars(c))) for c in classes]
    type_ids = {id(t) for t in gc.get_objects() if isinstance(t, type)}
    type_ids.update(id(t) for t in vars(builtins).values() if isinstance(t, type))
    return saved, saved_cls, type_ids


def _restore(saved, saved_cls):
    for d, copy in saved:
        d.clear()
        d.update(copy)
    for cls, copy in saved_cls:
        for k in set(vars(cls)) - set(copy):
            delattr(cls, k)
        for k, v in copy.items():
            if k not in ("__dict__", "__weakref__", "__doc__") and vars(cls).get(k) is not v:
                setattr(cls, k, v)


def _run_assert(cfg, payload_fd, result_fd):
    _write, _exc, _exit, _str, _enumerate = os.write, BaseException, os._exit, str, enumerate
    saved, saved_cls, trusted_types = _snapshot()
    read_blob, loads, restore, make_guards, compile_tests = (
        _read_blob,
        json.loads,
        _restore,
        _make_guards,
        _compile_tests,
    )
    prefixes = tuple({sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix})
    code = read_blob(payload_fd)
    ns = {"__name__": "__solution__", "__builtins__": builtins}
    loaded = True
    try:
        exec(compile(code, "<solution>", "exec", optimize=0, dont_inherit=True), ns)
    except _exc:  # SystemExit included: exiting before the tests means no test ran
        loaded = False
    restore(saved, saved_cls)
    # Only now read the tests and the nonce: the candidate's top level never had them in memory.
    tests = loads(read_blob(payload_fd))
    os.close(payload_fd)
    nonce = tests["nonce"]
    if not loaded:
        _exit(3)
    cmp, truth = make_guards(trusted_types, prefixes)
    test_ns = dict(ns)
    test_ns.update(__name__="__tests__", __builtins__=builtins, __grpokit_cmp__=cmp, __grpokit_truth__=truth)

    def trust_test_classes(tree):
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and isinstance(test_ns.get(node.name), type):
                trusted_types.add(id(test_ns[node.name]))

    if tests["kind"] == "functions":  # one source defining test_* functions: each is a case
        try:
            compiled, tree = compile_tests(tests["cases"][0], "<tests>")
            exec(compiled, test_ns)
            trust_test_classes(tree)
            functions = [test_ns[f] for f in tests["functions"]]
        except _exc:
            _exit(4)
        for i, fn in _enumerate(functions):
            try:
                fn()
                ok = 1
            except _exc:
                ok = 0
            _write(result_fd, f"{nonce} {i} {ok}\n".encode())
    else:  # each source is one all-or-nothing case, run in order in a shared namespace
        compiled = []
        for i, src in _enumerate(tests["cases"]):  # compile all before any candidate code runs again
            try:
                compiled.append(compile_tests(src, f"<tests-{i}>"))
            except _exc:
                compiled.append(None)
        for i, item in _enumerate(compiled):
            ok = 0
            if item is not None:
                try:
                    exec(item[0], test_ns)
                    trust_test_classes(item[1])
                    ok = 1
                except _exc:
                    ok = 0
            _write(result_fd, f"{nonce} {i} {ok}\n".encode())
    _write(result_fd, f"{nonce} done\n".encode())
    _exit(0)  # skip atexit handlers and non-daemon threads the candidate may have left


def _run_stdio(payload_fd, result_fd):
    code = _read_blob(payload_fd)
    os.close(payload_fd)
    os.close(result_fd)
    ns = {"__name__": "__main__", "__builtins__": builtins}
    status = 0
    try:
        exec(compile(code, "<solution>", "exec", optimize=0, dont_inherit=True), ns)
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
        status = 1
    try:
        sys.stdout.flush()
    except BaseException:
        status = status or 1
    os._exit(status & 0xFF)


def main():
    cfg = json.loads(sys.argv[1])
    payload_fd, result_fd = cfg["payload_fd"], cfg["result_fd"]
    if cfg["isolate"]:
        _isolate(cfg)
        os.chdir(WORKDIR)
    else:
        os.chdir(cfg["workdir"])
    os.environ["HOME"] = os.getcwd()
    os.environ["TMPDIR"] = os.getcwd()
    _limit(cfg)
    if cfg["isolate"]:
        _drop_privileges(cfg["uid"])
    sys.setrecursionlimit(10_000)
    if cfg["mode"] == "assert":
        _run_assert(cfg, payload_fd, result_fd)
    else:
        _run_stdio(payload_fd, result_fd)


if __name__ == "__main__":
    main()
