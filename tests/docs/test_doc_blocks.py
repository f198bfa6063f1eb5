"""Every code block of README.md and docs/ is run, checked, or marked as not runnable here with the reason.

The marker convention and how each language is treated are in doc_blocks.py (and in docs/design/testing.md):
bash and python blocks run in order in one temporary folder per page; YAML blocks load with the loader of
their config kind; text and mermaid blocks are shown, not run; any other language fails here, so a new
block has to say what it is.

Runs train on the embedded demo's model: the session's GRPOKIT_CACHE holds a warm start of 3 steps instead
of the demo's 1,500 (the commands and files are the same, the model is only less trained), so a
`grpokit train` of 2 steps takes seconds. No network (HF_HUB_OFFLINE=1); one torch thread, as the 2-core CI
machine runs fastest that way.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from doc_blocks import CONFIG_KINDS, LANGUAGES, REPO, Block, blocks, pages

BLOCK_TIMEOUT_S = 300


def _id(page: Path) -> str:
    return str(page.relative_to(REPO))


ALL = {page: blocks(page) for page in pages()}


def test_every_block_says_what_it_is():
    problems = []
    for page_blocks in ALL.values():
        for b in page_blocks:
            if b.lang not in LANGUAGES:
                problems.append(f"{b.where}: language {b.lang!r} is none of {LANGUAGES}")
            if b.config not in CONFIG_KINDS:
                problems.append(f"{b.where}: config kind {b.config!r} is none of {CONFIG_KINDS}")
            if b.file and b.lang not in ("yaml", "text", "python", "bash"):
                problems.append(f"{b.where}: a {b.lang} block cannot be a file")
    assert not problems, "\n".join(problems)


def _load(block: Block, path: Path) -> None:
    if block.config == "train":
        from grpokit.config.schema import load_config

        load_config(path)
    elif block.config == "sft":
        from grpokit.config.sft import load_sft_config

        load_sft_config(path)
    elif block.config == "sample":
        from grpokit.trainers.sample import load_sample_config

        load_sample_config(path)
    elif block.config == "trl":
        from grpokit.config.schema import config_from_dict, read_yaml_file
        from grpokit.config.trl import from_trl

        config_from_dict(from_trl(read_yaml_file(path))[0])
    else:
        from grpokit.pipeline.spec import check_stage_configs, load_pipeline

        check_stage_configs(load_pipeline(path))


YAML = [b for page_blocks in ALL.values() for b in page_blocks if b.lang == "yaml" and not b.not_run]


@pytest.mark.parametrize("block", YAML, ids=[b.where for b in YAML])
def test_yaml_block_loads_as_its_config_kind(block, tmp_path, monkeypatch):
    """A YAML block is a config: it must load as one (its page's file blocks written beside it, as a
    pipeline reads its stages' configs)."""
    monkeypatch.chdir(tmp_path)
    for other in ALL[block.page]:
        if other.file:
            (tmp_path / other.file).write_text(other.code)
    path = tmp_path / (block.file or "block.yaml")
    path.write_text(block.code)
    _load(block, path)


@pytest.fixture(scope="session")
def demo_cache(tmp_path_factory) -> Path:
    """A GRPOKIT_CACHE holding the embedded demo's model under the key of the real demo, warm-started for 3
    steps instead of 1,500 (about 5 s)."""
    from grpokit.demos.default import DemoSpec, prepare_demo, spec_key

    cache = tmp_path_factory.mktemp("grpokit-cache")
    quick = prepare_demo(DemoSpec(sft_steps=3), cache=cache, log=lambda m: None)
    quick["model"].parent.rename(cache / f"demo-{spec_key(DemoSpec())}")
    return cache


def _env(cache: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        GRPOKIT_CACHE=str(cache),
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        OMP_NUM_THREADS="1",
        MPLBACKEND="Agg",
        TOKENIZERS_PARALLELISM="false",
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
    )
    env.pop("GRPOKIT_DEBUG", None)
    return env


RUNNABLE = [page for page, page_blocks in ALL.items() if any(b.runs for b in page_blocks)]


@pytest.mark.slow
@pytest.mark.parametrize("page", RUNNABLE, ids=[_id(p) for p in RUNNABLE])
def test_page_runs(page, tmp_path, demo_cache):
    """The page's bash and python blocks, in order, in one folder (its file blocks written as they come)."""
    env = _env(demo_cache)
    for block in ALL[page]:
        if block.file:
            (tmp_path / block.file).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / block.file).write_text(block.code)
        if not block.runs:
            continue
        if block.lang == "bash":
            command = ["bash", "-euo", "pipefail", "-c", block.code]
        else:
            script = tmp_path / f".block_{block.line}.py"
            script.write_text(block.code)
            command = [sys.executable, script.name]
        done = subprocess.run(
            command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S
        )
        assert done.returncode == 0, (
            f"{block.where}: exit {done.returncode}\n--- block\n{block.code}--- stdout (end)\n"
            f"{done.stdout[-3000:]}\n--- stderr (end)\n{done.stderr[-3000:]}"
        )


def test_the_readme_stays_under_10_kb_and_starts_with_its_two_commands():
    """Issue 54: the README is a front door, <= 10 KB, its numbers linked; its first bash block is the two commands
    .ci/run follows literally (the embedded demo, the tests)."""
    text = (REPO / "README.md").read_text()
    assert len(text.encode()) <= 10_000, f"README.md is {len(text.encode())} bytes: link to a docs page instead"
    first = text.split("```bash\n", 1)[1].split("```", 1)[0]
    assert "grpokit train --output-dir runs/demo" in first and "python -m pytest -q -n auto" in first
