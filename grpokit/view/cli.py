"""``grpokit view RUN_DIR [RUN_DIR ...]``: write the run explorer page and print its path; ``--serve`` also
serves it on localhost (the standard library's http.server) until Ctrl-C."""

from __future__ import annotations

import argparse
import functools
import http.server
import sys
from pathlib import Path

PAGE_NAME = "view.html"


def add_view_parser(subparsers) -> None:
    """Register ``grpokit view`` on an ``argparse`` subparsers object."""
    p = subparsers.add_parser(
        "view",
        help="write a self-contained HTML page to explore runs: curves, groups, tokens, the objective",
        description=(
            "Write one HTML file (no network needed to open it) with the runs' curves overlaid, a browser of "
            "the steps saved every train.samples_every steps (every group, completion and token) and the "
            f"objective worked through for a group. Written to the first run's folder as {PAGE_NAME}."
        ),
    )
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="train.output_dir of a run (several: overlaid)")
    p.add_argument("--out", metavar="FILE", help=f"where to write the page (default RUN_DIR/{PAGE_NAME})")
    p.add_argument(
        "--max-groups", type=int, metavar="N", help="keep at most N groups per saved step (default: all)"
    )
    p.add_argument("--serve", action="store_true", help="also serve the page on http://127.0.0.1:PORT/")
    p.add_argument("--port", type=int, default=8000, help="port for --serve (0: any free one; default 8000)")
    p.set_defaults(func=cmd_view)


def cmd_view(args: argparse.Namespace) -> int:
    from grpokit.view.data import RunReadError, read_run  # torch and pyarrow: only when the command runs
    from grpokit.view.page import clean, write_page

    if args.max_groups is not None and args.max_groups < 1:
        print(f"grpokit view: error: --max-groups must be at least 1, got {args.max_groups}", file=sys.stderr)
        return 2
    if args.serve and not 0 <= args.port <= 65535:
        print(f"grpokit view: error: --port must be within 0..65535 (0: any free one), got {args.port}", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else Path(args.runs[0]) / PAGE_NAME
    problem = _out_problem(out) if args.out else None  # checked before the runs are read (seconds for big ones)
    if problem:
        print(f"grpokit view: error: --out {out}: {problem}", file=sys.stderr)
        return 2
    try:
        runs = [clean(read_run(run, max_groups=args.max_groups)) for run in args.runs]
    except RunReadError as e:
        print(f"grpokit view: error: {e}", file=sys.stderr)
        return 2
    for run in runs:  # what was left out (a damaged rollouts file, a metrics line that does not parse)
        for warning in run.get("warnings", []):
            print(f"grpokit view: warning: {warning}", file=sys.stderr)
    try:
        path = write_page(runs, out)
    except OSError as e:
        print(f"grpokit view: error: cannot write {out} ({e.strerror}); give a writable --out FILE", file=sys.stderr)
        return 2
    print(path, flush=True)
    if args.serve:
        serve(path, args.port)
    return 0


def _out_problem(out: Path) -> str | None:
    """Why the page cannot be written at ``out`` (a folder there, its folder missing or a file), or None."""
    if out.is_dir():
        return f"is a folder; give a file path (e.g. --out {out / PAGE_NAME})"
    if not out.parent.is_dir():
        what = "is a file" if out.parent.exists() else "does not exist"
        return f"its folder {out.parent} {what}; make the folder or choose another path"
    return None


def serve(path: Path, port: int) -> None:
    """Serve ``path``'s folder on 127.0.0.1:port and print the page's address; returns on Ctrl-C."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(path.parent))
    with http.server.ThreadingHTTPServer(("127.0.0.1", port), handler) as server:
        print(f"serving http://127.0.0.1:{server.server_address[1]}/{path.name} (Ctrl-C stops)", flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
