"""One LM-head chunk's log-probs and entropy, forward and backward under checkpoint (as the update runs it), with
optim.fused_logprobs off and on: seconds per chunk, the minimum of 3 after a first call (which compiles).

    python scripts/bench_logprob_chunk.py --rows 256 --dtype bfloat16     # Qwen2.5-0.5B's head: 896 x 151,936
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.utils.checkpoint import checkpoint

from grpokit.model.logprobs import _chunk_logprobs


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=256, help="tokens in the chunk (optim.logprob_chunk_size)")
    ap.add_argument("--hidden", type=int, default=896)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    dtype, device = getattr(torch, args.dtype), torch.device(args.device)
    head = torch.nn.Linear(args.hidden, args.vocab, bias=False).to(device, dtype)
    hidden = torch.randn(args.rows, args.hidden, dtype=dtype, device=device, requires_grad=True)
    targets = torch.randint(0, args.vocab, (args.rows,), device=device)
    out = {}
    for fused in (False, True):
        times = []
        for _ in range(4):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            logprobs, _ = checkpoint(_chunk_logprobs, head, hidden, targets, 1.0, None, True, False, False, fused,
                                     use_reentrant=False)  # fmt: skip
            (logprobs * 0.01).sum().backward()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - t0)
        out["fused" if fused else "plain"] = {"first_s": times[0], "min_s": min(times[1:])}
        print(f"fused_logprobs={str(fused).lower()}: first call {times[0]:.3f} s, then {min(times[1:]):.3f} s")
    print(f"fused / plain: {out['fused']['min_s'] / out['plain']['min_s']:.2f}x ({args.rows} rows, {args.dtype}, "
          f"{device.type})")  # fmt: skip
    return out


if __name__ == "__main__":
    main()
