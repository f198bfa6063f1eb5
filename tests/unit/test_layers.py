"""The house's layers: every package of grpokit imports only packages below it (or its own modules).

The order, from the ground up; a package may import any package on a lower line, none on its own line but
itself, none above. Imports inside functions count the same as those at the top of a module.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from paths import REPO

PACKAGE = REPO / "grpokit"

LAYERS: list[tuple[str, ...]] = [
    ("core",),  # errors, files, YAML, user code, workers, hub, notices, version
    ("algos",),  # pure torch maths of the GRPO family
    ("config",),  # the config trees and their checks
    ("data",),  # datasets and templates
    ("model",),  # loading, log-probs, precision, checkpoints
    ("sandbox", "scoring"),  # the code sandbox; the reward runner (workers, keepers, results)
    ("rewards",),  # verifiers, reward models, process rewards
    ("compat",),  # other tools' conventions (TRL)
    ("rollout",),  # generation, multi-turn episodes, tools, environments, evaluation
    ("integrations",),  # reasoning-gym, verifiers, OpenEnv
    ("train",),  # learner, update, critic, distributed, the log-prob passes
    ("collect",),  # how a step gets its batch: the sampler, the asynchronous sampler process, the batch sources
    ("run",),  # run state, log, lock, preflight, plots
    ("trainers",),  # GRPO, SFT, rejection sampling
    ("pipeline",),  # multi-stage runs
    ("demos",),  # the embedded demos
    ("bench", "view"),  # the step bench, the run explorer
    ("cli",),  # the command line
]
LEVEL = {name: level for level, names in enumerate(LAYERS) for name in names}
TOP_FILES = {"__init__.py", "__main__.py"}  # the public API and `python -m grpokit`, above every layer


def imported_modules(path: Path, root: Path = PACKAGE) -> list[tuple[int, str]]:
    """(line, dotted module) of every grpokit import in ``path`` (a file under ``root``, the grpokit folder),
    relative ones resolved."""
    tree = ast.parse(path.read_text(), filename=str(path))
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    package = parts[:-1]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module == "grpokit":  # from grpokit import x: x is a package of its own
                out += [(node.lineno, f"grpokit.{alias.name}") for alias in node.names]
            else:
                out.append((node.lineno, module))
    return [(line, m) for line, m in out if m == "grpokit" or m.startswith("grpokit.")]


def package_of(module: str) -> str:
    """grpokit.train.learner -> train; grpokit -> '' (the top)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def upward_edges(root: Path = PACKAGE) -> list[str]:
    problems = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if len(rel.parts) == 1:
            continue  # the top files may import anything
        here = rel.parts[0]
        for line, module in imported_modules(path, root):
            there = package_of(module)
            if there == here:
                continue
            if there == "" or there not in LEVEL or LEVEL[there] >= LEVEL[here]:
                where = "the top package" if there == "" else f"{there} (layer {LEVEL.get(there, '?')})"
                problems.append(f"grpokit/{rel}:{line} imports {module}: {here} (layer {LEVEL[here]}) -> {where}")
    return problems


def test_only_the_api_and_main_sit_at_the_top():
    loose = sorted(p.name for p in PACKAGE.glob("*.py") if p.name not in TOP_FILES)
    assert loose == [], f"modules at the top of grpokit/: {loose}; put each in the package of its layer"


def test_every_package_has_a_layer():
    packages = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file())
    assert sorted(LEVEL) == packages


def test_no_import_runs_up_the_layers():
    assert upward_edges() == []


def test_the_check_sees_an_upward_import(tmp_path):
    """The check itself: a core module importing the trainer, inside a function, is caught."""
    fake = tmp_path / "grpokit"
    (fake / "core").mkdir(parents=True)
    (fake / "trainers").mkdir()
    (fake / "core" / "__init__.py").write_text("")
    (fake / "core" / "bad.py").write_text("def f():\n    from grpokit.trainers.grpo import GRPOTrainer\n")
    (fake / "trainers" / "ok.py").write_text("from ..core import bad\nimport grpokit.core.bad\n")
    (fake / "trainers" / "top.py").write_text("import grpokit\n")
    trainers = LEVEL["trainers"]  # its place in LAYERS, which grows as packages are added
    assert upward_edges(fake) == [
        f"grpokit/core/bad.py:2 imports grpokit.trainers.grpo: core (layer 0) -> trainers (layer {trainers})",
        f"grpokit/trainers/top.py:1 imports grpokit: trainers (layer {trainers}) -> the top package",
    ]


@pytest.mark.parametrize("module", ["grpokit", "grpokit.rewards.runner"])
def test_package_of(module):
    assert package_of(module) == {"grpokit": "", "grpokit.rewards.runner": "rewards"}[module]
