"""Files written whole, and a full disk named as such.

``replace_whole`` writes ``NAME.tmp`` beside the file, then renames it over the file, so that a reader
(another rank, a resumed run, a crash) sees the old content or the new, never half of it.

``no_space(error)`` tells a full disk (ENOSPC, or a quota: EDQUOT) anywhere in an exception's chain or
text: safetensors and tokenizers raise their own types with "No space left on device (os error 28)" in
the message. ``disk_full_message`` is the one line the command line prints for it: the path being written,
the free space on its disk, the bytes needed when known, and what to do.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_FULL_TEXTS = ("no space left on device", "os error 28", "disk quota exceeded", "os error 122")


def replace_whole(path: Path, content: str | bytes) -> None:
    """Write ``content`` to ``path`` through ``path.tmp`` and one rename (atomic on POSIX)."""
    tmp = path.with_name(path.name + ".tmp")
    if isinstance(content, bytes):
        tmp.write_bytes(content)
    else:
        tmp.write_text(content)
    os.replace(tmp, path)


def no_space(error: BaseException) -> OSError | bool:
    """The OSError with ENOSPC/EDQUOT in ``error``'s chain (its cause and context), else True when a message
    in the chain says the disk is full (writers that raise their own types), else False."""
    e: BaseException | None = error
    said = False
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in _FULL_ERRNOS:
            return e
        said = said or any(text in str(e).lower() for text in _FULL_TEXTS)
        e = e.__cause__ or e.__context__
    return said


def free_bytes(path: Path) -> int | None:
    """Free bytes on the disk of ``path`` (its nearest existing folder), None when it cannot be read."""
    try:
        return shutil.disk_usage(_existing(path)).free
    except OSError:
        return None


def _existing(path: Path) -> Path:
    where = Path(path).absolute()
    while not where.exists() and where != where.parent:
        where = where.parent
    return where


def space_text(path: Path) -> str:
    """The free space on the disk of ``path`` for a reader ("3.4 MiB free on its disk"), with "but no free
    inodes (df -i)" when the disk has bytes left and no room for another file (ENOSPC then too)."""
    text = f"{size_text(free_bytes(path))} free on its disk"
    try:
        stat = os.statvfs(_existing(path))
    except OSError:
        return text
    return text + (" but no free inodes (df -i)" if stat.f_files > 0 and stat.f_favail == 0 else "")


def size_text(n: float | None) -> str:
    """``n`` bytes for a reader: "812 bytes", "3.4 MiB", "12.0 GiB"; "unknown" for None."""
    if n is None:
        return "unknown"
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def disk_full_message(
    error: BaseException, where: Path | None = None, needed: int | None = None, folder: Path | None = None
) -> str:
    """One line for a write that failed on a full disk: the path written (``where``, else the OSError's file
    name) with the free space on its disk and the bytes needed when known, what failed, and what to do.
    ``folder``: the run's output folder, whose free space is named when the path written is not known."""
    found = no_space(error)
    name = found.filename if isinstance(found, OSError) and found.filename else None
    path = Path(where) if where is not None else Path(os.fsdecode(name)) if name is not None else None
    quota = isinstance(found, OSError) and found.errno == errno.EDQUOT
    first = str(error).strip().splitlines()[0][:200] if str(error).strip() else ""
    cause = f"{type(error).__name__}: {first}" if first else type(error).__name__
    need = f"; about {size_text(needed)} needed" if needed is not None else ""
    if path is not None:
        where_text = f" writing {path} ({space_text(path)}{need}; {cause})"
    elif folder is not None:
        where_text = f" ({cause}); train.output_dir={str(folder)!r}: {space_text(folder)}{need}"
    else:
        where_text = f" ({cause}{need})"
    what = "disk quota exceeded" if quota else "no space left on the disk"
    return (
        f"disk full: {what}{where_text}. Free some space (old runs or checkpoints; train.keep_checkpoints "
        "keeps fewer) or set train.output_dir to a folder on another disk, then run again (with --resume to "
        "continue a run that has a checkpoint)."
    )
