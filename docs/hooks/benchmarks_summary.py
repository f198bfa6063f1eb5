"""The summary table at the top of docs/benchmarks.md, generated from its sections (issue 52: a summary row lagged
its own section). Each section that has a current figure says it once, right under its heading:

    <!-- summary: what | the figure | device, date -->

and the table is those lines in page order, each "what" linked to its section. Rewrite the table after changing a
section's line:

    python docs/hooks/benchmarks_summary.py docs/benchmarks.md

tests/docs/test_benchmarks_pages.py fails while the page's table differs from the generated one.
"""

from __future__ import annotations

import re
import sys
import unicodedata
from pathlib import Path

MARK = re.compile(r"^<!-- summary: (.+?) \| (.+) \| ([^|]+?) -->$")
HEAD = "| what | current figure | device, date |\n|---|---|---|\n"
BEGIN = "<!-- summary table: generated from the sections' summary lines (docs/hooks/benchmarks_summary.py) -->"
END = "<!-- end of summary table -->"


def slug(heading: str) -> str:
    """The anchor MkDocs (Python-Markdown's toc) gives a heading."""
    text = unicodedata.normalize("NFKD", heading).encode("ascii", "ignore").decode()
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def summary_rows(page: str) -> list[str]:
    """The table's rows from the page's summary lines, in order; a line outside a section is refused."""
    rows, heading, in_code = [], None, False
    for line in page.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and re.match(r"#{2,6} ", line):
            heading = line.lstrip("#").strip()
        elif (m := MARK.match(line.strip())) is not None:
            if heading is None:
                raise ValueError(f"summary line before any section: {line}")
            what, figure, where = (part.strip() for part in m.groups())
            rows.append(f"| [{what}](#{slug(heading)}) | {figure} | {where} |")
    return rows


def with_table(page: str) -> str:
    """``page`` with its table (between BEGIN and END) made from its summary lines."""
    start, end = page.index(BEGIN) + len(BEGIN), page.index(END)
    return page[:start] + "\n\n" + HEAD + "\n".join(summary_rows(page)) + "\n\n" + page[end:]


if __name__ == "__main__":
    path = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/benchmarks.md")
    path.write_text(with_table(path.read_text()))
