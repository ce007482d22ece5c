"""The state's files: an exclusive lock, 0600 files opened without following links, a 0700 directory."""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
from pathlib import Path

from supervisor.journal.errors import JournalError, JournalLocked
from supervisor.journal.schema import SCHEMA_VERSION
from supervisor.layout import lock_file, reference_original, upgrade_original
from supervisor.processes.reach import grants


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


def locked(path: Path) -> bool:
    """Whether another process holds the lock ``lock`` takes at ``path``; changes nothing (for the doctor)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False  # no lock file yet (or not ours to read: check_private_files says so)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # shared, dropped at once: a serve starting now still locks
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def prepare_file(path: Path) -> None:
    """Create the journal 0600 without following links, or check the one that is there."""
    fd = _open_private(path, "journal")
    try:
        _refuse_shared(path, "journal", os.fstat(fd).st_mode)
    finally:
        os.close(fd)


def _refuse_shared(path: Path, what: str, mode: int) -> None:
    if mode & 0o077:
        raise JournalError(f"{what} {path} has mode {mode & 0o777:04o}; it must be 0600")


def restrict(path: Path) -> None:
    if path.exists() and not path.is_symlink():
        os.chmod(path, 0o600)


def prepare_directory(directory: Path, worker_ids: tuple[int, int] | None = None) -> int | None:
    """The state directory: 0700 when we create it; never a symlink, never group/world-writable.

    An existing one that others may list or enter (0755, a volume's usual mode) is made 0700 if it is ours,
    and its old mode returned (else None): the journal's companions and the workers' directories are in it.
    With workers of another user (``worker_ids``, WORKER_USER) it must be theirs to traverse and no one
    else's to change: search permission for group and others is added (0711: no listing, and the
    journal's files stay 0600 ours), it must not be owned by that user, and every directory above it
    must let that user through without letting it write there (or only where the sticky bit holds).
    """
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    mode = check_directory(directory, worker_ids)
    wanted = private_mode(worker_ids)
    target = (mode & 0o700) | (wanted & 0o077)  # the owner's bits are the owner's affair
    if mode == target:
        return None
    loosened = mode & 0o077 & ~wanted
    if loosened and os.lstat(directory).st_uid != os.geteuid():
        raise JournalError(
            f"state directory {directory} has mode {mode:04o} (others can list it) and is another user's:"
            f" chmod {wanted:o} it as its owner"
        )
    os.chmod(directory, target)
    return mode if loosened else None


def private_mode(worker_ids: tuple[int, int] | None) -> int:
    """What the state directory grants beyond its owner: nothing, or search for the workers' user."""
    return 0o700 | (0o011 if worker_ids is not None else 0)


def check_directory(directory: Path, worker_ids: tuple[int, int] | None = None) -> int:
    """``prepare_directory``'s refusals for a directory that exists, changing nothing; its mode bits."""
    info = os.lstat(directory)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise JournalError(f"state directory {directory} must be a directory, not a symlink")
    if info.st_mode & 0o022:
        raise JournalError(f"state directory {directory} is group- or world-writable (mode {info.st_mode & 0o777:04o})")
    if worker_ids is None:
        return stat.S_IMODE(info.st_mode)
    if info.st_uid == worker_ids[0]:
        raise JournalError(f"state directory {directory} is owned by the workers' user (uid {worker_ids[0]})")
    for above in directory.absolute().parents:
        where = os.stat(above)
        if not grants(where, worker_ids, 0o1):
            raise JournalError(f"the workers' user (uid {worker_ids[0]}) cannot traverse {above}, above the state")
        if grants(where, worker_ids, 0o2) and not where.st_mode & stat.S_ISVTX:
            raise JournalError(f"the workers' user (uid {worker_ids[0]}) can write to {above}, above the state")
    return stat.S_IMODE(info.st_mode)


def journal_companions(journal: Path) -> list[tuple[Path, str]]:
    """Every file beside the journal that we or SQLite open, with what to call it in a refusal."""
    name = journal.name
    places = [(journal, "journal"), (lock_file(journal), "lock file")]
    places += [(journal.with_name(name + suffix), "journal file") for suffix in ("-wal", "-shm")]
    places.append((reference_original(journal), "reference journal backup"))
    places += [(upgrade_original(journal, v), "journal backup") for v in range(1, SCHEMA_VERSION)]
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


def check_private_files(journal: Path) -> None:
    """Refuse the journal or a companion that others may read or write (lstat: nothing is opened).

    At start the journal is refused so, and the lock file, -wal and -shm are made 0600; between two
    starts any of them others can read gives away the jobs' records."""
    for path, what in journal_companions(journal):
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            continue
        _refuse_shared(path, what, mode)


def prepare_places(state: Path, names: tuple[str, ...], worker_ids: tuple[int, int] | None = None) -> None:
    """The workers' directories under the state directory (HOME, CrewAI storage, scratch): 0700 when we
    create them; a symlink or anything but a directory is refused, never followed. With workers of
    another user (``worker_ids``) each is handed to that user, with what it holds."""
    for name in names:
        path = state / name
        with contextlib.suppress(FileExistsError):
            path.mkdir(mode=0o700)
        mode = os.lstat(path).st_mode
        if not stat.S_ISDIR(mode):
            raise JournalError(f"state directory {path} is {_kind(mode)}, not a directory")
        if worker_ids is not None:
            _hand_over(path, worker_ids)


def _hand_over(path: Path, ids: tuple[int, int]) -> None:
    """``path`` and everything under it owned by ``ids``: what workers of another uid (or root's,
    before WORKER_USER was set) left there becomes writable by the workers now.

    No link is followed, even one swapped in while we walk: every change is made relative to a
    directory descriptor whose identity fwalk checked. A file with more than one link is left as it is:
    it may be a hard link a worker made to a file that is not the workers' to have.
    """
    os.chown(path, *ids, follow_symlinks=False)
    for _, directories, files, where in os.fwalk(path):
        for name in directories + files:
            info = os.stat(name, dir_fd=where, follow_symlinks=False)
            if (info.st_uid, info.st_gid) != ids and (stat.S_ISDIR(info.st_mode) or info.st_nlink == 1):
                os.chown(name, *ids, dir_fd=where, follow_symlinks=False)


def _kind(mode: int) -> str:
    kinds = {stat.S_ISLNK: "a symlink", stat.S_ISFIFO: "a FIFO", stat.S_ISSOCK: "a socket", stat.S_ISDIR: "a directory"}
    return next((kind for test, kind in kinds.items() if test(mode)), "a special file")
