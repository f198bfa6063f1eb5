"""What every ``grpokit`` command shares: the one-line error it exits with, --debug, and its ``[CONFIG.yaml]
key=value ...`` arguments. Below grpokit.cli.main and the commands' own modules (grpokit.pipeline.run,
grpokit.trainers.sample), which the CLI imports."""

from __future__ import annotations

import argparse
import os
import sys
import traceback

from grpokit.core.errors import ConfigError


def debug_on(args: argparse.Namespace) -> bool:
    """--debug given, or GRPOKIT_DEBUG set (not 0): errors print their traceback too."""
    return bool(getattr(args, "debug", False)) or os.environ.get("GRPOKIT_DEBUG", "") not in ("", "0")


def fail(args: argparse.Namespace, message: str, code: int) -> int:
    """Print a one-line error (and, with --debug, the traceback of the exception being handled)."""
    if debug_on(args):
        traceback.print_exc()
    print(f"grpokit: {message}", file=sys.stderr)
    return code


def config_args(args: argparse.Namespace) -> tuple[str | None, list[str]]:
    """(config path, overrides) from ``[CONFIG.yaml] key=value ...`` and ``--config PATH``."""
    overrides = list(args.overrides)
    config_path = None
    if overrides and "=" not in overrides[0]:
        config_path = overrides.pop(0)
    given = getattr(args, "config", None)
    if given is not None:
        if config_path is not None:
            raise ConfigError(
                f"two config files: --config {given} and {config_path}; give one (either form works)."
            )
        config_path = given
    for text in overrides:
        if "=" not in text:
            raise ConfigError(
                f"{text!r} is neither the config file (it comes first) nor a key=value override."
            )
    return config_path, overrides
