"""The demos' warm-started models, shipped with the package so that the first command skips the warm start:
the default demo's (1,500 supervised steps: 3-10 CPU minutes on 2 cores, more when they are busy) in
``grpokit/demos/model``, the tool demo's (1,000 steps of whole tool episodes: about 4 CPU minutes) in
``grpokit/demos/model/tools``.

    python -m grpokit.demos.shipped              # rebuild grpokit/demos/model/ (about 3-10 CPU minutes)
    python -m grpokit.demos.shipped --demo tools # rebuild grpokit/demos/model/tools/ (about 4-10 CPU minutes)
    python -m grpokit.demos.shipped --check      # rebuild in a temporary folder, compare with the shipped one

The build is the demo's own warm start (`grpokit.demos.default.warm_start` on `DemoSpec()`,
`grpokit.demos.tools.warm_start` on `ToolDemoSpec()`), as the demo ran it before the model was shipped
(float32 training, one torch thread), then the weights are stored in float16 (about 660 KB instead of
1.3 MB; the run loads them back as float32). ``warm_start.json`` beside the weights records the spec it
was built from, its key (`shipped_key`) and the weights' sha256: the demo uses the shipped folder only
when the key matches the spec asked for, so a change of the spec or `DEMO_VERSION` without a rebuild
falls back to building the model (and tests/unit/demos/test_shipped_model.py and test_tool_demo.py fail).
The same build on another CPU may differ in the last bits (float summation order); ``--check`` compares
within float16 rounding.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import torch

from grpokit.demos import tools as tool_demo
from grpokit.demos.default import (
    SHIPPED_DIR,
    SHIPPED_MANIFEST,
    DemoSpec,
    WarmStartSpec,
    build_model,
    build_tokenizer,
    make_problems,
    shipped_key,
    warm_start,
)

WEIGHTS = "model.safetensors"
FOLDERS = {"addition": SHIPPED_DIR, "tools": tool_demo.SHIPPED_DIR}
"""Where each demo's shipped model lives."""


def file_sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _warm_start_addition(spec: DemoSpec, log):
    train_rows, _ = make_problems(spec)
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, spec)
    start = time.perf_counter()

    def progress(step: int, total: int, loss: float) -> None:
        log(f"  warm start {step}/{total}  loss {loss:.3f}  ({time.perf_counter() - start:.0f}s)")

    warm_start(model, tokenizer, train_rows, spec, progress)
    return model, tokenizer


def _warm_start_tools(spec: tool_demo.ToolDemoSpec, log):
    train_rows, _ = tool_demo.make_problems(spec)
    tokenizer = tool_demo.build_tokenizer()
    model = tool_demo.build_model(tokenizer, spec)
    tool_demo.warm_start(model, tokenizer, train_rows, spec, log)
    return model, tokenizer


def build(out: Path, spec: WarmStartSpec | None = None, log=print, demo: str = "addition") -> dict:
    """Warm-start ``demo``'s model from scratch (``spec``, default its demo's default spec) and write it to
    ``out`` (float16 weights, tokenizer, warm_start.json); returns the manifest. One torch thread: the
    result does not depend on the machine's thread count."""
    from grpokit.model.loading import save_local_tokenizer

    if demo == "tools":
        spec, run = spec or tool_demo.ToolDemoSpec(), _warm_start_tools
    else:
        spec, run = spec or DemoSpec(), _warm_start_addition
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        start = time.perf_counter()
        model, tokenizer = run(spec, log)
        seconds = time.perf_counter() - start
    finally:
        torch.set_num_threads(threads)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model.half().save_pretrained(out)
    save_local_tokenizer(tokenizer, out)
    manifest = {
        "key": shipped_key(spec),
        "spec": asdict(spec),
        "weights_sha256": file_sha256(out / WEIGHTS),
        "built_with": {"torch": torch.__version__, "machine": platform.machine(), "seconds": round(seconds)},
        "command": "python -m grpokit.demos.shipped" + (" --demo tools" if demo == "tools" else ""),
    }
    (out / SHIPPED_MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def weight_differences(a: Path, b: Path) -> float:
    """The largest absolute difference between two folders' weights (inf when the names differ)."""
    from safetensors.torch import load_file

    left, right = load_file(str(Path(a) / WEIGHTS)), load_file(str(Path(b) / WEIGHTS))
    if left.keys() != right.keys():
        return float("inf")
    return max(float((left[k].float() - right[k].float()).abs().max()) for k in left)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m grpokit.demos.shipped", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--demo", choices=sorted(FOLDERS), default="addition", help="which demo's model (default: addition)"
    )
    p.add_argument("--out", type=Path, default=None, help="where to write the model (default: the package's)")
    p.add_argument(
        "--check",
        action="store_true",
        help="build in a temporary folder and compare with the shipped model (exit 1 when they differ)",
    )
    args = p.parse_args(argv)
    folder = FOLDERS[args.demo]
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    if not args.check:
        out = args.out or folder
        manifest = build(out, log=log, demo=args.demo)
        print(f"wrote {out} ({manifest['weights_sha256'][:12]}, {manifest['built_with']['seconds']}s)")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        manifest = build(Path(tmp), log=log, demo=args.demo)
        same = (
            manifest["weights_sha256"]
            == json.loads((folder / SHIPPED_MANIFEST).read_text())["weights_sha256"]
        )
        gap = 0.0 if same else weight_differences(Path(tmp), folder)
    # float16 keeps 11 bits: weights of magnitude < 4 round to steps of at most 2e-3
    ok = gap <= 4e-3
    print(
        f"rebuilt: {'identical' if same else f'largest weight difference {gap:.2g}'}: {'ok' if ok else 'DIFFERS'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
