"""The default demo's warm-started model, shipped with the package so that the first command skips the
warm start (1,500 supervised steps: 3-10 CPU minutes on 2 cores, more when they are busy).

    python -m grpokit.demos.shipped              # rebuild grpokit/demos/model/ (about 3-10 CPU minutes)
    python -m grpokit.demos.shipped --check      # rebuild in a temporary folder, compare with the shipped one

The build is `grpokit.demos.default.warm_start` on `DemoSpec()`, as the demo ran it before the model
was shipped (float32 training, one torch thread), then the weights are stored in float16 (about 660 KB
instead of 1.3 MB; the run loads them back as float32). ``warm_start.json`` beside the weights records
the spec it was built from, its key (`shipped_key`) and the weights' sha256: ``prepare_demo`` uses the
shipped folder only when the key matches the spec asked for, so a change of `DemoSpec` or `DEMO_VERSION`
without a rebuild falls back to building the model (and tests/unit/demos/test_shipped_model.py fails).
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

from grpokit.demos.default import (
    SHIPPED_DIR,
    SHIPPED_MANIFEST,
    DemoSpec,
    build_model,
    build_tokenizer,
    make_problems,
    shipped_key,
    warm_start,
)

WEIGHTS = "model.safetensors"


def file_sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def build(out: Path, spec: DemoSpec | None = None, log=print) -> dict:
    """Warm-start the demo model from scratch and write it to ``out`` (float16 weights, tokenizer,
    warm_start.json); returns the manifest. One torch thread: the result does not depend on the
    machine's thread count."""
    from grpokit.model.loading import save_local_tokenizer

    spec = spec or DemoSpec()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train_rows, _ = make_problems(spec)
        tokenizer = build_tokenizer()
        model = build_model(tokenizer, spec)
        start = time.perf_counter()

        def progress(step: int, total: int, loss: float) -> None:
            log(f"  warm start {step}/{total}  loss {loss:.3f}  ({time.perf_counter() - start:.0f}s)")

        warm_start(model, tokenizer, train_rows, spec, progress)
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
        "command": "python -m grpokit.demos.shipped",
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
    p.add_argument("--out", type=Path, default=SHIPPED_DIR, help="where to write the model (default: the package's)")
    p.add_argument(
        "--check",
        action="store_true",
        help="build in a temporary folder and compare with the shipped model (exit 1 when they differ)",
    )
    args = p.parse_args(argv)
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    if not args.check:
        manifest = build(args.out, log=log)
        print(f"wrote {args.out} ({manifest['weights_sha256'][:12]}, {manifest['built_with']['seconds']}s)")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        manifest = build(Path(tmp), log=log)
        same = manifest["weights_sha256"] == json.loads((SHIPPED_DIR / SHIPPED_MANIFEST).read_text())["weights_sha256"]
        gap = 0.0 if same else weight_differences(Path(tmp), SHIPPED_DIR)
    # float16 keeps 11 bits: weights of magnitude < 4 round to steps of at most 2e-3
    ok = gap <= 4e-3
    print(f"rebuilt: {'identical' if same else f'largest weight difference {gap:.2g}'}: {'ok' if ok else 'DIFFERS'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
