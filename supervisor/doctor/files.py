"""The deployment's files: the state directory, the journal's files and records, the token, and the journal's disk.

The refusals are the ones ``serve`` makes (``supervisor/journal/statefiles.py``, ``config.py``), called
without creating or changing anything; the doctor adds two of its own: a state directory others can
list, and one owned by another user than the one that runs it.
"""

from __future__ import annotations

import os
import shlex
import sqlite3
import stat
import tempfile
from pathlib import Path

from protocol import Operation
from supervisor.config import PREFIX, Settings
from supervisor.doctor.findings import Finding, live_doctor, ok, problem, warning
from supervisor.jobs.retention import iso
from supervisor.journal.errors import JournalError
from supervisor.journal.migrate import is_reference_journal
from supervisor.journal.reader import Reader, free_bytes, size_bytes
from supervisor.journal.schema import SCHEMA_VERSION
from supervisor.journal.statefiles import check_directory, check_private_files, check_state_files, locked, private_mode
from supervisor.layout import lock_file

MiB = 1024 * 1024
NAMED_RECORDS = 5  # of the records quarantined (and of those to be), named in the finding; all are counted
QUARANTINE_FIX = "read their rows in the journal's quarantined_* tables (docs/operating.md, quarantined records)"


def state(settings: Settings) -> list[Finding]:
    if not settings.state_file:
        return [
            warning(
                "journal",
                f"{PREFIX}ALLOW_EPHEMERAL: the journal is kept in a temporary directory and lost at every stop",
                f"set {PREFIX}STATE_FILE to a path on a volume for a deployment",
            )
        ]
    journal = Path(settings.state_file).absolute()  # as serve takes it
    found = [_directory(journal.parent, settings.worker_ids), _journal(journal, settings)]
    return [*found, *_records(journal, settings)] if _is_database(journal) else found


def _directory(directory: Path, worker_ids: tuple[int, int] | None) -> Finding:
    wanted = private_mode(worker_ids)  # as serve makes it
    quoted = shlex.quote(str(directory))
    if not os.path.lexists(directory):
        above = _existing(directory)
        if not os.access(above, os.W_OK | os.X_OK):
            detail = f"{directory} does not exist, and this user cannot create it in {above}"
            return problem("state", detail, f"mkdir -m 700 {quoted} as the user that serves")
        return ok("state", f"{directory} does not exist yet: serve makes it {wanted:04o}")
    try:
        mode = check_directory(directory, worker_ids)
    except JournalError as exc:
        fix = f"make it a directory (not a symlink) of the user that serves, mode {wanted:04o}"
        if worker_ids is not None:
            fix += f", in directories {PREFIX}WORKER_USER may traverse but not write (docs/security.md)"
        return problem("state", str(exc), fix)
    owner, me = os.lstat(directory).st_uid, os.geteuid()
    listed = f"{directory} has mode {mode:04o}: other users can list it"
    if mode & 0o077 & ~wanted:
        if owner != me:  # serve could not tighten it either, and refuses
            return problem("state", f"{listed}, and it is uid {owner}'s", f"chmod {wanted:o} {quoted} as its owner")
        return warning("state", f"{listed}; serve makes it {wanted:04o} when it starts", f"chmod {wanted:o} {quoted}")
    if owner != me:
        detail = f"{directory} is owned by uid {owner}, not by uid {me}, which runs this check"
        fix = f"run the doctor as the user that serves, or chown {me} {quoted}"
        # root can use it all the same, but would leave root's files in another user's directory
        return warning("state", detail, fix) if me == 0 else problem("state", detail, fix)
    return ok("state", f"{directory}: mode {mode:04o}, owned by uid {owner}")


def _journal(journal: Path, settings: Settings) -> Finding:
    try:
        check_state_files(journal)
    except JournalError as exc:
        return problem("journal", str(exc), "move it away: serve opens only regular files at these paths")
    try:
        check_private_files(journal)
    except JournalError as exc:
        # The journal's name begins every companion's.
        return problem("journal", str(exc), f"chmod 600 {shlex.quote(str(journal))}*")
    if not journal.exists():
        return ok("journal", f"{journal} does not exist yet: serve makes it 0600")
    if locked(lock_file(journal)):
        detail = f"{journal} is in use by another supervisor: serve would refuse to start on it"
        fix = f"stop that supervisor, or give this one another {PREFIX}STATE_FILE; to check the one that serves"
        return problem("journal", detail, f"{fix}: {live_doctor(settings.host, settings.port)}")
    return ok("journal", f"{journal}: 0600, {size_bytes(journal) // MiB} MiB with its WAL")


def _is_database(journal: Path) -> bool:
    """A journal file serve has made (a reference journal is imported at its first start)."""
    try:
        return stat.S_ISREG(os.lstat(journal).st_mode) and not is_reference_journal(journal)
    except (OSError, JournalError):  # said by the journal's own finding
        return False


def _records(journal: Path, settings: Settings) -> list[Finding]:
    """What serve's open would find in the journal's records: a file SQLite's quick check fails (serve refuses to
    start on it), the records quarantined at earlier opens, and those the next would quarantine; then its capacity.
    Changes nothing: a journal without a WAL (no supervisor has it open) is read as immutable, or SQLite would leave
    its ``-wal`` and ``-shm`` beside it; one a live supervisor writes is only read."""
    try:
        reader = Reader(journal, immutable=not journal.with_name(journal.name + "-wal").exists())
        try:
            return [_judge(journal, reader), _capacity(reader, settings)]
        finally:
            reader.close()
    except sqlite3.Error as exc:
        return [problem("records", f"{journal} cannot be read: {exc}", "restore the journal from a backup")]


def _capacity(reader: Reader, settings: Settings) -> Finding:
    """The journal's records and bytes against the limits admission holds them to, and its oldest record. Full, it
    is a warning only when retention is off: with it on, admission archives what is past the window first."""
    count, used, oldest = reader.count(), reader.used_bytes(), reader.oldest_admitted()
    window = settings.archive_after_seconds
    detail = (
        f"{count} of {settings.max_retained_runs} records ({PREFIX}MAX_RETAINED_RUNS), {used // MiB} of"
        f" {settings.max_state_bytes // MiB} MiB ({PREFIX}MAX_STATE_BYTES); oldest admitted "
        + (iso(oldest) if oldest is not None else "never: none held")
        + (f"; archived {window} s after they end" if window else f"; {PREFIX}ARCHIVE_AFTER_SECONDS=0: never archived")
    )
    if not window and (count >= settings.max_retained_runs or used >= settings.max_state_bytes):
        fix = (
            f"archive with `crew-supervisor archive --older-than DURATION --yes`, or set {PREFIX}ARCHIVE_AFTER_SECONDS"
        )
        return warning("capacity", f"{detail}: full, admission answers 507 to every start", fix)
    return ok("capacity", detail)


def _judge(journal: Path, reader: Reader) -> Finding:
    if (version := reader.schema_version()) > SCHEMA_VERSION:
        detail = f"{journal} has schema {version}, newer than this supervisor's ({SCHEMA_VERSION}): serve refuses it"
        return problem("records", detail, "serve it with the version that wrote it")
    if version < SCHEMA_VERSION:
        return ok("records", f"schema {version}: serve checks its records when it upgrades it to {SCHEMA_VERSION}")
    if (result := reader.damage()) is not None:
        detail = f"{journal} fails SQLite's integrity check ({result}): serve refuses to start on it"
        return problem("records", detail, "restore the journal from a backup (docs/operating.md)")
    count, named = reader.quarantine(NAMED_RECORDS)
    upcoming: dict[str, str] = {}
    for action_id, found in reader.inconsistent():
        upcoming.setdefault(action_id, found)
    said = []
    if count:
        said.append(f"{count} quarantined, kept aside with their action ids taken: {_named(named, count)}")
    if upcoming:
        first = list(upcoming.items())[:NAMED_RECORDS]
        said.append(f"{len(upcoming)} inconsistent, quarantined at serve's next start: {_named(first, len(upcoming))}")
    if not said:
        return ok("records", f"{reader.count()} records, none quarantined or inconsistent")
    return warning("records", "; ".join(said), QUARANTINE_FIX)


def _named(records: list[tuple[str, str]], count: int) -> str:
    names = ", ".join(f"{action_id!r} ({found})" for action_id, found in records)
    return names + (f" and {count - len(records)} more" if count > len(records) else "")


def token_and_training(settings: Settings) -> list[Finding]:
    """The token and, when train is allowed, TRAINING_DIR: ``config.load`` has refused them already if
    they were wrong; this says what they are."""
    found = [_token(settings)]
    if Operation.TRAIN in settings.allowed_operations:
        info = os.lstat(settings.training_dir)
        found.append(
            ok(
                "training",
                f"{settings.training_dir}: mode {stat.S_IMODE(info.st_mode):04o}, owned by uid {info.st_uid}",
            )
        )
    return found


def _token(settings: Settings) -> Finding:
    """Where each role's tokens come from: how many a file holds, its mode and owner (never a token)."""
    said = [f"from {PREFIX}BEARER_TOKEN"] if settings.bearer_token else []
    for role, path in settings.token_files.items():
        info, count = os.stat(path), len(settings.tokens.get(role, ()))
        mode = f"mode {stat.S_IMODE(info.st_mode):04o}, owned by uid {info.st_uid}"
        said.append(f"{path}: {mode}, {count} {role} token{'s' * (count != 1)}")
    if said:
        return ok("token", "; ".join(said))
    return warning(
        "token",
        f"none ({PREFIX}ALLOW_UNAUTHENTICATED): whoever reaches the port can start jobs",
        f"set {PREFIX}BEARER_TOKEN_FILE to a 0600 file holding the token",
    )


def disk(settings: Settings) -> Finding:
    """Free space where the journal lives, against MIN_FREE_DISK_MB (below it admission answers 507) and
    the room the journal may still take (MAX_STATE_BYTES)."""
    journal = Path(settings.state_file).absolute() if settings.state_file else None  # None: ephemeral
    where = _existing(journal.parent) if journal is not None else Path(tempfile.gettempdir())
    free, floor = free_bytes(where), settings.min_free_disk_mb * MiB
    if free < floor:
        return problem(
            "disk",
            f"{free // MiB} MiB free under {where}, below {PREFIX}MIN_FREE_DISK_MB ({settings.min_free_disk_mb}):"
            " admission would answer 507 to every start",
            f"free space on that filesystem, or lower {PREFIX}MIN_FREE_DISK_MB",
        )
    size = size_bytes(journal) if journal is not None else 0
    if free - floor < settings.max_state_bytes - size:
        return warning(
            "disk",
            f"{free // MiB} MiB free under {where}, of which {PREFIX}MIN_FREE_DISK_MB keeps"
            f" {settings.min_free_disk_mb}: the journal may grow by {(settings.max_state_bytes - size) // MiB} MiB"
            f" ({PREFIX}MAX_STATE_BYTES), so the disk fills first and admission answers 507 before the limit",
            f"free space, or lower {PREFIX}MAX_STATE_BYTES to at most {(size + free - floor) // MiB} MiB",
        )
    return ok(
        "disk",
        f"{free // MiB} MiB free under {where}: room for {PREFIX}MAX_STATE_BYTES"
        f" ({settings.max_state_bytes // MiB} MiB) and {PREFIX}MIN_FREE_DISK_MB ({settings.min_free_disk_mb})",
    )


def _existing(path: Path) -> Path:
    """``path``, or the nearest directory above it that exists: where it would be made."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path
