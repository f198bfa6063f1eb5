"""Hostile programs for `code_tests`: each tries to be rewarded without solving its problem, or to
harm the host. Plain Python (no pytest) so that `tests/unit/rewards/test_sandbox_hostile.py` can run the suite
in its own process as root and, as a script, as an unprivileged user:

    python tests/hostile_programs.py TOKEN     # prints one JSON line: scores and host checks
    python tests/hostile_programs.py TOKEN tool   # the same programs through the multi-turn python tool

Every program must score 0; afterwards no file it tried to write may exist, no process it started
may run (each one that could outlive the call names itself TOKEN via prctl(PR_SET_NAME)), the
local listener must have had no connection, and the caller must still be alive.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from grpokit.rewards.code import make_code_tests  # noqa: E402

SECRET = "e2b1c9d07f4a4c3b9a5d1e6f7a8b9c0d"  # expected value of the secret tests, only in the tests
SECRET_TESTS = f"assert solve() == {SECRET!r}\n"
ADD_TESTS = "assert add(2, 3) == 5\nassert add(-1, 1) == 0\nassert abs(add(0.5, 0.25) - 0.75) < 1e-9\n"
CHECK_TESTS = "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(10, -4) == 6\n\ncheck(add)\n"
MBPP_TESTS = ["assert add(2, 3) == 5", "assert add(10, -4) == 6", "assert add(1, 1) == 2"]
FUNC_TESTS = "def test_a():\n    assert add(1, 1) == 2\n\ndef test_b():\n    assert add(2, 2) == 4\n"
CATCH_TESTS = "try:\n    assert add(2, 3) == 5\nexcept Exception:\n    raise\n"
STDIO_TESTS = [{"input": "2 3\n", "output": "5\n"}, {"input": "10 -4", "output": "6"}]
MAP_TESTS = "assert all(map(lambda x: add(x, 1) == x + 1, [1, 2, 3]))\nfor a, b in zip([2, 3], map(add, [1, 2], [1, 1])):\n    assert a == b\n"
TOL_TESTS = "for got, want in [(add(1, 2), 3), (add(0.5, 0.25), 0.75)]:\n    if abs(got - want) > 1e-9:\n        raise AssertionError\n"
SORT_TESTS = "data = [3, 1, 2]\nassert sort_list(data) == sorted(data)\n"
POLY_PROMPT = (  # HumanEval/32: the tests call the prompt's poly
    "import math\n\n\ndef poly(xs: list, x: float):\n    return sum([coeff * math.pow(x, i) for i, coeff in enumerate(xs)])\n\n\n"
    'def find_zero(xs: list):\n    """ xs are coefficients of a polynomial; find x such that poly(x) = 0."""\n'
)
POLY_TESTS = (
    "def check(candidate):\n    import math, random\n    rng = random.Random(42)\n    for _ in range(20):\n"
    "        coeffs = [rng.randint(1, 10) * rng.choice([-1, 1]) for _ in range(2 * rng.randint(1, 3))]\n"
    "        solution = candidate(list(coeffs))\n        assert math.fabs(poly(coeffs, solution)) < 1e-4\n\ncheck(find_zero)\n"
)
POLY_SOLUTION = (
    "import math\ndef find_zero(xs):\n    f = lambda x: sum(c * math.pow(x, i) for i, c in enumerate(xs))\n    lo, hi = -1.0, 1.0\n"
    "    while f(lo) * f(hi) > 0:\n        lo, hi = lo * 2, hi * 2\n    while hi - lo > 1e-10:\n        mid = (lo + hi) / 2\n"
    "        if f(mid) * f(lo) > 0: lo = mid\n        else: hi = mid\n    return lo\n"
)
CYCLIC_PROMPT = (  # HumanEval/38: the tests call the prompt's encode_cyclic
    "```python\ndef encode_cyclic(s: str):\n    groups = [s[(3 * i):min((3 * i + 3), len(s))] for i in range((len(s) + 2) // 3)]\n"
    '    groups = [(group[1:] + group[0]) if len(group) == 3 else group for group in groups]\n    return "".join(groups)\n\n\n'
    'def decode_cyclic(s: str):\n    """ takes as input string encoded with encode_cyclic function. Returns decoded string."""\n```\n'
)
CYCLIC_TESTS = (
    "def check(candidate):\n    import random, string\n    rng = random.Random(7)\n    for _ in range(30):\n"
    "        s = ''.join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(5, 20)))\n"
    "        assert candidate(encode_cyclic(s)) == s\n\ncheck(decode_cyclic)\n"
)
CYCLIC_SOLUTION = (
    "def decode_cyclic(s):\n    groups = [s[3 * i:min(3 * i + 3, len(s))] for i in range((len(s) + 2) // 3)]\n"
    "    return ''.join(g[-1] + g[:-1] if len(g) == 3 else g for g in groups)\n"
)
NAME = "import ctypes\nctypes.CDLL(None).prctl(15, {token!r}.encode(), 0, 0, 0)\n"  # PR_SET_NAME


def programs(token: str, port: int, caller_pid: int) -> list[tuple]:
    """(name, code, tests[, prompt]). `token` names leftover processes and marker files."""
    name = NAME.format(token=token)
    marks = [
        f"/tmp/{token}",
        f"/var/tmp/{token}",
        f"/dev/shm/{token}",
        os.path.join(HERE, token),
        f"/{token}",
    ]
    return [
        # --- exit tricks
        ("sys.exit(0) at top level", "import sys\nsys.exit(0)\n", ADD_TESTS),
        ("os._exit(0) at top level", "import os\nos._exit(0)\n", ADD_TESTS),
        ("os._exit(0) in the function", "import os\ndef add(a, b):\n    os._exit(0)\n", FUNC_TESTS),
        ("SystemExit from the function", "def add(a, b):\n    raise SystemExit(0)\n", CATCH_TESTS),
        ("KeyboardInterrupt from the function", "def add(a, b):\n    raise KeyboardInterrupt\n", MBPP_TESTS),
        ("abort", "import os\ndef add(a, b):\n    os.abort()\n", CHECK_TESTS),
        (
            "kills itself",
            "import os, signal\ndef add(a, b):\n    os.kill(os.getpid(), signal.SIGKILL)\n",
            ADD_TESTS,
        ),
        (
            "atexit writes",
            "import atexit, os\natexit.register(lambda: os.write(1, b'ok 0 1'))\nraise SystemExit(0)\n",
            ADD_TESTS,
        ),
        ("returns None", "def add(a, b):\n    pass\n", ADD_TESTS),
        ("raises AssertionError-free", "def add(a, b):\n    raise AssertionError('nope')\n", CATCH_TESTS),
        # --- fishing for the tests or a result channel
        (
            "reads every fd",
            "import os\nseen = b''\nfor fd in range(0, 64):\n    try:\n        os.set_blocking(fd, False)\n"
            "        seen += os.read(fd, 1 << 16)\n    except OSError: pass\n"
            "def solve():\n    i = seen.find(b\"solve() == '\")\n    return seen[i + 12:i + 44].decode() if i >= 0 else ''\n",
            SECRET_TESTS,
        ),
        (
            "writes fake results to every fd",
            "import os, json\nfor fd in range(0, 64):\n    try: os.write(fd, b'x 0 1\\nx 1 1\\n{\"passed\": [true]}\\n')\n"
            "    except OSError: pass\ndef add(a, b): return 0\n",
            ADD_TESTS,
        ),
        (
            "forges a framed answer on its output pipe",
            "import os, json\nmsg = json.dumps({'ok': 5, 'args': [2, 3], 'kwargs': {'d': []}}).encode()\n"
            "def add(a, b):\n    for fd in range(3, 64):\n        try: os.write(fd, len(msg).to_bytes(8, 'little') + msg)\n"
            "        except OSError: pass\n    return 0\n",
            ADD_TESTS,
        ),
        (
            "greps argv, environ, /proc, /tmp and the disk",
            "import os, glob, sys\nhay = repr(sys.argv) + repr(dict(os.environ))\n"
            "for pattern in ('/proc/*/cmdline', '/proc/*/environ', '/proc/self/fd/*', '/tmp/*', '/*/*', '/root/*', '/home/*/*', '/work/*/*', '/work/*/tests/*'):\n"
            "    for p in glob.glob(pattern):\n        try: hay += open(p, errors='ignore').read(100000)\n"
            "        except Exception: pass\n"
            "def solve():\n    i = hay.find(\"solve() == '\")\n    return hay[i + 12:i + 44] if i >= 0 else ''\n",
            SECRET_TESTS,
        ),
        (
            "reads /proc/<pid>/mem of every process",
            "import os, re\ndef solve():\n    for pid in os.listdir('/proc'):\n        if not pid.isdigit(): continue\n"
            "        try:\n            maps = open(f'/proc/{pid}/maps').read().splitlines()\n            mem = open(f'/proc/{pid}/mem', 'rb')\n"
            "        except OSError: continue\n        for line in maps:\n            a, b = (int(x, 16) for x in line.split()[0].split('-'))\n"
            "            try:\n                mem.seek(a); chunk = mem.read(min(b - a, 1 << 22))\n            except (OSError, ValueError, OverflowError): continue\n"
            "            m = re.search(rb\"solve\\(\\) == '([0-9a-f]{32})'\", chunk)\n            if m: return m.group(1).decode()\n    return ''\n",
            SECRET_TESTS,
        ),
        # --- walking the interpreter
        (
            "frame walking",
            "import sys\ndef solve():\n    f = sys._getframe()\n    while f:\n        for v in list(f.f_locals.values()) + list(f.f_globals.values()):\n"
            '            if isinstance(v, str) and "solve() ==" in v: return v.split("\'")[1]\n        f = f.f_back\n    return \'\'\n',
            SECRET_TESTS,
        ),
        (
            "gc walking",
            "import gc\ndef solve():\n    for o in gc.get_objects():\n        if isinstance(o, dict):\n"
            '            for v in list(o.values()):\n                if isinstance(v, str) and "solve() ==" in v: return v.split("\'")[1]\n    return \'\'\n',
            SECRET_TESTS,
        ),
        (
            "gc-polling thread",
            "import gc, threading, time\nfound = []\ndef poll():\n    for _ in range(200):\n        for o in gc.get_objects():\n"
            '            if isinstance(o, str) and "solve() ==" in o: found.append(o.split("\'")[1])\n        time.sleep(0.005)\n'
            "threading.Thread(target=poll, daemon=True).start()\ndef solve():\n    time.sleep(0.5)\n    return found[0] if found else ''\n",
            SECRET_TESTS,
        ),
        (
            "inspect.stack",
            "import inspect\ndef solve():\n    return str(inspect.stack())[:32]\n",
            SECRET_TESTS,
        ),
        # --- shadowing what the tests use
        ("shadows abs", "abs = lambda x: 0\ndef add(a, b):\n    return a * 100\n", ADD_TESTS),
        (
            "patches builtins and AssertionError",
            "import builtins\nbuiltins.abs = lambda x: 0\nbuiltins.AssertionError = type('E', (Exception,), {})\n"
            "builtins.isinstance = lambda *a: True\ndef add(a, b): return 0\n",
            ADD_TESTS,
        ),
        ("replaces __builtins__", "__builtins__ = {}\ndef add(a, b): return 0\n", CHECK_TESTS),
        ("defines check", "def check(candidate): pass\ndef add(a, b): return 0\n", CHECK_TESTS),
        (
            "patches json and ast",
            "import json, ast\njson.loads = lambda *a, **k: {'passed': [True]}\nast.parse = lambda *a, **k: ast.Module([], [])\ndef add(a, b): return 0\n",
            ADD_TESTS,
        ),
        # --- lying objects
        (
            "always-equal __eq__",
            "class A:\n    def __eq__(self, o): return True\n    def __ne__(self, o): return False\ndef add(a, b): return A()\n",
            ADD_TESTS,
        ),
        (
            "int subclass that lies",
            "class I(int):\n    __eq__ = lambda s, o: True\n    __hash__ = int.__hash__\ndef add(a, b): return I(0)\n",
            MBPP_TESTS,
        ),
        (
            "str subclass that lies",
            "class S(str):\n    __eq__ = lambda s, o: True\ndef solve(): return S('x')\n",
            SECRET_TESTS,
        ),
        (
            "list subclass that lies",
            "class L(list):\n    __eq__ = lambda s, o: True\ndef add(a, b): return L()\n",
            ["assert add(1, 2) == [3]"],
        ),
        (
            "lying __sub__ and __abs__",
            "class N:\n    __sub__ = __rsub__ = lambda s, o: s\n    __abs__ = lambda s: 0\n    __lt__ = __eq__ = lambda s, o: True\ndef add(a, b): return N()\n",
            ADD_TESTS,
        ),
        (
            "truthy __bool__",
            "class T:\n    __bool__ = lambda s: True\ndef is_ok(): return T()\n",
            "assert is_ok()\n",
        ),
        ("unittest.mock.ANY", "from unittest import mock\ndef add(a, b): return mock.ANY\n", ADD_TESTS),
        (
            "mock.ANY in a list",
            "from unittest import mock\ndef add(a, b): return [mock.ANY]\n",
            ["assert add(1, 2) == [3]"],
        ),
        (
            "MagicMock",
            "from unittest.mock import MagicMock\ndef add(a, b): return MagicMock()\n",
            CHECK_TESTS,
        ),
        ("float nan", "def add(a, b): return float('nan')\n", "assert not (add(1, 2) != 3)\n"),
        ("generator", "def add(a, b):\n    yield a + b\n", ADD_TESTS),
        # --- what crosses from the candidate to the driver
        ("raises StopIteration inside map", "def add(a, b):\n    raise StopIteration\n", MAP_TESTS),
        (
            "its own class named StopIteration",
            "class StopIteration(Exception): pass\ndef add(a, b):\n    raise StopIteration('x')\n",
            MAP_TESTS,
        ),
        (
            "raises GeneratorExit and StopAsyncIteration",
            "n = [0]\ndef add(a, b):\n    n[0] += 1\n    raise (GeneratorExit if n[0] % 2 else StopAsyncIteration)\n",
            MAP_TESTS,
        ),
        (
            "redefines the prompt's poly",
            "def poly(xs, x):\n    return 0.0\ndef find_zero(xs):\n    return 0.0\n",
            POLY_TESTS,
            POLY_PROMPT,
        ),
        (
            "redefines the prompt's encode_cyclic",
            "def encode_cyclic(s):\n    return s\ndef decode_cyclic(s):\n    return s\n",
            CYCLIC_TESTS,
            CYCLIC_PROMPT,
        ),
        ("empties its argument", "def sort_list(xs):\n    xs.clear()\n    return []\n", SORT_TESTS),
        ("returns NaN to a tolerance test", "def add(a, b):\n    return float('nan')\n", TOL_TESTS),
        (
            "NaN inside a structure",
            "def add(a, b):\n    return [float('nan'), complex(float('nan'), 0)]\n",
            "for g in add(1, 2):\n    if abs(g - 3) > 1e-9:\n        raise AssertionError\n",
        ),
        (
            "Decimal NaN",
            "from decimal import Decimal\ndef add(a, b):\n    return Decimal('NaN')\n",
            "try:\n    assert not (add(1, 2) != 3)\nexcept Exception:\n    pass\n",
        ),
        (
            "set built to collide in hash",
            "def add(a, b):\n    return {k * (2 ** 61 - 1) for k in range(1, 30000)}\n",
            "assert 5 not in add(2, 3)\n",
        ),
        (
            "huge Decimal for int()",
            "from decimal import Decimal\ndef add(a, b):\n    return Decimal('1e999999999')\n",
            "assert int(add(2, 3)) != 5 or True\nassert int(add(2, 3)) == 5\n",
        ),
        # --- signals and processes
        (
            "kills its parent",
            "import os\ndef add(a, b):\n    os.kill(os.getppid(), 9)\n    return 0\n",
            ADD_TESTS,
        ),
        (
            "kills everything it can",
            "import os\ndef add(a, b):\n    os.kill(-1, 9)\n    return 0\n",
            ADD_TESTS,
        ),
        (
            "kills the caller by pid",
            f"import os\ndef add(a, b):\n    for sig in (15, 9):\n        try: os.kill({caller_pid}, sig)\n        except OSError: pass\n    return 0\n",
            ADD_TESTS,
        ),
        (
            "kills every pid in /proc",
            "import os\nfor p in os.listdir('/proc'):\n    if p.isdigit() and int(p) != os.getpid():\n        try: os.kill(int(p), 9)\n        except OSError: pass\ndef add(a, b): return 0\n",
            ADD_TESTS,
        ),
        (
            "daemon outlives the call",
            "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
            + "        "
            + name.replace("\n", "\n        ")
            + "while True: time.sleep(0.2)\n    os._exit(0)\ndef add(a, b): return 0\n",
            ADD_TESTS,
        ),
        (
            "forked sleeper and a stdin program",
            "import os, time\nif os.fork() == 0:\n    "
            + name.replace("\n", "\n    ")
            + "time.sleep(60)\nprint(0)\n",
            STDIO_TESTS,
        ),
        ("fork bomb", "import os\nwhile True:\n    try: os.fork()\n    except OSError: pass\n", ADD_TESTS),
        (
            "thread bomb",
            "import threading, time\nfor _ in range(10000):\n    try: threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
            "    except RuntimeError: break\ndef add(a, b): return 0\n",
            ADD_TESTS,
        ),
        ("infinite loop", "def add(a, b):\n    while True: pass\n", ADD_TESTS),
        ("sleeps past the deadline", "import time\ntime.sleep(30)\n", STDIO_TESTS),
        # --- resources
        ("memory bomb", "x = bytearray(10 ** 11)\ndef add(a, b): return 0\n", ADD_TESTS),
        ("growing memory", "x = []\nwhile True: x.append(' ' * 10 ** 7)\n", ADD_TESTS),
        (
            "fills the disk",
            "import os\nfor d in ('.', '/tmp', '/var/tmp', '/dev/shm', os.path.expanduser('~')):\n    try:\n"
            "        with open(os.path.join(d, 'fill'), 'wb') as f:\n            for _ in range(4096): f.write(b'x' * (1 << 20))\n"
            "    except OSError: pass\ndef add(a, b): return 0\n",
            ADD_TESTS,
        ),
        ("output flood", "while True: print('x' * 10000)\n", STDIO_TESTS),
        ("huge answer", "def add(a, b): return 'x' * (1 << 24)\n", ADD_TESTS),
        (
            "deeply nested answer",
            "def add(a, b):\n    x = []\n    for _ in range(100000): x = [x]\n    return x\n",
            ADD_TESTS,
        ),
        # --- the host
        (
            "network to a local port",
            f"import socket\ndef add(a, b):\n    s = socket.create_connection(('127.0.0.1', {port}), timeout=1)\n    s.sendall(b'leak')\n    return 0\n",
            ADD_TESTS,
        ),
        (
            "writes outside its scratch space",
            f"import os\nfor p in {marks!r}:\n    try: open(p, 'w').write('x')\n    except OSError: pass\ndef add(a, b): return 0\n",
            ADD_TESTS,
        ),
        (
            "vsock to the host",
            "import socket\ndef add(a, b):\n    s = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)\n    return a + b\n",
            ADD_TESTS,
        ),
        (
            "reads the session keyring",
            "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "def add(a, b):\n    assert libc.syscall(250, 0, -3, 0) > 0  # KEYCTL_GET_KEYRING_ID\n    return a + b\n",
            ADD_TESTS,
        ),
        (
            "leaves a key for the next run",
            f"import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\ndef add(a, b):\n"
            f"    assert libc.syscall(248, b'user', b'{token}', b'x', 1, -3) > 0  # add_key to the session keyring\n"
            "    return a + b\n",
            ADD_TESTS,
        ),
        (
            "locks a file shared with the host",
            "import fcntl, sys\ndef add(a, b):\n    ok = 0\n    for f in (sys.executable, '/etc/ld.so.cache', '/dev/null'):\n"
            "        for lock in (lambda fd: fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB), lambda fd: fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)):\n"
            "            try:\n                lock(open(f, 'rb'))\n                ok += 1\n            except OSError: pass\n"
            "    return a + b if ok else 0\n",
            ADD_TESTS,
        ),
        (
            "uses up inotify instances",
            "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nfds = [libc.inotify_init1(0) for _ in range(60)]\n"
            "def add(a, b):\n    return a + b if max(fds) >= 0 else 0\n",
            ADD_TESTS,
        ),
        (
            "memory spread over processes",
            "import os, time\nr, w = os.pipe()\nfor _ in range(4):\n    if os.fork() == 0:\n        x = bytearray(120 << 20)\n"
            "        os.write(w, b'x')\n        time.sleep(3)\n        os._exit(0)\n"
            "for _ in range(4):\n    os.read(r, 1)  # every child holds its 120 MiB (a busy machine is slow to fill them)\n"
            "time.sleep(0.2)\ndef add(a, b): return a + b\n",
            ADD_TESTS,
        ),
        # --- memory no process maps (memory_mb=256): all counted with the processes' own, or refused
        (
            "SysV shared memory, detached",
            "import ctypes, time\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.shmat.restype = ctypes.c_void_p\nheld = 0\n"
            "for _ in range(5):\n    sid = libc.shmget(0, 64 << 20, 0o1600)\n    addr = libc.shmat(sid, None, 0)\n"
            "    if sid < 0 or addr in (None, 2 ** 64 - 1): break\n    ctypes.memset(addr, 1, 64 << 20)\n"
            "    libc.shmdt(ctypes.c_void_p(addr))\n    held += 64\ntime.sleep(0.2)\n"
            "def add(a, b): return a + b if held >= 320 else 0\n",
            ADD_TESTS,
        ),
        (
            "SysV message queues",
            "import ctypes, time\nlibc = ctypes.CDLL(None, use_errno=True)\nbuf = ctypes.create_string_buffer(8 + 8000)\n"
            "buf[0] = 1\nheld = 0\nfor _ in range(32000):\n    q = libc.msgget(0, 0o1600)\n    if q < 0: break\n"
            "    while held < (300 << 20) and libc.msgsnd(q, buf, 8000, 0o4000) == 0: held += 8000\n"
            "    if held >= (300 << 20): break\ntime.sleep(0.2)\ndef add(a, b): return a + b if held >= (300 << 20) else 0\n",
            ADD_TESTS,
        ),
        (
            "queued socket data on top of its memory",
            "import os, socket, time\ndef fill():\n    keep, held = [], 0\n    for _ in range(28):\n        a, b = socket.socketpair()\n"
            "        for s in (a, b):\n            s.setblocking(False)\n            try:\n                while True: held += s.send(b'x' * 65536)\n"
            "            except OSError: pass\n        keep.append((a, b))\n    return keep, held\n"
            "for _ in range(3):\n    if os.fork() == 0:\n        kept = fill()\n        time.sleep(2)\n        os._exit(0)\n"
            "kept = fill()\nx = b'x' * (160 << 20)\ntime.sleep(0.3)\ndef add(a, b): return a + b if kept[1] > (8 << 20) else 0\n",
            ADD_TESTS,
        ),
        (
            "memfds no process maps",
            "import os, time\nheld, keep = 0, []\ntry:\n    for _ in range(40):\n        fd = os.memfd_create('x')\n"
            "        os.write(fd, b'x' * (12 << 20))\n        keep.append(fd)\n        held += 12\nexcept OSError: pass\ntime.sleep(0.2)\n"
            "def add(a, b): return a + b if held >= 400 else 0\n",
            ADD_TESTS,
        ),
        (
            "POSIX message queue",
            "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nq = libc.syscall(240, b'q', 0o102, 0o600, None)  # mq_open\n"
            "def add(a, b): return a + b if q >= 0 else 0\n",
            ADD_TESTS,
        ),
        (
            "pipes beyond the quota",
            "import os, time\nkeep = []\nfor _ in range(5):\n    if os.fork() == 0:\n        try:\n"
            "            while True:\n                r, w = os.pipe()\n                os.close(r)\n                keep.append(w)\n"
            "        except OSError: pass\n        time.sleep(2)\n        os._exit(0)\n"
            "try:\n    while True:\n        r, w = os.pipe()\n        os.close(r)\n        keep.append(w)\nexcept OSError: pass\n"
            "time.sleep(0.3)\ndef add(a, b): return a + b\n",
            ADD_TESTS,
        ),
        (
            "makes itself undumpable to hide what it holds",
            "import ctypes, time\nctypes.CDLL(None).prctl(4, 0, 0, 0, 0)\ntime.sleep(0.3)\ndef add(a, b): return a + b\n",
            ADD_TESTS,
        ),
        # --- channels between completions and to the trainer
        (
            "watches a stdlib folder (F_NOTIFY)",
            "import fcntl, os, sys\ndef add(a, b):\n    fd = os.open(os.path.dirname(os.__file__), os.O_RDONLY)\n"
            "    fcntl.fcntl(fd, fcntl.F_NOTIFY, fcntl.DN_ACCESS | fcntl.DN_MULTISHOT)\n    return a + b\n",
            ADD_TESTS,
        ),
        (
            "evicts a page from the page cache",
            "import os\ndef add(a, b):\n    fd = os.open(os.__file__, os.O_RDONLY)\n    os.read(fd, 4096)\n"
            "    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)\n"
            "    try:\n        os.preadv(fd, [bytearray(4096)], 0, os.RWF_NOWAIT)\n        return 0  # still cached: not evicted\n"
            "    except BlockingIOError:\n        return a + b\n",
            ADD_TESTS,
        ),
        (
            "probes the page cache without reading (RWF_NOWAIT)",
            "import os\ndef add(a, b):\n    fd = os.open(os.__file__, os.O_RDONLY)\n"
            "    try:\n        os.preadv(fd, [bytearray(4096)], 0, os.RWF_NOWAIT)\n    except BlockingIOError:\n        pass\n    return a + b\n",
            ADD_TESTS,
        ),
        (
            "probes the page cache (mincore)",
            "import ctypes, mmap, os\nlibc = ctypes.CDLL(None, use_errno=True)\ndef add(a, b):\n"
            "    m = mmap.mmap(os.open(os.__file__, os.O_RDONLY), 4096, access=mmap.ACCESS_COPY)\n"
            "    addr = ctypes.addressof(ctypes.c_char.from_buffer(m))\n    vec = ctypes.create_string_buffer(1)\n"
            "    return a + b if libc.mincore(ctypes.c_void_p(addr), 4096, vec) == 0 else 0\n",
            ADD_TESTS,
        ),
        (
            "reads the kernel keys of its uid (/proc/keys)",
            "import os\ndef add(a, b):\n    st = os.stat('/proc/keys')\n    open('/proc/keys').read()\n"
            "    return 0 if st.st_rdev == os.makedev(1, 3) else a + b  # /dev/null bound over it\n",
            ADD_TESTS,
        ),
        # --- kernel memory outside any process (issue 51): bounded by /tmp's inode limit, or refused
        (
            "many empty files in /tmp",
            "n = 0\ntry:\n    while n < 6000:\n        open(f'f{n}', 'w').close()\n        n += 1\nexcept OSError: pass\n"
            "def add(a, b): return a + b if n >= 6000 else 0\n",
            ADD_TESTS,
        ),
        (
            "hard links with long names",
            "import os\nopen('a', 'w').close()\nn = 0\ntry:\n    while n < 6000:\n        os.link('a', f'{n:0250d}')\n        n += 1\n"
            "except OSError: pass\ndef add(a, b): return a + b if n >= 6000 else 0\n",
            ADD_TESTS,
        ),
        (
            "extended attributes",
            "import os\nopen('a', 'w').close()\nn = 0\ntry:\n    while n < 1000:\n        os.setxattr('a', f'user.k{n}', b'v' * 60000)\n        n += 1\n"
            "except OSError: pass\ndef add(a, b): return a + b if n >= 1 else 0\n",
            ADD_TESTS,
        ),
        # --- counters of the whole machine, which another completion moves (issue 51)
        (
            "reads counters of the whole machine",
            "import ctypes, os\nseen = []\nfor p in ('/proc/meminfo', '/proc/loadavg', '/proc/stat', '/proc/sys/fs/inode-nr',"
            " '/proc/sys/fs/dentry-state', '/proc/self/net/sockstat', '/proc/1/status', '/sys/kernel/mm'):\n"
            "    try:\n        os.stat(p)\n        seen.append(p)\n    except OSError: pass\n"
            "buf = ctypes.create_string_buffer(256)\nif ctypes.CDLL(None, use_errno=True).sysinfo(buf) == 0: seen.append('sysinfo')\n"
            "def add(a, b): return a + b if seen else 0\n",
            ADD_TESTS,
        ),
        (
            "opens an internet socket (counted kernel-wide)",
            "import socket\ndef add(a, b):\n    socket.socket(socket.AF_INET, socket.SOCK_STREAM)\n    return a + b\n",
            ADD_TESTS,
        ),
        (
            "nested namespaces and mounts",
            "import os, ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nr1 = libc.unshare(0x10000000 | 0x00020000)\n"
            "r2 = libc.mount(b'tmpfs', b'/tmp', b'tmpfs', 0, b'size=4g')\nr3 = libc.umount2(b'/tmp', 2)\n"
            "def add(a, b): return 0 if -1 in (r1, r2, r3) else 'escaped'\n",
            ADD_TESTS,
        ),
    ]


CONTROLS = [  # honest programs in the same batch: the suite's zeros are not a broken sandbox
    ("add", "def add(a, b):\n    return a + b\n", ADD_TESTS),
    ("check", "def add(a, b):\n    return a + b\n", CHECK_TESTS),
    ("mbpp", "def add(a, b):\n    return a + b\n", MBPP_TESTS),
    ("secret", f"def solve():\n    return {SECRET!r}\n", SECRET_TESTS),
    ("stdio", "a, b = map(int, input().split())\nprint(a + b)\n", STDIO_TESTS),
    ("map", "def add(a, b):\n    return a + b\n", MAP_TESTS),
    ("tolerance", "def add(a, b):\n    return a + b\n", TOL_TESTS),
    ("sort", "def sort_list(xs):\n    return sorted(xs)\n", SORT_TESTS),
    ("poly", POLY_SOLUTION, POLY_TESTS, POLY_PROMPT),
    (
        "poly, with the prompt's helper copied",
        POLY_PROMPT + "    return 0.0\n" + POLY_SOLUTION,
        POLY_TESTS,
        POLY_PROMPT,
    ),
    ("cyclic", CYCLIC_SOLUTION, CYCLIC_TESTS, CYCLIC_PROMPT),
    (
        "raises, caught by except Exception",
        "def div(a, b):\n    return a / b\n",
        "try:\n    div(1, 0)\nexcept Exception:\n    pass\nelse:\n    raise AssertionError\nassert div(1, 4) == 0.25\n",
    ),
    ("returns inf", "def add(a, b):\n    return float('inf')\n", "assert add(1, 2) == float('inf')\n"),
    (  # the function the prompt asks to fix is the candidate's, not the prompt's
        "fixes the prompt's function",
        "def add(a, b):\n    return a + b\n",
        ADD_TESTS,
        "Fix this function:\n```python\ndef add(a, b):\n    return a - b\n```\n",
    ),
]


def marks(token: str) -> list[str]:
    return [f"/tmp/{token}", f"/var/tmp/{token}", f"/dev/shm/{token}", os.path.join(HERE, token), f"/{token}"]


def leftover_processes(token: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() == token[:15]:
                    found.append(int(pid))
        except OSError:
            pass
    return found


def run_suite(token: str, timeout_s: float = 1.5, workers: int = 4) -> dict:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    rows = programs(token, listener.getsockname()[1], os.getpid()) + CONTROLS
    reward = make_code_tests(
        timeout_s=timeout_s, memory_mb=256, max_processes=8, max_output_bytes=64_000, workers=workers
    )
    start = time.monotonic()
    prompts = [row[3] if len(row) > 3 else None for row in rows]  # the prompt, where the tests use it
    scores = reward(prompts, [row[1] for row in rows], tests=[row[2] for row in rows])
    elapsed = time.monotonic() - start
    connections = connections_made(listener)
    return {
        "uid": os.geteuid(),
        "scores": {row[0]: score for row, score in zip(rows[: -len(CONTROLS)], scores)},
        "controls": dict(zip([row[0] for row in CONTROLS], scores[-len(CONTROLS) :])),
        "files_left": [p for p in marks(token) if os.path.exists(p)],
        "processes_left": leftover_processes(token),
        "connections": connections,
        "seconds": round(elapsed, 2),
    }


def connections_made(listener: socket.socket) -> int:
    """After a pause in which a leftover would have had time to act: how many connections programs made to
    the host's listener (each accepted and closed); the listener is closed."""
    time.sleep(0.3)
    connections = 0
    try:
        while True:
            listener.accept()[0].close()
            connections += 1
    except BlockingIOError:
        pass
    listener.close()
    return connections


RUN_DEFINED = (  # appended to each program run by the python tool: call the functions it defines
    "\nfor _name, _args in (('add', (2, 3)), ('solve', ()), ('is_ok', ())):\n"
    "    if callable(globals().get(_name)):\n"
    "        print(globals()[_name](*_args))\n"
)


def run_tool_suite(token: str, workers: int = 4) -> dict:
    """Every program, its functions called, through the python tool on a ToolRunner, then the honest
    controls on the same runner; the host checks as in `run_suite`."""
    from concurrent.futures import ThreadPoolExecutor

    from grpokit.rollout.tools import Tool, ToolCall, ToolRunner, load_tools
    from grpokit.rollout.tools.python import make_python_tool
    from grpokit.sandbox import SandboxLimits

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    rows = programs(token, listener.getsockname()[1], os.getpid())
    tool = make_python_tool(
        SandboxLimits(wall_s=1.5, cpu_s=2, memory_mb=256, max_processes=8, max_output_bytes=64_000)
    )
    try:
        tools = load_tools([tool])
    except ModuleNotFoundError:  # the schema is transformers' get_json_schema, absent on a torch-less
        # interpreter; the schema it would give (not what is under test here) is written out instead
        code = {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}
        tools = [
            Tool("python", tool, {"type": "function", "function": {"name": "python", "parameters": code}})
        ]
    runner = ToolRunner(tools, timeout_s=5.0, max_result_chars=500, workers=workers)
    start = time.monotonic()
    try:
        with ThreadPoolExecutor(workers) as pool:
            calls = [ToolCall("python", {"code": row[1] + RUN_DEFINED}) for row in rows]
            results = list(pool.map(runner.call, calls))
        controls = {  # honest programs after the hostile ones: the runner still answers correctly
            "print": runner.call(ToolCall("python", {"code": "print(6 * 7)"})).content,
            "add": runner.call(ToolCall("python", {"code": CONTROLS[0][1] + RUN_DEFINED})).content,
            "secret": runner.call(ToolCall("python", {"code": CONTROLS[3][1] + RUN_DEFINED})).content,
        }
    finally:
        runner.close()
    elapsed = time.monotonic() - start
    connections = connections_made(listener)
    return {
        "uid": os.geteuid(),
        "answers": {row[0]: r.content for row, r in zip(rows, results)},
        "controls": controls,
        "files_left": [p for p in marks(token) if os.path.exists(p)],
        "processes_left": leftover_processes(token),
        "connections": connections,
        "seconds": round(elapsed, 2),
    }


QUOTA_HOG = (  # takes every per-user quota it can (POSIX timers, message queues, pipe pages), then waits
    "import ctypes, fcntl, os, time\nlibc = ctypes.CDLL(None, use_errno=True)\ntaken = {'timers': 0, 'queues': 0, 'pipe_pages': 0}\n"
    "timer = ctypes.c_long()\nwhile taken['timers'] < 200000 and libc.timer_create(1, None, ctypes.byref(timer)) == 0:\n"
    "    taken['timers'] += 1\nwhile taken['queues'] < 5000 and libc.syscall(240, b'q%d' % taken['queues'], 0o102, 0o600, None) >= 0:\n"
    "    taken['queues'] += 1\nkeep = []\ntry:\n    while True:\n        r, w = os.pipe()\n        keep.append((r, w))\n"
    "        taken['pipe_pages'] += 16\n        taken['pipe_pages'] += fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 1 << 20) // 4096 - 16\n"
    "except OSError: pass\nprint(taken, flush=True)\ntime.sleep(4)\n"
)


def trainer_quotas(token: str) -> dict:
    """While a sandbox holds every per-user quota it can, what this process (the trainer) can still do:
    create a POSIX timer, open a message queue, grow a pipe to 1 MiB. As an unprivileged user the
    sandbox's uid is this process's, and these quotas are counted per uid."""
    import ctypes
    import fcntl
    import threading

    from grpokit.sandbox import SandboxLimits, run_program

    out = {}
    hog = threading.Thread(
        target=lambda: out.update(run=run_program(QUOTA_HOG, limits=SandboxLimits(wall_s=8, cpu_s=8)).stdout),
        daemon=True,
    )
    hog.start()
    time.sleep(3.0)
    libc = ctypes.CDLL(None, use_errno=True)
    timer = ctypes.c_long()
    out["timer_create"] = libc.timer_create(1, None, ctypes.byref(timer)) == 0
    name = f"{token}q".encode()
    q = libc.syscall(240, name, 0o102, 0o600, None)
    out["mq_open"] = q >= 0
    if q >= 0:
        os.close(q)
        libc.syscall(241, name)  # mq_unlink
    r, w = os.pipe()
    try:
        out["pipe_1mib"] = fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 1 << 20) >= 1 << 20
    except OSError:
        out["pipe_1mib"] = False
    os.close(r)
    os.close(w)
    hog.join()
    out["uid"] = os.geteuid()
    return out


if __name__ == "__main__":
    if sys.argv[2:] == ["quota"]:
        print(json.dumps(trainer_quotas(sys.argv[1])))
    else:
        suite = run_tool_suite if sys.argv[2:] == ["tool"] else run_suite
        print(json.dumps(suite(sys.argv[1])))
