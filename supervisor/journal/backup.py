"""An online copy of the journal (``crew-supervisor backup``), taken while a supervisor serves it.

A reader like any other (``Reader.copy_into``): it never takes the journal's lock (``claim.py``), so it runs beside
the supervisor, whose writer it never holds up; the copy is the journal as it was at one instant, what had
committed. It is written to a private temporary file beside the target, checked with SQLite's quick check, made
durable, and only then put at the target's name: the target is a whole checked copy or nothing. That file is
locked (flock) while its backup runs; one left unlocked was a killed backup's, removed by the next to that target.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import re
import sqlite3
import stat
import tempfile
from pathlib import Path

from supervisor.journal.errors import JournalError
from supervisor.journal.migrate import fsync
from supervisor.journal.reader import Reader
from supervisor.journal.statefiles import check_state_files, journal_companions

STEP_PAGES = 1024  # a step of the copy: 4 MiB of 4 KiB pages
PARTIAL = ".partial"  # a copy being made is ``.<target's name>.<8 of mkstemp's characters>.partial``


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
    fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=PARTIAL, dir=target.parent)  # 0600
    partial = Path(name)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # held to the end: no other backup's sweep takes this copy
        _sweep(target, partial)
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
        os.close(fd)


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


def _sweep(target: Path, ours: Path) -> None:
    """Remove the partial copies (and their ``-journal``) that killed backups to ``target`` left: those older than
    ``ours`` that no running backup holds locked."""
    named = re.compile(re.escape(f".{target.name}.") + "[a-z0-9_]{8}" + re.escape(PARTIAL))
    started = os.stat(ours).st_mtime_ns
    for entry in os.scandir(target.parent):
        if entry.path == str(ours) or not named.fullmatch(entry.name):
            continue
        try:
            fd = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            continue  # gone meanwhile, or a link: not a copy of ours
        try:
            found = os.fstat(fd)
            if stat.S_ISREG(found.st_mode) and found.st_mtime_ns < started:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError: a backup running now
                for stale in (entry.path, entry.path + "-journal"):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(stale)
        except BlockingIOError:
            pass
        finally:
            os.close(fd)


def _copy(journal: Path, partial: Path) -> None:
    """With no supervisor on it (no WAL) the journal is read as immutable, as the doctor reads it, or SQLite would
    leave a ``-wal`` and ``-shm`` beside it; a supervisor that opened it meanwhile: copied again, live.

    An immutable read trusts that nothing changes the file, so it counts only if nothing did. A supervisor still
    on the journal after it has a ``-wal``; one that opened it, checkpointed into it and closed it during the read
    (its ``-wal`` gone again) could tear the copy unseen by that look, but it wrote the file, which moves the file's
    modification and change times: its identity (inode, size, times) is taken before the ``-wal`` is looked for,
    and compared after. That session began after the look found no ``-wal``, so after every earlier write; its
    times equal the earlier ones only if it fits in their clock tick, SQLite's fsyncs between (and with Linux 6.13's
    fine-grained timestamps, a write after our ``stat`` always moves them)."""
    wal = journal.with_name(journal.name + "-wal")
    before = _identity(journal)
    if not wal.exists():
        _copy_once(journal, partial, immutable=True)
        if not wal.exists() and _identity(journal) == before:
            return
    _copy_once(journal, partial, immutable=False)


def _identity(path: Path) -> tuple[int, ...]:
    found = os.stat(path)
    return found.st_dev, found.st_ino, found.st_size, found.st_mtime_ns, found.st_ctime_ns


def _copy_once(journal: Path, partial: Path, *, immutable: bool) -> None:
    reader, target = Reader(journal, immutable=immutable), sqlite3.connect(partial)
    try:
        reader.copy_into(target, STEP_PAGES)
    finally:
        target.close()
        reader.close()


def _checked(partial: Path) -> int:
    """The copy's records, once SQLite's quick check passed it."""
    reader = Reader(partial, immutable=True)  # nothing else has it: no -wal or -shm made beside it
    try:
        if (result := reader.damage()) is not None:
            raise JournalError(f"the copy fails SQLite's quick check ({result}): the journal itself may be damaged")
        return reader.count()
    finally:
        reader.close()


def _reason(exc: Exception) -> str:
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
