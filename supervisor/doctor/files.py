"""The deployment's files: the state directory, the journal's files, the token, and the journal's disk.

The refusals are the ones ``serve`` makes (``supervisor/journal/statefiles.py``, ``config.py``), called
without creating or changing anything; the doctor adds two of its own: a state directory others can
list, and one owned by another user than the one that runs it.
"""

from __future__ import annotations

import os
import shlex
import stat
import tempfile
from pathlib import Path

from protocol import Operation
from supervisor.config import PREFIX, Settings
from supervisor.doctor.findings import Finding, ok, problem, warning
from supervisor.journal.errors import JournalError
from supervisor.journal.reader import free_bytes, size_bytes
from supervisor.journal.statefiles import check_directory, check_private_files, check_state_files, locked, private_mode

MiB = 1024 * 1024


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
    return [_directory(journal.parent, settings.worker_ids), _journal(journal)]


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


def _journal(journal: Path) -> Finding:
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
    if locked(journal.with_name(journal.name + ".lock")):
        detail = f"{journal} is in use by another supervisor: serve would refuse to start on it"
        return problem("journal", detail, f"stop that supervisor, or give this one another {PREFIX}STATE_FILE")
    return ok("journal", f"{journal}: 0600, {size_bytes(journal) // MiB} MiB with its WAL")


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
    if settings.bearer_token_file:
        info = os.stat(settings.bearer_token_file)
        return ok(
            "token", f"{settings.bearer_token_file}: mode {stat.S_IMODE(info.st_mode):04o}, owned by uid {info.st_uid}"
        )
    if settings.bearer_token:
        return ok("token", f"from {PREFIX}BEARER_TOKEN")
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
