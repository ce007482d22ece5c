"""``crew-supervisor backup FILE``: the journal copied while the supervisor serves (``journal/backup.py``).
``DESCRIPTION`` and ``EXIT_CODES`` are its ``--help``."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from supervisor.config import PREFIX, flag

DESCRIPTION = f"""\
Copy the journal to FILE while the supervisor serves: SQLite's online backup,
the journal as it was at one instant (what had committed), read beside the
supervisor without its lock and without holding up its writes. FILE is made
0600, checked with SQLite's quick check, and put in place whole; the number of
job records it holds is printed. An existing FILE is refused unless --force.

The journal is {PREFIX}STATE_FILE (or --state-file), as serve takes it: run it
as the user that serves. docs/operating.md ("Backup and restore") says how to
restore the copy."""
EXIT_CODES = ((0, "copied and checked"), (1, "no copy made: one line says why"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", type=Path, help="where the copy goes (not beside the journal's own files)")
    parser.add_argument("--force", action="store_true", help="replace FILE if it exists (an earlier copy)")
    parser.add_argument(flag("STATE_FILE"), dest="state_file", help=f"the journal [{PREFIX}STATE_FILE]")


def run(args: argparse.Namespace) -> int | str:
    from supervisor.journal.backup import backup
    from supervisor.journal.errors import JournalError

    journal = args.state_file or os.environ.get(PREFIX + "STATE_FILE")
    if not journal:
        return f"crew-supervisor backup: no journal: set {PREFIX}STATE_FILE (or --state-file) as serve has it"
    try:
        copied = backup(Path(journal), args.file, force=args.force)
    except JournalError as exc:
        return f"crew-supervisor backup: {exc}"
    print(f"backed up {journal} to {copied.path}: {copied.records} job records, {copied.size} bytes, quick_check ok")
    return 0
