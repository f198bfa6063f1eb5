"""Files written whole: ``replace_whole`` writes ``NAME.tmp`` beside the file, then renames it over the file,
so that a reader (another rank, a resumed run, a crash) sees the old content or the new, never half of it."""

from __future__ import annotations

import os
from pathlib import Path


def replace_whole(path: Path, content: str | bytes) -> None:
    """Write ``content`` to ``path`` through ``path.tmp`` and one rename (atomic on POSIX)."""
    tmp = path.with_name(path.name + ".tmp")
    if isinstance(content, bytes):
        tmp.write_bytes(content)
    else:
        tmp.write_text(content)
    os.replace(tmp, path)
