"""The facade's reads (``Supervisor.reads``): what it answers of its jobs without changing one, from the journal and
from the jobs live here, so that HTTP reaches neither."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from protocol import Limit, Operation
from supervisor.enums import Phase, Readiness, Status
from supervisor.jobs import stacks
from supervisor.jobs.live import LiveJob
from supervisor.jobs.outcomes import bounded
from supervisor.jobs.parts import Parts
from supervisor.jobs.retention import Retention
from supervisor.jobs.roster import Roster
from supervisor.jobs.tracing import Tracing
from supervisor.jobs.worker_view import LAST_LINE_CHARS, workers
from supervisor.journal.reader import Reader
from supervisor.journal.records import EffectRecord, Event, Job, StoredEvent, Streams
from supervisor.settings_table import TRACE_ID

CONTROL_OPERATIONS = ("status", "events", "cancel")
NOTHING_CAPTURED = Streams("", "", 0, 0)
EVENTS_PER_READ = 256
# A stream's batch is written whole: bounded in bytes too, so a follower that stops reading holds one batch
# (and the connection's send timeout drops it), not 256 events of up to MAX_EVENT_BYTES each.
BATCH_BYTES = 256 * 1024


class Reads:
    def __init__(
        self,
        parts: Parts,
        roster: Roster[LiveJob],
        reader: Reader,
        crews: list[str],
        instance: str,
        retention: Retention,
        tracing: Tracing,
    ) -> None:
        """``instance``: this life of the supervisor (a restart changes it)."""
        self.parts, self.reader, self.crews, self.instance = parts, reader, crews, instance
        self.retention, self.tracing = retention, tracing
        self.settings, self.roster = parts.settings, roster

    @property
    def draining(self) -> bool:
        """From a drain's start (or a stop's) to the end: new starts answer 503."""
        return not self.parts.lifecycle().admits

    def health(self) -> dict[str, Any]:
        """What ``/health`` answers (``http/contract.py`` says why each key is there)."""
        settings, parts = self.settings, self.parts
        operations: set[str] = {*settings.allowed_operations, *CONTROL_OPERATIONS}
        return {
            "status": Readiness.DRAINING if self.draining else Readiness.READY,
            "crews": sorted(self.crews),
            "active_runs": len(self.roster),
            "retained_runs": self.reader.count(),
            "max_retained_runs": settings.max_retained_runs,
            "durable_journal": bool(settings.state_file),
            "stream_checkpoint_events": settings.stream_checkpoint_events,
            "operations": sorted(operations),
            "training_directory": bool(settings.training_dir),
            "instance": self.instance,
            "launcher": parts.launcher.name,
            **parts.launcher.health(),
            **parts.limits.health(),
            "sandbox": parts.sandbox.health(),
            "crew_max_concurrency": parts.slots.bounds(self.crews),  # each served crew's own bound, where it has one
            "llm_budget": {  # per job (0: none); a crew's own where its registry entry asks for less
                Limit.MAX_TOKENS: settings.worker_max_tokens,
                Limit.MAX_LLM_CALLS: settings.worker_max_llm_calls,
                "crews": parts.crew_budgets(),
            },
            "retention": self.retention.health(),
            "tracing": {"exporter": self.tracing.exporter, "trace_ui_url": settings.trace_ui_url or None},
        }

    def job(self, action_id: str) -> Job | None:
        return self.reader.get(action_id)

    def trace_of(self, action_id: str) -> dict[str, str | None]:
        """A job's trace, as its view gives it: its id (None: not traced), and its page in the trace UI
        (``TRACE_UI_URL``, the id in place of ``{trace_id}``; None without one)."""
        trace = self.reader.trace(action_id)
        url = self.settings.trace_ui_url
        trace_id = trace[0] if trace is not None else None
        return {"trace_id": trace_id, "trace_url": url.replace(TRACE_ID, trace_id) if trace_id and url else None}

    def quarantined(self, action_id: str) -> str | None:
        """What was wrong with the record of ``action_id`` if it was quarantined (``journal/quarantine.py``)."""
        return self.reader.quarantined(action_id)

    def output(self, action_id: str) -> dict[str, Any] | None:
        """A completed job's output."""
        return self.reader.output(action_id)

    def effects(self, action_id: str) -> tuple[list[EffectRecord], int]:
        """A job's effect ledger (its calls, ``running`` while they run) and how many of its tasks completed."""
        return self.reader.effects(action_id), self.reader.tasks_completed(action_id)

    def last_event(self, action_id: str) -> Event | None:
        return self.reader.last_event(action_id)

    def events(self, action_id: str, cursor: int, limit: int, max_bytes: int) -> list[StoredEvent]:
        """A page of a job's events from ``cursor``, their data as stored (``Reader.stored_events``)."""
        return self.reader.stored_events(action_id, cursor, limit, max_bytes)

    def follow(self, action_id: str, cursor: int) -> AsyncIterator[list[StoredEvent] | None]:
        """A job's events from ``cursor`` through its terminal one as they commit; None at each idle heartbeat."""
        return follow(self.reader, self.roster, action_id, cursor, self.settings.heartbeat_seconds)

    def list_jobs(
        self,
        status: Status | None,
        phase: Phase | None,
        crew_id: str | None,
        operation: Operation | None,
        before: tuple[float, str] | None,
        limit: int,
    ) -> list[dict[str, Any]]:
        """Up to ``limit`` rows, newest first (``Reader.list_jobs``), each with the job's ``phase`` beside its
        status, which ``phase`` filters on, and a failed job's message cut to LAST_LINE_CHARS (its record has it
        whole)."""
        among = None if phase is None else self.roster.in_phase(phase)
        rows = self.reader.list_jobs(status, crew_id, operation, before, limit, among)
        return [
            {**row, "message": _short(row["message"]), "phase": self.phase_of(row["action_id"], row["status"])}
            for row in rows
        ]

    def phase_of(self, action_id: str, status: str) -> Phase | None:
        """Where a job of ``status`` running (as the journal says) is: queued, launching, running or settling; None
        once it has ended (its terminal event may commit a moment before it leaves the roster)."""
        job = self.roster.get(action_id) if status == Status.RUNNING else None
        return job.phase if job is not None and job.phase is not Phase.SETTLED else None

    def spent_of(self, action_id: str, status: str) -> dict[str, Any] | None:
        """A running job's LLM spend so far (tokens, calls, the last call's model); None once it has ended: its
        output's ``token_usage``, or its terminal's evidence, says it then."""
        job = self.roster.get(action_id) if status == Status.RUNNING else None
        return job.spent.summary() if job is not None else None

    async def workers(self) -> list[dict[str, Any]]:
        """Each live job's worker as ``/workers`` shows it (``jobs/worker_view.py``), oldest first."""
        return await workers(self.roster, self.parts.limits, self.parts.slots)

    def captured(self, action_id: str) -> tuple[bool, Streams]:
        """Whether the job is live, and what its worker wrote: live from its tails while it runs, from the journal
        once it has settled. Raises LookupError (no such job)."""
        live = self.roster.get(action_id)
        if live is not None:
            worker = live.worker
            return True, Streams.of(worker.stdout, worker.stderr, live.secrets) if worker else NOTHING_CAPTURED
        if self.reader.get(action_id) is None:
            raise LookupError(action_id)
        # A job that never launched, or settled before this table existed, captured nothing.
        return False, self.reader.streams(action_id) or NOTHING_CAPTURED

    async def stacks_of(self, action_id: str) -> dict[str, Any]:
        """Every thread's stack of a running job, now; or of an ended one, those taken just before its timeout's,
        cancel's or limit's kill. Raises LookupError (no such job), ``stacks.Unavailable`` or ``stacks.Late``."""
        job = self.roster.get(action_id)
        if job is not None:
            return {"action_id": action_id, "status": Status.RUNNING, **await job.stacks()}
        record = self.reader.get(action_id)
        if record is None:
            raise LookupError(action_id)
        kept = self.reader.stack(action_id)
        if kept is None:
            raise stacks.Unavailable(
                f"the job {record.status}, and no stack was taken: only a timeout, a cancel or a broken limit keeps"
                " where a running job was before its kill"
            )
        return {"action_id": action_id, "status": record.status, **kept}

    def links(self, action_id: str) -> dict[str, str | None]:
        """A job's resume links, as its record says them: the job it continues and the job that continues it."""
        return {"resumed_from": self.reader.resumed_from(action_id), "resumed_by": self.reader.resumed_by(action_id)}


async def follow(
    reader: Reader, roster: Roster[LiveJob], action_id: str, cursor: int, heartbeat: float
) -> AsyncIterator[list[StoredEvent] | None]:
    """Events from ``cursor`` through the terminal one, in batches as they commit (one write per batch, not per
    event; at most EVENTS_PER_READ events and BATCH_BYTES of data, or one event larger than that), their data as
    stored; None whenever ``heartbeat`` passes idle. Each commit of the job's events wakes it (``Roster.wake``)."""
    while True:
        job = roster.get(action_id)
        changed = job.changed if job is not None else None  # taken before reading: no lost wake-up
        events = reader.stored_events(action_id, cursor, EVENTS_PER_READ, BATCH_BYTES)
        terminal = next((i for i, event in enumerate(events) if event.terminal), None)
        if terminal is not None:
            yield events[: terminal + 1]
            return
        if events:
            yield events
            cursor = events[-1].sequence + 1
            continue
        if changed is None:
            return
        try:
            await asyncio.wait_for(changed.wait(), heartbeat)
        except TimeoutError:
            yield None


def _short(message: str | None) -> str | None:
    return None if message is None else bounded(str(message), LAST_LINE_CHARS)
