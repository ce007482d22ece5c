"""An online copy of the journal (``crew-supervisor backup``), taken while a supervisor serves it.

A reader like any other (``Reader.copy_into``): it never takes the journal's lock (``claim.py``), so it runs beside
the supervisor, whose writer it never holds up; the copy is the journal as it was at one instant, what had
committed. It is written to a private temporary file beside the target, checked with SQLite's quick check, made
durable, and only then put at the target's name: the target is a whole checked copy or nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sqlite3
import stat
import tempfile
from pathlib import Path

from supervisor.journal.errors import JournalError
from supervisor.journal.migrate import fsync
from supervisor.journal.reader import Reader
from supervisor.journal.statefiles import check_state_files, journal_companions

STEP_PAGES = 1024  # a step of the copy: 4 MiB of 4 KiB pages


@dataclasses.dataclass(frozen=True)
class Copied:
    path: Path
    records: int
    size: int


def backup(journal: Path, target: Path, *, force: bool = False) -> Copied:
    """Copy ``journal`` to ``target`` (0600); an existing ``target`` is refused unless ``force``. Raises
    JournalError, saying why in one line."""
    journal, target = journal.absolute(), target.absolute()
    _refuse(journal, target, force)
    fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent)  # 0600
    os.close(fd)
    partial = Path(name)
    try:
        _copy(journal, partial)
        records = _checked(partial)
        fsync(partial)
        if force:
            os.replace(partial, target)
        else:
            os.link(partial, target)  # unlike a rename, refuses a target made meanwhile
        fsync(target.parent)
        return Copied(target, records, target.stat().st_size)
    except FileExistsError:
        raise JournalError(f"{target} exists: give --force to replace it") from None
    except (OSError, sqlite3.Error) as exc:
        raise JournalError(f"cannot copy {journal} to {target}: {_reason(exc)}") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()


def _refuse(journal: Path, target: Path, force: bool) -> None:
    check_state_files(journal)
    if not journal.exists():
        raise JournalError(f"no journal at {journal}: nothing to back up")
    ours = {os.path.realpath(path) for path, _ in journal_companions(journal)}
    if os.path.realpath(target) in ours:
        raise JournalError(f"{target} is one of the journal's own files: put the copy elsewhere")
    if not target.parent.is_dir():
        raise JournalError(f"{target.parent} is not a directory")
    if os.path.lexists(target) and not force:
        raise JournalError(f"{target} exists: give --force to replace it")
    if force and os.path.lexists(target) and not stat.S_ISREG(os.lstat(target).st_mode):
        raise JournalError(f"{target} is not a regular file: --force replaces only an earlier copy")


def _copy(journal: Path, partial: Path) -> None:
    """With no supervisor on it (no WAL) the journal is read as immutable, as the doctor reads it, or SQLite would
    leave a ``-wal`` and ``-shm`` beside it; a supervisor that opened it meanwhile made a WAL: copied again, live."""
    wal = journal.with_name(journal.name + "-wal")
    for immutable in (not wal.exists(), False):
        reader, target = Reader(journal, immutable=immutable), sqlite3.connect(partial)
        try:
            reader.copy_into(target, STEP_PAGES)
        finally:
            target.close()
            reader.close()
        if not (immutable and wal.exists()):
            return


def _checked(partial: Path) -> int:
    """The copy's records, once SQLite's quick check passed it."""
    reader = Reader(partial, immutable=True)  # nothing else has it: no -wal or -shm made beside it
    try:
        if (result := reader.integrity()) != "ok":
            raise JournalError(f"the copy fails SQLite's quick check ({result}): the journal itself may be damaged")
        return reader.count()
    finally:
        reader.close()


def _reason(exc: Exception) -> str:
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
