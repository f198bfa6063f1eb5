"""One output folder, one run: an exclusive lock held while the run trains, and ``--overwrite`` that
loses nothing until the new run has written its first step.

The lock is ``flock`` on ``OUTPUT/.grpokit.lock`` (the kernel drops it when its process dies, however
it dies, so a lock left by a killed run is stale by construction; the file only records who held it,
for the message). The trainer tries it before anything loads (``claim_output_dir``: a folder in use
fails in a second) and takes it for the whole of ``train()`` (``holding``), checking the
folder again under it, so two trainers started into one folder cannot both pass: the second gets a
ConfigError naming the first one's process.

``--overwrite`` moves the previous run's files (``runlog.RUN_OUTPUTS``, and only when the folder holds
a run) into ``OUTPUT/.replaced/``; they are deleted once the new run has logged its first step, and put
back when it fails before that. Files that are not a run's are never touched.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

from grpokit.core.errors import ConfigError
from grpokit.core.files import disk_full_message, no_space
from grpokit.run.log import RUN_OUTPUTS, holds_run

LOCK_FILE = ".grpokit.lock"
REPLACED = ".replaced"
"""Folder under the output folder holding the run being replaced until the new one has a step."""
MOVING = ".replacing"
"""REPLACED while it is being filled: renamed to REPLACED once the whole run is in it, so a kill half-way
through the move leaves this name, never a REPLACED holding part of the run (see set_aside)."""


_HELD: set[int] = set()
"""Descriptors of the locks this process holds: a forked child (a reward worker) closes its copies, so
the lock ends with the run and not with the last child (flock belongs to the open file, which fork shares)."""


def _close_held_in_child() -> None:
    for fd in _HELD:
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD.clear()


os.register_at_fork(after_in_child=_close_held_in_child)


class OutputLock:
    """``flock(LOCK_EX | LOCK_NB)`` on ``folder/.grpokit.lock``; ``release()`` (or process death) drops it.
    A folder this lock made is removed again on release when nothing else was written there."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.fd: int | None = None
        self.made_folder = False
        self.resume = self.overwrite = False  # what the run asked for (claim_output_dir)
        self.main = True  # rank 0 (under torchrun only rank 0 locks)
        self.started = False  # train() has checked the folder under the lock once

    @property
    def held(self) -> bool:
        return self.fd is not None

    def acquire(self) -> None:
        if self.fd is not None:
            return
        key = f"train.output_dir={str(self.folder)!r}"
        if not self.folder.is_dir():
            try:
                self.folder.mkdir(parents=True)
                self.made_folder = True
            except FileExistsError:
                pass
            except OSError as e:
                raise ConfigError(
                    f"{key}: the folder cannot be made ({e.strerror}); choose another path."
                ) from None
        path = self.folder / LOCK_FILE
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            if no_space(e):  # the run's first file: a full disk named, with its free space
                raise ConfigError(f"{key}: {disk_full_message(e, where=path)}") from None
            raise ConfigError(
                f"{key}: cannot create {path} ({e.strerror}); choose a writable folder."
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "another process"
            os.close(fd)
            raise ConfigError(
                f"{key} is in use by another grpokit run ({holder}): one folder takes one run at a time; wait "
                f"for it to end, stop it, or choose another folder (e.g. train.output_dir={self.folder}-2)."
            ) from None
        except OSError as e:  # a file system without locks (some network mounts)
            os.close(fd)
            raise ConfigError(
                f"{key}: cannot lock {path} ({e.strerror}); put the output folder on a local disk."
            ) from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        except OSError as e:
            os.close(fd)
            if no_space(e):
                raise ConfigError(f"{key}: {disk_full_message(e, where=path)}") from None
            raise
        self.fd = fd
        _HELD.add(fd)

    def release(self) -> None:
        """Drop the lock; a folder this lock made that holds nothing else is removed."""
        if self.fd is None:
            return
        fd, self.fd = self.fd, None
        _HELD.discard(fd)
        try:
            if self.made_folder and sorted(p.name for p in self.folder.iterdir()) == [LOCK_FILE]:
                (self.folder / LOCK_FILE).unlink()
                self.folder.rmdir()
            else:
                os.ftruncate(fd, 0)
        except OSError:
            pass
        os.close(fd)
        self.made_folder = False

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def is_main_rank() -> bool:
    """Rank 0 under torchrun (RANK unset: a single process)."""
    return int(os.environ.get("RANK", "0") or 0) == 0


def claim_output_dir(folder: Path, *, resume: bool, overwrite: bool, main: bool = True) -> OutputLock:
    """Check that ``folder`` can take this run (``validate.check_output_dir``) and is not in use by another
    run now (its lock is tried and let go; an ``--overwrite`` killed before its first step has its old
    run put back), creating nothing. Returns the lock that ``train()`` takes (``holding``)
    and keeps until it ends. Under torchrun only rank 0 (``main``) locks; the others only check."""
    from grpokit.run.preflight import check_output_dir

    lock = OutputLock(folder)
    lock.resume, lock.overwrite, lock.main = resume, overwrite, main
    if main and (Path(folder) / LOCK_FILE).is_file():
        lock.acquire()  # fails now, before anything loads, when another run holds the folder
        try:
            if not overwrite and not (resume and overwrite):
                restore_aside(folder)
        finally:
            lock.release()
    check_output_dir(folder, resume=resume, overwrite=overwrite)
    return lock


@contextlib.contextmanager
def holding(lock: OutputLock) -> Iterator[None]:
    """The output folder locked while a trainer's run (grpokit.run.loop) is inside, released when it
    returns or raises. The first run checks the folder again under the lock (two runs started together
    cannot both pass); a later one continues the run. A run being replaced (``--overwrite``, see
    set_aside) is put back when no step of the new run was logged. Ranks other than 0 hold nothing."""
    if not lock.main:
        yield
        return
    from grpokit.run.preflight import check_output_dir

    lock.acquire()
    try:
        if not lock.started:
            if not lock.overwrite:
                restore_aside(lock.folder)  # an --overwrite killed before its first step
            check_output_dir(lock.folder, resume=lock.resume, overwrite=lock.overwrite)
            lock.started = True
        yield
    finally:
        restore_aside(lock.folder)
        lock.release()


def set_aside(folder: Path) -> Path | None:
    """Move the run in ``folder`` (its RUN_OUTPUTS) into ``folder/.replaced``; None when it holds no run.
    A ``.replaced`` left by an earlier overwrite that never reached its first step is the older run: it is
    kept, and what that attempt wrote is deleted."""
    folder = Path(folder)
    aside = folder / REPLACED
    _undo_partial_move(folder)
    if aside.is_dir():
        _remove_outputs(folder)
        return aside
    if not holds_run(folder):
        return None
    moving = folder / MOVING
    moving.mkdir()
    for name in RUN_OUTPUTS:
        path = folder / name
        if path.exists() or path.is_symlink():
            path.rename(moving / name)
    moving.rename(aside)  # atomic: REPLACED appears holding the whole run, or not at all
    return aside


def _undo_partial_move(folder: Path) -> None:
    """A set_aside killed half-way left the old run split between ``folder`` and ``folder/.replacing``
    (the new run writes nothing before the move ends): the moved part goes back beside the rest."""
    moving = folder / MOVING
    if not moving.is_dir():
        return
    for path in moving.iterdir():
        path.rename(folder / path.name)
    moving.rmdir()


def discard_aside(folder: Path) -> None:
    """The new run has its first step: delete the run it replaced."""
    aside = Path(folder) / REPLACED
    if aside.is_dir():
        shutil.rmtree(aside)


def restore_aside(folder: Path) -> None:
    """The new run failed before its first step: delete what it wrote and put the replaced run back."""
    folder = Path(folder)
    _undo_partial_move(folder)  # killed while setting the old run aside: it is whole again, in place
    aside = folder / REPLACED
    if not aside.is_dir():
        return
    _remove_outputs(folder)
    for path in aside.iterdir():
        path.rename(folder / path.name)
    aside.rmdir()
    print(f"grpokit: the run in {folder} that --overwrite was replacing is back in place", file=sys.stderr)


def _remove_outputs(folder: Path) -> None:
    for name in RUN_OUTPUTS:
        path = folder / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
