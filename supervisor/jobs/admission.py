"""Admission: validate, fence, admit. A start is checked in the reference's order, fenced by its request
hash, and made durable before any work; each refusal is a typed error.

No HTTP here: the app answers each kind of ``Refused`` with its status.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import orjson

from protocol import MAX_RESUMED_BYTES, Operation
from supervisor.config import Settings
from supervisor.enums import Lifecycle, Status
from supervisor.escaping import ident
from supervisor.jobs.crew_disk import CrewDisk
from supervisor.jobs.retention import Retention
from supervisor.jobs.runner import Runner
from supervisor.jobs.tracing import JobTrace, Refusal, Tracing
from supervisor.journal.errors import JournalBusy, JournalError
from supervisor.journal.records import Job, TaskRecord
from supervisor.journal.store import Journal
from supervisor.models import InputError, StartRequest, input_too_large, key_problem, request_hash, validate_input
from supervisor.settings_table import MiB


class Refused(Exception):
    """A start the contract refuses; the HTTP side answers each kind with the reference's status."""


class ShuttingDown(Refused):
    """The supervisor is draining."""


class InputTooLarge(Refused):
    """Input over 1 MiB of compact JSON."""


class WrongRoute(Refused):
    """A legacy ``/runs`` route asked for another operation than ``run``."""


class OperationDisabled(Refused):
    """The operation is not in ``ALLOWED_OPERATIONS``."""


class KeyMissing(Refused):
    """No Idempotency-Key, or a blank one."""


class KeyInvalid(Refused):
    """An Idempotency-Key too long or with control characters."""


class InputInvalid(Refused):
    """The operation's input breaks its schema."""


class CrewNotFound(Refused):
    """No such crew in the registry."""


class ConflictingReuse(Refused):
    """The action id was admitted with other request material."""


class ResumeUnknown(Refused):
    """A resume names a job the journal does not hold (never admitted, archived, or quarantined)."""


class NotResumable(Refused):
    """The job a resume names cannot be continued: it runs, it completed, it is no ``run``, it was resumed, its
    input was not kept, or its completed tasks would not fit a ``Start``."""


class JournalFull(Refused):
    """The journal holds its limit of jobs or bytes, or could not make the admission durable."""


class CrewDiskFull(Refused):
    """The crew's HOME and storage hold more than ``CREW_MAX_DISK_MB``: 507, as for a full journal."""


class JournalUnavailable(Refused):
    """Another process held the journal's write lock for as long as an admission may wait: try again
    shortly (503 with ``Retry-After``, not 507: nothing is full)."""


SERVED_NAMED = 20  # crews an unknown crew's 404 names; it counts the rest
QUOTE = "\\x27"  # ' as ``ident`` writes a character out, which ``typed_id`` reads back


def unknown_crew(crew_id: str, crews: list[str]) -> str:
    """The 404's detail: the crew asked for and the crews served, as the CLI shows ids (a client's id, or a
    registry's, can hold anything: written out, quotes too, so that none ends the quoted one early)."""
    served = sorted(crews)
    named = ", ".join(ident(crew) for crew in served[:SERVED_NAMED]) or "no crew"
    more = f" and {len(served) - SERVED_NAMED} more (GET /health lists them)" if len(served) > SERVED_NAMED else ""
    asked = ident(crew_id).replace("'", QUOTE)
    return f"unknown crew '{asked}'; this supervisor serves: {named}{more}"


class Admission:
    def __init__(
        self,
        settings: Settings,
        journal: Journal,
        crews: list[str],
        runner: Runner,
        lifecycle: Callable[[], Lifecycle],
        crew_disk: CrewDisk,
        retention: Retention,
        tracing: Tracing,
    ) -> None:
        self.settings = settings
        self.tracing = tracing  # each new job's trace begins here
        self.retention = retention  # archives what is past its window when the journal is full
        self.crew_disk = crew_disk  # each crew's places, as last measured
        self.journal = journal
        self.crews = crews
        self.runner = runner  # launches each admitted job
        self.lifecycle = lifecycle  # the supervisor's, which it alone sets: no new starts once it drains
        # Admissions being made durable, by action id: checked as if already in the journal.
        self._admitting: dict[str, asyncio.Future[None]] = {}
        self._resuming: dict[str, str] = {}  # of those, the resumes: the new job's action id by the job it continues

    async def under_way(self) -> None:
        """Return once the admissions under way are durable and launched (or refused)."""
        await asyncio.gather(*self._admitting.values())

    async def admit(
        self,
        body: StartRequest,
        key: str | None,
        legacy: bool,
        resumed_from: str | None = None,
        traceparent: str | None = None,
        tracestate: str | None = None,
    ) -> Job:
        """The reference's order (413, 400, 403, 428/400, 422, 404, 409, 507 (the journal, then the crew's disk),
        then 503 for a journal locked by another process); an exact repeat returns its job even if its operation was
        disabled since. ``resumed_from``: a resume of that job (``body`` carries its crew and input), checked with
        the 409s. A start of an action id being admitted waits for that admission, then is checked against it. While
        the supervisor drains, an exact repeat still returns its job (idempotency: the client observes the job it
        started, streamed or waited on until it ends); anything else that would start is a 503 (trace: ``_begin``)."""
        began_ns = time.time_ns()
        if body.crew_id in self.crews:  # before the loop below: nothing may wait between it and ``_admitting``
            await self.crew_disk.refresh(body.crew_id)
            await self.retention.make_room(self._journal_full)
        while (under_way := self._admitting.get(body.action_id)) is not None:
            await asyncio.shield(under_way)
        if input_too_large(body):
            raise InputTooLarge("input exceeds 1 MiB")
        if legacy and body.operation != Operation.RUN:
            raise WrongRoute("this route starts only the run operation")
        bad_key = key_problem(key)
        digest = request_hash(body, key, resumed_from) if bad_key is None and key is not None else ""
        existing = self.journal.reader.get(body.action_id)
        if existing is not None and existing.request_hash == digest:
            return existing
        if not self.lifecycle().admits:
            raise ShuttingDown("the supervisor is shutting down")
        if body.operation not in self.settings.allowed_operations:
            raise OperationDisabled(f"operation {body.operation} is not allowed")
        if bad_key is not None:
            missing, problem = bad_key
            raise (KeyMissing if missing else KeyInvalid)(problem)
        try:
            operation_input = validate_input(body)
        except InputError as exc:
            raise InputInvalid(str(exc)) from None
        if body.crew_id not in self.crews:
            raise CrewNotFound(unknown_crew(body.crew_id, self.crews))
        if existing is not None:
            raise ConflictingReuse("action id was already admitted with different request material")
        if self.journal.reader.quarantined(body.action_id) is not None:  # its record is kept aside, not gone
            raise ConflictingReuse("action id belongs to a journal record quarantined at start; use another")
        tasks = self._resumable(resumed_from) if resumed_from is not None else None
        self._check_room(body.crew_id)
        job = Job(body.action_id, body.crew_id, body.operation, digest, Status.RUNNING, 0)
        trace = self._begin(job, resumed_from, traceparent, tracestate, began_ns)  # reads the journal: may raise
        # Nothing may raise from here to the task that clears these (its finally): else later starts wait forever.
        under_way = asyncio.get_running_loop().create_future()
        self._admitting[job.action_id] = under_way
        if resumed_from is not None:
            self._resuming[resumed_from] = job.action_id
        resumed = (resumed_from, tasks) if resumed_from is not None and tasks is not None else None
        task = asyncio.ensure_future(self._admit(job, operation_input, body.timeout_ms, resumed, under_way, trace))
        await asyncio.shield(task)  # a client that goes away must not leave a durable record that nothing launched
        return job

    def _begin(
        self, job: Job, resumed_from: str | None, traceparent: str | None, tracestate: str | None, began_ns: int
    ) -> JobTrace:
        """The new job's trace, begun at ``began_ns`` (when ``admit`` was called), in the caller's W3C trace context
        if its request carried one (``traceparent``, ``tracestate``: the headers as they came, a malformed one
        ignored, never refused); a resume's linked to the trace of the job it continues, if that job was traced."""
        link = self.journal.reader.trace(resumed_from) if resumed_from is not None else None
        given = (job.action_id, job.crew_id, job.operation, traceparent, began_ns)
        return self.tracing.begin(*given, tracestate=tracestate, link=link)

    def _resumable(self, old_id: str) -> list[TaskRecord]:
        """The tasks the job ``old_id`` completed, if a new job may continue it (each refusal says why)."""
        old = self.journal.reader.get(old_id)
        if old is None:
            raise ResumeUnknown(f"job {ident(old_id)} was not found")
        if old.operation != Operation.RUN:
            raise NotResumable(f"only a run resumes; job {ident(old_id)} is a {old.operation}")
        if old.status == Status.RUNNING:
            raise NotResumable(f"job {ident(old_id)} is still running: cancel it, or wait for its end, first")
        if old.status == Status.COMPLETED:
            raise NotResumable(f"job {ident(old_id)} completed: nothing to resume")
        reader = self.journal.reader
        if (by := self._resuming.get(old_id) or reader.resumed_by(old_id)) is not None:
            raise NotResumable(f"job {ident(old_id)} was already resumed as job {ident(by)}")
        if reader.was_resumed(old_id):
            raise NotResumable(f"job {ident(old_id)} was already resumed, by a job since archived")
        if reader.input(old_id) is None:
            raise NotResumable(f"job {ident(old_id)}'s input was not kept (admitted before this version)")
        tasks = reader.tasks_done(old_id)
        # A worker's ledger never holds more (supervisor/jobs/ledger.py): only a journal changed by hand does.
        if (size := sum(len(orjson.dumps(task.output)) for task in tasks)) > MAX_RESUMED_BYTES:
            raise NotResumable(
                f"job {ident(old_id)}'s completed tasks take {size} bytes, more than a resume's start carries"
                f" ({MAX_RESUMED_BYTES})"
            )
        return tasks

    def _check_room(self, crew_id: str) -> None:
        """The 507s, in order: the journal's count and bytes, its filesystem's free space, then the crew's disk."""
        if (full := self._journal_full()) is not None:
            limit, said = full
            raise JournalFull(f"{said}, and {self.retention.advice(limit)}")
        try:
            free = self.journal.reader.free_bytes()
        except OSError as exc:
            raise JournalFull(f"the free space of the journal's filesystem cannot be read: {exc.strerror}") from None
        if free < self.settings.min_free_disk_mb * MiB:
            raise JournalFull(
                f"the journal's filesystem has {free // MiB} MiB free, below the"
                f" {self.settings.min_free_disk_mb} MiB kept for running jobs; free space on it"
            )
        if (used := self.crew_disk.over(crew_id)) is not None:
            raise CrewDiskFull(
                f"crew {crew_id}'s HOME and storage hold {used // MiB} MiB, over its"
                f" {self.settings.crew_max_disk_mb} MiB (CREW_MAX_DISK_MB); free space there first"
            )

    def _journal_full(self) -> tuple[str, str] | None:
        """The limit the journal holds (its setting's name, and what it says), if it holds one: of records, or of
        bytes its records take (``Reader.used_bytes``: archiving frees them)."""
        settings = self.settings
        if self.journal.reader.count() + len(self._admitting) >= settings.max_retained_runs:
            return "MAX_RETAINED_RUNS", f"journal holds its {settings.max_retained_runs} retained runs"
        if self.journal.reader.used_bytes() >= settings.max_state_bytes:
            return "MAX_STATE_BYTES", f"journal's records take its {settings.max_state_bytes} bytes"
        return None

    async def _admit(
        self,
        job: Job,
        operation_input: dict[str, Any],
        timeout_ms: int,
        resumed: tuple[str, list[TaskRecord]] | None,
        under_way: asyncio.Future[None],
        trace: JobTrace,
    ) -> None:
        """Durable, then launched. A run's input is kept with it (a resume runs it again); a resume's link and the
        tasks it continues from, and a traced job's trace ids, commit with it."""
        kept = orjson.dumps(operation_input) if job.operation == Operation.RUN else None
        link = (resumed[0], len(resumed[1])) if resumed is not None else None
        traced = (trace.trace_id, trace.span_id) if trace.trace_id and trace.span_id else None  # NO_TRACE: none
        try:
            # The start fence: durable before any worker exists. A resume's worker is given the tasks its record
            # holds (a retention's archive of the job it continues may have taken them meanwhile: then none).
            copied = await self.journal.admit(job, kept, link, traced)
        except JournalBusy:
            trace.refused(Refusal.JOURNAL_UNAVAILABLE)
            raise JournalUnavailable("the journal is locked by another process; try again shortly") from None
        except JournalError as exc:
            trace.refused(Refusal.JOURNAL_FULL)
            raise JournalFull(f"admission could not be made durable: {exc}") from None
        finally:
            del self._admitting[job.action_id]
            if resumed is not None:
                del self._resuming[resumed[0]]
            under_way.set_result(None)
        trace.admitted()
        self.runner.launch(job, operation_input, timeout_ms, copied, trace)
