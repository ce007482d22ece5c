"""The recorder: a job's events into the journal, within their bounds, its worker's record, and its terminal event.
Readers only ever see committed events (``reads.follow``)."""

from __future__ import annotations

import logging
from typing import Any

import orjson

from protocol import Reason
from supervisor.config import PREFIX, Settings
from supervisor.enums import EventName
from supervisor.jobs.job_state import JobState
from supervisor.jobs.outcomes import Outcome
from supervisor.journal.errors import JournalError
from supervisor.journal.records import Streams
from supervisor.journal.store import Journal
from supervisor.processes.containment import Boundary
from supervisor.processes.process import WorkerProcess
from supervisor.redaction import mentions, redact_data
from supervisor.tracebacks import last_traceback

log = logging.getLogger("crew_supervisor.jobs")
CREW_RAISED = (Reason.OPERATION_FAILED, Reason.CREW_FACTORY_FAILED)  # failures whose worker wrote the crew's exception
MAX_LOGGED_TRACEBACK = 16 * 1024  # characters: its end, where the exception's message is


class Recorder:
    def __init__(self, settings: Settings, journal: Journal) -> None:
        self.settings = settings
        self.journal = journal

    async def record(
        self, action_id: str, secrets: tuple[str, ...], name: EventName, data: dict[str, Any], recorded: int
    ) -> tuple[Reason, str] | None:
        """Append a non-terminal event of the job ``action_id`` (its ``secrets`` masked) to the ``recorded`` ones, or
        say which bound it breaks (the last slot is the terminal's) or that its group could not be committed."""
        if recorded + 1 >= self.settings.max_events_per_run:
            limit = self.settings.max_events_per_run
            return Reason.EVENT_LIMIT_EXCEEDED, f"more than {limit - 1} events: {PREFIX}MAX_EVENTS_PER_RUN is {limit}"
        encoded = masked(data, secrets)  # as the reference measures it: the event's data, compact JSON; as stored
        if len(encoded) > self.settings.max_event_bytes:
            bound = self.settings.max_event_bytes
            return Reason.EVENT_TOO_LARGE, f"an event of {len(encoded)} bytes exceeds {PREFIX}MAX_EVENT_BYTES ({bound})"
        started = name is EventName.STARTED  # committed at once, not awaited: start latency is what clients feel first
        group = self.journal.append(action_id, name, data, encoded, commit=started)
        if group is not None and not started:  # a checkpoint: relay no more of this job until it is durable
            try:
                await group
            except JournalError as exc:
                return Reason.JOURNAL_ERROR, str(exc)
        return None

    async def record_worker(self, action_id: str, worker: WorkerProcess, boundary: Boundary) -> None:
        """Committed before the worker gets its job, so a restart can find and fence it and all it starts."""
        await self.journal.set_worker(action_id, worker.pid, worker.create_time, worker.pgid, boundary.encode())

    def record_boundary(self, action_id: str, boundary: Boundary) -> None:
        """Samples found more of the job's processes: journaled for a restart to kill, not waited for."""
        self.journal.set_boundary(action_id, boundary.encode())

    async def finish(self, job: JobState, outcome: Outcome, stack: dict[str, Any] | None) -> None:
        """The terminal event (a job that did not complete keeps its LLM spend there), the record's status, output and
        exit status, and the worker's stdout/stderr tails (an operator reads them after the job ended): one durable
        commit. Another process holding
        the journal's lock only delays it; the journal failing it otherwise leaves the job to be fenced."""
        streams = Streams.of(job.worker.stdout, job.worker.stderr, job.secrets) if job.worker is not None else None
        spent = job.spent
        if outcome.event != EventName.COMPLETED and spent.llm_calls:  # a completed job's output's token_usage says it
            outcome.data.setdefault("llm_spent", spent.summary())
        masked(
            outcome.data, job.secrets
        )  # in place, so the log says what the journal does; a completed one's is the output
        try:
            await self.journal.finish(
                job.action_id,
                outcome.event,
                outcome.data,
                outcome.output,
                streams,
                exit_status=outcome.exit_status,
                stack=stack,
                leftovers=outcome.leftovers,
            )
        except JournalError as exc:
            log.critical(
                "terminal event not durable (%s); the job will be fenced on restart",
                exc,
                extra={"action_id": job.action_id},
            )
        raised = outcome.event == EventName.FAILED and outcome.data.get("reason") in CREW_RAISED
        if streams is not None and raised and self.settings.log_crew_tracebacks:
            self._log_traceback(job, streams.stderr)

    @staticmethod
    def _log_traceback(job: JobState, stderr: str) -> None:
        """A crew's exception, for the operator, as the reference logs it; its event keeps the generic words."""
        raised = last_traceback(stderr, max_chars=MAX_LOGGED_TRACEBACK)
        if raised is not None:
            ending = raised[-MAX_LOGGED_TRACEBACK:]  # the last traceback alone may be longer still
            log.warning(
                "the crew raised", extra={"action_id": job.action_id, "crew_id": job.crew_id, "traceback": ending}
            )


def masked(data: dict[str, Any], secrets: tuple[str, ...]) -> bytes:
    """``data`` (what a job's worker wrote, decoded) as compact JSON, with the job's ``secrets`` replaced in its strings
    (``supervisor/redaction.py``), in place: every event, and the output, passes here before it is journaled, sent
    or logged. A chunk event is the hot path: its JSON is searched once, and walked only if a secret may be in it."""
    encoded = orjson.dumps(data)
    if secrets and mentions(encoded, secrets):
        encoded = orjson.dumps(redact_data(data, secrets))
    return encoded
