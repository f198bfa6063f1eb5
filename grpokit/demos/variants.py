"""Which embedded demo the command line asks for: the default (grpokit.demos.default, one-step addition scored by
math_accuracy) or a variant (``data.train=demo_steps``: grpokit.demos.steps, multi-step addition scored
step by step). Above both: each variant builds on grpokit.demos.default, which knows none of them."""

from __future__ import annotations

from pathlib import Path

from grpokit.demos import steps as demo_steps
from grpokit.demos.default import demo_overrides, prepare_demo


def demo_variant(overrides: list[str]) -> tuple[str | None, list[str]]:
    """("demo_steps", the other overrides) when the command line asks for the process-reward variant
    (`data.train=demo_steps`), else (None, overrides)."""
    asked = f"data.train={demo_steps.NAME}"
    if asked not in overrides:
        return None, overrides
    return demo_steps.NAME, [o for o in overrides if o != asked]


def prepare_variant(variant: str | None, log=print) -> dict[str, Path]:
    """prepare_demo() for the default demo (variant None), else for the named variant."""
    if variant is None:
        return prepare_demo(log=log)
    return demo_steps.prepare(log=log)


def variant_overrides(paths: dict[str, Path], variant: str | None = None) -> dict:
    """The run's config of the default demo (variant None) or of the variant (grpokit.demos.steps.overrides)."""
    return demo_overrides(paths) if variant is None else demo_steps.overrides(paths)
