"""The benchmarks pages (issues 52 and 54): the summary table of docs/benchmarks.md is the one its sections' summary
lines give (docs/hooks/benchmarks_summary.py), each row linked to its section; the history page is in the site."""

from __future__ import annotations

import sys

from paths import REPO

sys.path.insert(0, str(REPO / "docs" / "hooks"))
from benchmarks_summary import BEGIN, END, slug, summary_rows, with_table  # noqa: E402

PAGE = REPO / "docs" / "benchmarks.md"


def test_the_summary_table_is_generated_from_the_sections():
    page = PAGE.read_text()
    assert with_table(page) == page, (
        "docs/benchmarks.md's summary table is stale: python docs/hooks/benchmarks_summary.py"
    )
    rows = summary_rows(page)
    assert len(rows) >= 10 and page.count("<!-- summary: ") == len(rows)
    headings = {slug(line.lstrip("#").strip()) for line in page.splitlines() if line.startswith("#")}
    for row in rows:  # each row links to a heading of the page
        assert row.split("](#", 1)[1].split(")", 1)[0] in headings, row


def test_a_changed_summary_line_changes_its_row():
    page = PAGE.read_text()
    first = page.index("<!-- summary: ", page.index(END))
    changed = page[:first] + "<!-- summary: a new figure | 1.23x | somewhere, 2026-12-01 -->\n" + page[first:]
    assert with_table(changed) != changed and "| 1.23x | somewhere, 2026-12-01 |" in with_table(changed)
    assert BEGIN in page and END in page


def test_slugs_are_mkdocs_anchors():
    assert slug("`code_tests`: the code sandbox") == "code_tests-the-code-sandbox"
    assert (
        slug("The 1.5B plan for 16 GiB, and the command that proves it")
        == "the-15b-plan-for-16-gib-and-the-command-that-proves-it"
    )
    assert slug("Under load (2026-11-27/28)") == "under-load-2026-11-2728"  # as the built site's id


def test_the_history_page_is_in_the_site_and_keeps_its_sections():
    history = (REPO / "docs" / "benchmarks-history.md").read_text()
    assert "benchmarks-history.md" in (REPO / "mkdocs.yml").read_text()
    for heading in (
        "## Earlier sessions",
        "### What the first GPU session fixed (2026-11-25)",
        "## Under load (2026-11-27/28)",
    ):
        assert heading in history
