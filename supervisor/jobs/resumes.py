"""The facade's admissions (``Supervisor`` is one): a start, and a resume, a new job that continues an interrupted
``run`` from its last completed task (``POST /jobs/{id}/resume``), and the links between the two. A resume is never
automatic: only a client's explicit resume starts one (the contract: a stopped run is not run again without its host
reconciling first). Each takes the caller's W3C trace context as its request's headers carried it (``traceparent``,
``tracestate``: raw, a malformed one ignored by ``Tracing.begin``, never refused)."""

from __future__ import annotations

from protocol import Operation
from supervisor.jobs.admission import Admission, ResumeUnknown
from supervisor.journal.reader import Reader
from supervisor.journal.records import Job
from supervisor.models import ResumeRequest, StartRequest


class Resumes:
    admission: Admission
    reader: Reader

    async def admit(
        self,
        body: StartRequest,
        key: str | None,
        legacy: bool,
        traceparent: str | None = None,
        tracestate: str | None = None,
    ) -> Job:
        """Admission's answer (``Admission.admit``): the job, durable and launched; or a ``Refused``."""
        return await self.admission.admit(body, key, legacy, traceparent=traceparent, tracestate=tracestate)

    async def resume(
        self,
        old_id: str,
        request: ResumeRequest,
        key: str | None,
        traceparent: str | None = None,
        tracestate: str | None = None,
    ) -> Job:
        """Admission's answer for a ``run`` of the job ``old_id``'s crew and input as job ``request.action_id``, its
        worker given the tasks the old job completed: the new job, durable and launched; or a ``Refused`` (a start's,
        and ``Admission._resumable``'s). A repeat of a resume admitted is answered its job first, whatever has
        become of the old one since (archived, say): the request hash of a resume holds no input (``request_hash``)."""
        traced = {"traceparent": traceparent, "tracestate": tracestate}
        if (new := self.reader.get(request.action_id)) is not None:
            body = StartRequest(crew_id=new.crew_id, action_id=new.action_id, input={}, timeout_ms=request.timeout_ms)
            return await self.admission.admit(body, key, legacy=False, resumed_from=old_id, **traced)
        old = self.reader.get(old_id)
        if old is None and self.reader.quarantined(old_id) is not None:
            raise ResumeUnknown("run was quarantined at start: its journal record is inconsistent")
        if old is None:
            raise ResumeUnknown("run was not found")
        # Only a run's input is kept: another operation's job is refused with the 409s, whatever this says.
        body = StartRequest(
            crew_id=old.crew_id,
            action_id=request.action_id,
            operation=Operation.RUN,
            input=self.reader.input(old_id) or {},
            timeout_ms=request.timeout_ms,
        )
        return await self.admission.admit(body, key, legacy=False, resumed_from=old_id, **traced)

    def links(self, action_id: str) -> dict[str, str | None]:
        """A job's resume links, as its record says them: the job it continues and the job that continues it."""
        return {"resumed_from": self.reader.resumed_from(action_id), "resumed_by": self.reader.resumed_by(action_id)}
