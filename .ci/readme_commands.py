"""Print the commands of README.md's first ```bash block, one per line, as written (a trailing `# comment` cut off):
.ci/run runs exactly these, so CI follows the README a newcomer follows and fails when it stops working."""

from __future__ import annotations

import re
import sys
from pathlib import Path


def commands(readme: str) -> list[str]:
    block = re.search(r"^```bash\n(.*?)^```", readme, flags=re.S | re.M)
    if block is None:
        raise SystemExit("ci: README.md has no ```bash block")
    out = []
    for line in block.group(1).splitlines():
        command = line[: _comment_start(line)].rstrip()
        if command:
            out.append(command)
    return out


def _comment_start(line: str) -> int:
    """Index of the '#' that starts the line's comment (outside quotes, after whitespace), or its length."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return i
    return len(line)


if __name__ == "__main__":
    print("\n".join(commands(Path(sys.argv[1] if len(sys.argv) > 1 else "README.md").read_text())))
