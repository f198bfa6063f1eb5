"""``grpokit sample CONFIG.yaml [key=value ...]``: rejection sampling (grpokit.trainers.sample) from the command line."""

from __future__ import annotations

import sys

from grpokit.cli.args import config_args, fail
from grpokit.core.errors import ConfigError
from grpokit.trainers import sample


def add_sample_parser(subparsers, parents: list) -> None:
    """Register ``grpokit sample`` (parents: the shared --debug parser)."""
    p = subparsers.add_parser(
        "sample",
        help="rejection sampling: N completions per prompt, keep those the rewards pass, write SFT data",
        parents=parents,
        description=sample.__doc__.split("\n\n")[0].replace("``", ""),
    )
    p.add_argument("overrides", nargs="*", help="[CONFIG.yaml] then section.key=value overrides")
    p.add_argument("--config", metavar="PATH", help="the YAML config (or give it as the first argument)")
    p.add_argument("--output-dir", help="shorthand for output.dir=...")
    p.add_argument("--resume", action="store_true", help="continue the run in the output folder")
    p.add_argument("--overwrite", action="store_true", help="replace the run in the output folder")
    p.set_defaults(func=cmd_sample)


def cmd_sample(args) -> int:
    import signal

    from grpokit.data.prompts import DataError

    try:
        path, overrides = config_args(args)
        if args.output_dir is not None:
            overrides.append(f"output.dir={args.output_dir}")
        cfg = sample.load_sample_config(path, overrides)
        sample.run_sample(cfg, resume=args.resume, overwrite=args.overwrite)
    except ConfigError as e:
        return fail(args, f"config error: {e}", 2)
    except (DataError, sample.SampleError, ValueError) as e:
        return fail(args, str(e), 2)
    except sample.Stopped as e:
        print(f"grpokit: {e}", file=sys.stderr)
        return 128 + signal.Signals[e.signal_name].value
    return 0
