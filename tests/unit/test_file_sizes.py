"""The library's modules stay small enough to hold in one's head (issue 54): a module over LIMIT lines says why it is
one file in its first lines ("Over 500 lines: ..." in its docstring's opening), or is split."""

from __future__ import annotations

from pathlib import Path

from paths import REPO

LIMIT = 520  # "about 500"
REASON = "Over 500 lines"


def long_modules_without_a_reason(root: Path) -> list[str]:
    """'path: N lines' of each module below ``root`` over LIMIT lines whose first 12 lines do not say why."""
    out = []
    for path in sorted(root.rglob("*.py")):
        lines = path.read_text().splitlines()
        if len(lines) > LIMIT and not any(REASON in line for line in lines[:12]):
            out.append(f"{path.relative_to(root)}: {len(lines)} lines")
    return out


def test_every_module_over_500_lines_says_why_it_is_one_file():
    assert long_modules_without_a_reason(REPO / "grpokit") == []


def test_the_check_sees_a_long_module_that_does_not_say_why(tmp_path):
    body = "x = 1\n" * (LIMIT + 1)
    (tmp_path / "long.py").write_text('"""A module."""\n' + body)
    (tmp_path / "said.py").write_text(f'"""A module.\n({REASON}: a reason.)"""\n' + body)
    (tmp_path / "short.py").write_text("x = 1\n")
    assert long_modules_without_a_reason(tmp_path) == [f"long.py: {LIMIT + 2} lines"]
