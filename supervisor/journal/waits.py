"""Writes waiting for another process's lock or for disk space, on the journal's writer thread: which of them give
up when, and the wait logged every ``LOG_EVERY_SECONDS`` (``supervisor.journal.writer`` says when each waits)."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import math
import os
import sqlite3
import time
from collections.abc import Callable
from typing import Any

from supervisor.journal.errors import JournalBusy, JournalError

log = logging.getLogger("crew_supervisor.journal")
LOG_EVERY_SECONDS = 5.0


@dataclasses.dataclass(eq=False)
class Write:
    """One write queued for the writer thread, and what becomes of it while it waits."""

    apply: Callable[[sqlite3.Connection], Any]  # runs on the writer thread, inside a transaction
    fallback: Callable[[sqlite3.Connection], Any] | None  # tried instead if ``apply`` fails
    durable: bool  # committed with an fsync (``synchronous=FULL``), else ``NORMAL``
    deadline: float  # monotonic; past it a write still waiting for the lock fails (inf: never)
    future: concurrent.futures.Future[Any]
    touched: frozenset[str] = frozenset()  # the jobs whose events it writes: their readers look again


class Waits:
    """Writes waiting for another process's lock or for disk space: which give up when, and the wait logged."""

    def __init__(self, directory: str) -> None:
        self.directory = directory  # the journal's: where space is looked for
        self.close_at = math.inf  # set once the close is taken in: then every wait ends after its grace
        self.stop_at = math.inf  # set by ``Writer.stop_waiting``
        self.busy_since: float | None = None
        self.full_since: float | None = None
        self._logged = 0.0  # when the current wait was last logged

    @property
    def closing(self) -> bool:
        return self.close_at < math.inf

    def _over(self, now: float) -> bool:
        return now >= min(self.close_at, self.stop_at)

    def busy(self, pending: list[Write]) -> list[Write]:
        """The lock is held: fail the writes whose patience ran out; the others wait on, and the wait is logged."""
        now = time.monotonic()
        waiting = []
        for write in pending:
            if now >= write.deadline or self._over(now):
                write.future.set_exception(JournalBusy("the journal's write lock is held by another process"))
            else:
                waiting.append(write)
        if not waiting:
            self.busy_since = None
        elif self.busy_since is None:
            self.busy_since = self._logged = now
        elif now - self._logged >= LOG_EVERY_SECONDS:
            self._logged = now
            log.warning(
                "journal write lock held by another process for %.1f s; %d write(s) waiting",
                now - self.busy_since,
                len(waiting),
            )
        return waiting

    def lock_taken(self) -> None:
        if self.busy_since is not None:
            log.warning("journal write lock free again after %.1f s", time.monotonic() - self.busy_since)
            self.busy_since = None

    def full(self, pending: list[Write], exc: sqlite3.Error) -> list[Write]:
        """The disk is full: fail the writes with a deadline (and all once past the close's grace), keep the
        rest, each in its smaller form if it has one, to try again once space may have been freed."""
        now = time.monotonic()
        error = JournalError(f"journal write failed: {exc}")
        waiting = []
        for write in pending:
            if write.deadline < math.inf or self._over(now):
                write.future.set_exception(error)
                continue
            if write.fallback is not None:
                write.apply, write.fallback = write.fallback, None
            waiting.append(write)
        if self.full_since is None:
            self.full_since = self._logged = now
            log.error("journal disk full (%s); %d write(s) wait for space", exc, len(waiting))
        elif now - self._logged >= LOG_EVERY_SECONDS:
            self._logged = now
            log.error("journal disk full for %.1f s; %d write(s) wait for space", now - self.full_since, len(waiting))
        return waiting

    def out_of_disk(self, db: sqlite3.Connection, exc: sqlite3.Error) -> bool:
        """``SQLITE_FULL`` from the disk, not from the journal's own ceiling (``max_page_count``): the disk
        has less room than the pages SQLite would still allow."""
        # ENOSPC surfaces as SQLITE_FULL, or as an I/O error where the kernel reports it late (at fsync,
        # growing the shared-memory file): either counts when the disk is what lacks room.
        if getattr(exc, "sqlite_errorcode", 0) & 0xFF not in (sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR):
            return False
        try:
            count, ceiling, size = (
                int(db.execute(f"PRAGMA {name}").fetchone()[0])
                for name in ("page_count", "max_page_count", "page_size")
            )
            disk = os.statvfs(self.directory)
        except (OSError, sqlite3.Error):  # cannot tell: fail the writes as any other error would
            return False
        return disk.f_bavail * disk.f_frsize < (ceiling - count) * size

    def committed(self) -> None:
        if self.full_since is not None:
            log.warning("journal disk writable again after %.1f s", time.monotonic() - self.full_since)
            self.full_since = None
