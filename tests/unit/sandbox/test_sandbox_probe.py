"""The sandbox probe must not fail for a reason of grpokit's own: where the kernel gives unprivileged
user namespaces, `isolation_report()` finds them, whatever the interpreter's location. (The code tests
skip where the probe fails, so a probe bug would otherwise hide as skips.)"""

import json
import os
import shutil
import subprocess
import sys

import pytest
from paths import REPO

from grpokit.sandbox import isolation_report


def kernel_allows_user_namespaces() -> bool:
    unshare = shutil.which("unshare")
    if not sys.platform.startswith("linux") or unshare is None:
        return False
    return subprocess.run([unshare, "-Urnp", "--fork", "true"], capture_output=True).returncode == 0


needs_userns = pytest.mark.skipif(
    not kernel_allows_user_namespaces(), reason="the kernel gives no unprivileged user namespaces here"
)


@needs_userns
def test_probe_finds_the_namespaces_the_kernel_gives():
    report = isolation_report()
    assert report["namespaces"], report["reason"]


@needs_userns
def test_probe_works_for_an_interpreter_in_a_venv_under_tmp(tmp_path):
    """A venv under /tmp (CI clones, notebooks): /tmp is covered by the sandbox's own tmpfs, so the
    venv's python symlink must be resolved before that, not after (it raised KeyError once)."""
    assert str(tmp_path).startswith("/tmp/")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c",
         "import json; from grpokit.sandbox import isolation_report; print(json.dumps(isolation_report()))"],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["namespaces"], report["reason"]


def test_the_code_verifier_imports_without_torch():
    # The hostile-program suite runs as user nobody on a system interpreter that may have no torch, and
    # the sandbox's driver stays light: importing the code verifier (and grpokit.rewards with it) must
    # not pull in torch or transformers (a reward model's module imports them when it scores, not at import).
    root = str(REPO)
    code = "import sys; import grpokit.rewards.code; print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=root, env={**os.environ, "PYTHONPATH": root}
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
