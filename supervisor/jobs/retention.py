"""Retention: a record is archived once it ended more than ARCHIVE_AFTER_SECONDS ago (0: never by itself), as
``DELETE /jobs/{id}`` archives one (``Journal.archive``). Three ways: a sweep on the serving loop, admission when the
journal is full (``make_room``, before it answers 507), and the operator's bulk archive (``archive``, which names its
own age). A running record is never archived, nor one whose job is still live here (its terminal event committed a
moment before it leaves the roster).

Each archives at most ``BATCH`` records in one write, awaited before the next: the journal's one writer commits the
events of running jobs between two batches, never behind a long delete.

The sweep sleeps until the oldest ended record is due (or, with none, for the window: nothing can be due sooner), at
most ``LONGEST_SLEEP`` (a wall-clock jump is caught up within it), so an idle supervisor wakes for almost nothing; and
at least a tenth of the window, from 1 s to ``SWEEP_EVERY``, so that steady traffic is archived a batch a minute
(one log line), not a record a second: a record is kept up to that much past the window.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import time
from collections.abc import Callable, Collection
from typing import Any

from supervisor.config import PREFIX, Settings
from supervisor.enums import Status
from supervisor.jobs.live import LiveJob
from supervisor.jobs.roster import Roster
from supervisor.journal.errors import JournalError
from supervisor.journal.store import Journal
from supervisor.models import BulkArchiveRequest

log = logging.getLogger("crew_supervisor.jobs")
BATCH = 100  # records one write archives
ROOM_BATCHES = 10  # batches admission archives at most before it answers 507 (the byte limit may need several)
LONGEST_SLEEP = 3600.0
SWEEP_EVERY = 60.0  # the longest the sweep waits after the window, between two sweeps
RETRY_SECONDS = 30.0  # after a sweep the journal refused (another process's lock, a full disk)


class Retention:
    def __init__(self, settings: Settings, journal: Journal, roster: Roster[LiveJob]) -> None:
        self.window = settings.archive_after_seconds  # 0: off
        self.journal = journal
        self.roster = roster
        self._task: asyncio.Task[None] | None = None
        self._room = asyncio.Lock()  # one admission makes room at a time; the others then find it made
        self._pause = min(max(self.window / 10, 1.0), SWEEP_EVERY)  # the shortest sleep between two sweeps

    def start(self) -> None:
        if self.window:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="retention")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def health(self) -> dict[str, Any]:
        """``/health``'s ``retention``: the window, when the oldest record still held was admitted (ISO 8601, UTC),
        and how many ended records are past the window (0 with retention off)."""
        oldest = self.journal.reader.oldest_admitted()
        archivable = self.journal.reader.ended_before(time.time() - self.window, 0)[1] if self.window else 0
        return {
            "archive_after_seconds": self.window,
            "oldest_retained_at": None if oldest is None else iso(oldest),
            "archivable": archivable,
        }

    async def make_room(self, full: Callable[[], object]) -> None:
        """Archive the records longest past the window, a batch at a time, while ``full()`` (the journal holds its
        limit of records or bytes) and some are."""
        if not (self.window and full()):
            return
        async with self._room:
            for _ in range(ROOM_BATCHES):
                if not full() or not await self._archive_due(BATCH):
                    return

    def advice(self, limit: str) -> str:
        """What a 507 for a full journal says to do: the records past the window are archived already."""
        kept = (
            f"none ended more than {PREFIX}ARCHIVE_AFTER_SECONDS={self.window} ago"
            if self.window
            else f"retention is off ({PREFIX}ARCHIVE_AFTER_SECONDS=0)"
        )
        return f"{kept}; archive with `crew-supervisor archive --older-than DURATION --yes`, or raise {PREFIX}{limit}"

    async def archive(
        self, older_than: float, limit: int, statuses: Collection[Status] | None, crew_id: str | None, dry_run: bool
    ) -> tuple[list[str], int]:
        """The operator's: up to ``limit`` records of ``statuses`` and ``crew_id`` that ended more than ``older_than``
        seconds ago, oldest end first, archived (``dry_run``: only named); those archived, and how many more match."""
        named, matching = self._chosen(time.time() - older_than, limit, statuses, crew_id)
        if dry_run:
            return named, matching - len(named)
        archived = []
        for start in range(0, len(named), BATCH):
            archived += await self.journal.archive(*named[start : start + BATCH])
        return archived, matching - len(named)

    def _chosen(
        self, end: float, limit: int, statuses: Collection[Status] | None = None, crew_id: str | None = None
    ) -> tuple[list[str], int]:
        """The first ``limit`` records that ended before ``end`` and whose job is not live here, and how many match."""
        ids, matching = self.journal.reader.ended_before(end, limit + len(self.roster), statuses, crew_id)
        kept = [action_id for action_id in ids if action_id not in self.roster]
        return kept[:limit], matching - (len(ids) - len(kept))

    async def _archive_due(self, limit: int) -> int:
        """Archive up to ``limit`` records past the window; how many were."""
        due, _ = self._chosen(time.time() - self.window, limit)
        return len(await self.journal.archive(*due)) if due else 0

    async def _run(self) -> None:
        while True:
            try:
                archived = await self._sweep()
            except JournalError as exc:
                log.warning("retention could not archive (tried again in %gs): %s", RETRY_SECONDS, exc)
                await asyncio.sleep(RETRY_SECONDS)
                continue
            if archived:
                log.info("retention archived %d record(s) ended more than %ds ago", archived, self.window)
            await asyncio.sleep(self._until_due())

    async def _sweep(self) -> int:
        archived = 0
        while batch := await self._archive_due(BATCH):
            archived += batch
        return archived

    def _until_due(self) -> float:
        """Seconds until the oldest ended record is past the window (a live one's, once it leaves the roster, soon)."""
        ids, _ = self.journal.reader.ended_before(float("inf"), 1)
        job = self.journal.reader.get(ids[0]) if ids else None
        if job is None:
            return min(float(self.window), LONGEST_SLEEP)
        end = job.ended_at if job.ended_at is not None else job.admitted_at
        if end is None:  # never of a record the journal read (it keeps each one's admission): due at once
            return self._pause
        return min(max(end + self.window - time.time(), self._pause), LONGEST_SLEEP)


def iso(seconds: float) -> str:
    """Unix seconds as ISO 8601 in UTC, to the second."""
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).isoformat(timespec="seconds")


class Archives:
    """The facade's archives (``Supervisor.archives``): one record, as ``DELETE /jobs/{id}`` asks, or many."""

    def __init__(self, journal: Journal, retention: Retention) -> None:
        self.journal = journal
        self.retention = retention

    async def archive(self, action_id: str) -> None:
        """Remove an ended job from the journal; raises ``JournalBusy`` or ``JournalError``."""
        await self.journal.archive(action_id)

    async def archive_many(self, request: BulkArchiveRequest) -> tuple[list[str], int]:
        """Archive the ended records ``request`` names, oldest end first and at most its ``limit`` (``dry_run``: none
        touched): their ids, and how many more matched (``Retention.archive``). Raises ``JournalBusy`` or
        ``JournalError``."""
        return await self.retention.archive(
            request.older_than_seconds, request.limit, request.status, request.crew_id, request.dry_run
        )
