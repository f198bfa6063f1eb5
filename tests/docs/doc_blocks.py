"""The fenced code blocks of README.md and docs/**/*.md, with the marker that says how each is checked.

A marker is an HTML comment on the line right before the opening fence (invisible on the rendered page);
its parts are separated by ";" (a reason may hold ";" too: only "; not run:", "; file:" or "; config:" start a part):

    <!-- not run: needs a GPU -->          never executed; the reason is required
    <!-- file: r1.yaml -->                 the block is written to that file in the page's folder first
    <!-- config: sft -->                   a YAML block's loader: train (the default), sft, sample, pipeline,
                                           trl (a TRL GRPOConfig file, converted by grpokit.config.trl)

How each language is treated (tests/docs/test_doc_blocks.py):

    bash     run with bash -euo pipefail, in the page's folder, in page order
    python   run with this Python in a subprocess, in the page's folder, in page order
    yaml     a config: loaded with its kind's loader (and written to disk when it has a file: part)
    text     output or a listing shown to the reader: not run
    mermaid  a diagram: rendered by mkdocs, not run
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from paths import REPO

DOCS = REPO / "docs"
LANGUAGES = ("bash", "python", "yaml", "text", "mermaid")
CONFIG_KINDS = ("train", "sft", "sample", "pipeline", "trl")
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>```+|~~~+)\s*(?P<lang>[\w+-]*)")
MARKER = re.compile(r"^\s*<!--(?P<body>.*)-->\s*$")


@dataclass
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    not_run: str | None = None  # the reason
    file: str | None = None
    config: str = "train"

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.not_run is None and self.lang in ("bash", "python")


def pages() -> list[Path]:
    """README.md and every Markdown page under docs/ (the hook's folder holds no pages)."""
    return [REPO / "README.md", *sorted(p for p in DOCS.rglob("*.md") if "hooks" not in p.parts)]


def parse_marker(body: str, where: str) -> dict[str, str]:
    parts = {}
    for part in re.split(r";\s*(?=(?:not run|file|config)\s*:)", body):
        key, sep, value = part.partition(":")
        key, value = key.strip(), value.strip()
        if not sep or key not in ("not run", "file", "config") or not value:
            raise ValueError(
                f"{where}: unreadable block marker part {part.strip()!r} (not run: WHY | file: NAME | config: KIND)"
            )
        parts[key] = value
    return parts


def blocks(page: Path) -> list[Block]:
    """The page's fenced blocks in order. Raises ValueError for an unclosed fence or a bad marker."""
    lines = page.read_text().splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = len(m["indent"]), m["fence"], m["lang"]
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == fence), None)
        if end is None:
            raise ValueError(f"{page.relative_to(REPO)}:{i + 1}: unclosed code fence")
        code = "\n".join(line[indent:] for line in lines[i + 1 : end]) + "\n"
        block = Block(page, i + 1, lang, code)
        marker = MARKER.match(lines[i - 1]) if i else None
        if marker:
            parts = parse_marker(marker["body"], block.where)
            block.not_run = parts.get("not run")
            block.file = parts.get("file")
            block.config = parts.get("config", "train")
        out.append(block)
        i = end + 1
    return out
