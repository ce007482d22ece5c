"""The facade's reads (``Supervisor`` is one): what it answers of its jobs without changing one, from the journal
and from the jobs live here, so that HTTP reaches neither."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from supervisor.config import Settings
from supervisor.enums import Lifecycle, Phase, Status
from supervisor.jobs import stacks
from supervisor.jobs.live import LiveJob
from supervisor.jobs.outcomes import bounded
from supervisor.jobs.recorder import Recorder
from supervisor.jobs.relay import Relay
from supervisor.jobs.retention import Retention
from supervisor.jobs.sandbox import Sandbox
from supervisor.jobs.slots import Slots
from supervisor.jobs.tracing import Tracing
from supervisor.jobs.worker_view import LAST_LINE_CHARS, workers
from supervisor.journal.reader import Reader
from supervisor.journal.records import EffectRecord, Event, Job, StoredEvent, Streams
from supervisor.processes.launcher import Launcher
from supervisor.processes.limits import Limits
from supervisor.settings_table import TRACE_ID

CONTROL_OPERATIONS = ("status", "events", "cancel")
NOTHING_CAPTURED = Streams("", "", 0, 0)


class Reads:
    settings: Settings
    crews: list[str]
    budgets: dict[str, dict[str, int]]
    instance: str
    live: dict[str, LiveJob]
    reader: Reader
    recorder: Recorder
    relay: Relay
    launcher: Launcher
    limits: Limits
    sandbox: Sandbox
    slots: Slots
    retention: Retention
    tracing: Tracing

    lifecycle: Lifecycle

    @property
    def draining(self) -> bool:
        """From a drain's start (or a stop's) to the end: new starts answer 503."""
        return not self.lifecycle.admits

    def health(self) -> dict[str, Any]:
        """What ``/health`` answers (``http/contract.py`` says why each key is there)."""
        settings = self.settings
        operations: set[str] = {*settings.allowed_operations, *CONTROL_OPERATIONS}
        return {
            "status": "draining" if self.draining else "ready",
            "crews": sorted(self.crews),
            "active_runs": len(self.live),
            "retained_runs": self.reader.count(),
            "max_retained_runs": settings.max_retained_runs,
            "durable_journal": bool(settings.state_file),
            "stream_checkpoint_events": settings.stream_checkpoint_events,
            "operations": sorted(operations),
            "training_directory": bool(settings.training_dir),
            "instance": self.instance,
            "launcher": self.launcher.name,
            **self.launcher.health(),
            **self.limits.health(),
            "sandbox": self.sandbox.health(),
            "crew_max_concurrency": self.slots.bounds(self.crews),  # each served crew's own bound, where it has one
            "llm_budget": {  # per job (0: none); a crew's own where its registry entry asks for less
                "max_tokens": settings.worker_max_tokens,
                "max_llm_calls": settings.worker_max_llm_calls,
                "crews": self.budgets,
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
        return self.recorder.follow(action_id, cursor, self.settings.heartbeat_seconds)

    def list_jobs(
        self,
        status: str | None,
        phase: str | None,
        crew_id: str | None,
        operation: str | None,
        before: tuple[float, str] | None,
        limit: int,
    ) -> list[dict[str, Any]]:
        """Up to ``limit`` rows, newest first (``Reader.list_jobs``), each with the job's ``phase`` beside its
        status, which ``phase`` filters on, and a failed job's message cut to LAST_LINE_CHARS (its record has it
        whole)."""
        among = None if phase is None else [job.action_id for job in self.live.values() if job.phase == phase]
        rows = self.reader.list_jobs(status, crew_id, operation, before, limit, among)
        return [
            {**row, "message": _short(row["message"]), "phase": self.phase_of(row["action_id"], row["status"])}
            for row in rows
        ]

    def phase_of(self, action_id: str, status: str) -> Phase | None:
        """Where a job of ``status`` running (as the journal says) is: queued, launching, running or settling; None
        once it has ended (its terminal event may commit a moment before it leaves ``live``)."""
        job = self.live.get(action_id) if status == Status.RUNNING else None
        return job.phase if job is not None and job.phase is not Phase.SETTLED else None

    def spent_of(self, action_id: str, status: str) -> dict[str, Any] | None:
        """A running job's LLM spend so far (tokens, calls, the last call's model); None once it has ended: its
        output's ``token_usage``, or its terminal's evidence, says it then."""
        job = self.live.get(action_id) if status == Status.RUNNING else None
        return job.spent.summary() if job is not None else None

    async def workers(self) -> list[dict[str, Any]]:
        """Each live job's worker as ``/workers`` shows it (``jobs/worker_view.py``), oldest first."""
        return await workers(self.live, self.limits, self.slots)

    def captured(self, action_id: str) -> tuple[bool, Streams]:
        """Whether the job is live, and what its worker wrote: live from its tails while it runs, from the journal
        once it has settled. Raises LookupError (no such job)."""
        live = self.live.get(action_id)
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
        job = self.live.get(action_id)
        if job is not None:
            return {"action_id": action_id, "status": Status.RUNNING, **await self.relay.stacks(job)}
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


def _short(message: str | None) -> str | None:
    return None if message is None else bounded(str(message), LAST_LINE_CHARS)
