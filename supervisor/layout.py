"""The state directory's layout, named once. The journal (``STATE_FILE``) and beside it its lock file and the
originals an import or an upgrade keeps; the workers' places under the same directory: each crew's HOME and CrewAI
storage (named by a digest of its id: any id names a directory), the describing workers' TMPDIR, and a scratch
directory per job (its working directory, its own TMPDIR inside)."""

from __future__ import annotations

import hashlib
from pathlib import Path

JOURNAL = "journal.db"  # the journal's name where we choose it: an ephemeral state, the test harness, chaos
HOME, STORAGE, TMP, SCRATCH = "home", "storage", "tmp", "scratch"
WORKER_PLACES = (HOME, STORAGE, TMP, SCRATCH)  # made 0700 (the workers' user's) at start, the sandbox's to write
JOB_SCRATCH_PREFIX = "job-"  # of each job's scratch directory under SCRATCH


def lock_file(journal: Path) -> Path:
    """The journal's lock file: held by the supervisor that serves it, and a record of those that held it."""
    return journal.with_name(journal.name + ".lock")


def reference_original(journal: Path) -> Path:
    """Where a reference sidecar's journal is kept once imported."""
    return journal.with_name(journal.name + ".reference.json")


def crew_places(state: Path, crew_id: str) -> tuple[Path, Path]:
    """A crew's HOME and CrewAI storage, kept across its jobs."""
    place = hashlib.sha256(crew_id.encode()).hexdigest()[:24]
    return state / HOME / place, state / STORAGE / place


def job_tmp(scratch: Path) -> Path:
    """A job's TMPDIR, inside its scratch directory: removed with it."""
    return scratch / TMP


def upgrade_original(journal: Path, version: int) -> Path:
    """Where a journal of schema ``version`` is kept, whole, before it is upgraded."""
    return journal.with_name(f"{journal.name}.v{version}.backup")
