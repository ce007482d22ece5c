"""The state's files: an exclusive lock, 0600 files opened without following links, a 0700 directory."""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
from pathlib import Path

from supervisor.journal.schema import SCHEMA_VERSION, JournalError


class JournalLocked(JournalError):
    pass


def _open_private(path: Path, what: str) -> int:
    """Open (creating it 0600) without following links; it must be a regular file."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise JournalError(f"cannot open {what} {path}: {exc.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise JournalError(f"{what} {path} is not a regular file")
    return fd


def lock(path: Path) -> int:
    """Exclusive, non-blocking: a second supervisor on the same state refuses to start."""
    fd = _open_private(path, "lock file")
    try:
        os.fchmod(fd, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise JournalLocked(f"journal {path.with_suffix('')} is in use by another supervisor") from None
    except BaseException:
        os.close(fd)
        raise
    return fd


def prepare_file(path: Path) -> None:
    """Create the journal 0600 without following links, or check the one that is there."""
    fd = _open_private(path, "journal")
    try:
        mode = os.fstat(fd).st_mode
        if mode & 0o077:
            raise JournalError(f"journal {path} has mode {mode & 0o777:04o}; it must be 0600")
    finally:
        os.close(fd)


def restrict(path: Path) -> None:
    if path.exists() and not path.is_symlink():
        os.chmod(path, 0o600)


def prepare_directory(directory: Path) -> None:
    """The state directory: 0700 when we create it; never a symlink, never group/world-writable."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = os.lstat(directory)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise JournalError(f"state directory {directory} must be a directory, not a symlink")
    if info.st_mode & 0o022:
        raise JournalError(f"state directory {directory} is group- or world-writable (mode {info.st_mode & 0o777:04o})")


def journal_companions(journal: Path) -> list[tuple[Path, str]]:
    """Every file beside the journal that we or SQLite open, with what to call it in a refusal."""
    name = journal.name
    places = [(journal, "journal"), (journal.with_name(name + ".lock"), "lock file")]
    places += [(journal.with_name(name + suffix), "journal file") for suffix in ("-wal", "-shm")]
    places.append((journal.with_name(name + ".reference.json"), "reference journal backup"))
    places += [(journal.with_name(f"{name}.v{v}.backup"), "journal backup") for v in range(1, SCHEMA_VERSION)]
    return places


def check_state_files(journal: Path) -> None:
    """Refuse, in one line, anything but a regular file where the journal or a companion will be opened.

    A FIFO would hang the open (or the reference-journal sniff) forever; a symlink would be followed by
    SQLite, which opens its -wal and -shm itself. Checked with lstat, so nothing is opened or followed.
    """
    for path, what in journal_companions(journal):
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(mode):
            raise JournalError(f"{what} {path} is {_kind(mode)}, not a regular file")


def prepare_places(state: Path, names: tuple[str, ...]) -> None:
    """The workers' directories under the state directory (HOME, CrewAI storage, scratch): 0700 when we
    create them; a symlink or anything but a directory is refused, never followed."""
    for name in names:
        path = state / name
        with contextlib.suppress(FileExistsError):
            path.mkdir(mode=0o700)
        mode = os.lstat(path).st_mode
        if not stat.S_ISDIR(mode):
            raise JournalError(f"state directory {path} is {_kind(mode)}, not a directory")


def _kind(mode: int) -> str:
    kinds = {stat.S_ISLNK: "a symlink", stat.S_ISFIFO: "a FIFO", stat.S_ISSOCK: "a socket", stat.S_ISDIR: "a directory"}
    return next((kind for test, kind in kinds.items() if test(mode)), "a special file")
