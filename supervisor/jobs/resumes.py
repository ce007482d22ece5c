"""Resumes: a new job that continues an interrupted ``run`` from its last completed task (``POST
/jobs/{id}/resume``; ``Supervisor.resume`` admits it). A resume is never automatic: only a client's explicit resume
starts one (the contract: a stopped run is not run again without its host reconciling first)."""

from __future__ import annotations

from protocol import Operation
from supervisor.jobs.admission import ResumeUnknown
from supervisor.journal.reader import Reader
from supervisor.models import ResumeRequest, StartRequest


def resumed_start(reader: Reader, old_id: str, request: ResumeRequest) -> StartRequest:
    """The start a resume of the job ``old_id`` as job ``request.action_id`` asks admission for: a ``run`` of the old
    job's crew and input. A repeat of a resume admitted is the start of its job first, whatever has become of the old
    one since (archived, say): the request hash of a resume holds no input (``request_hash``). Raises
    ``ResumeUnknown``; admission refuses the rest (a start's refusals, and ``Admission._resumable``'s)."""
    if (new := reader.get(request.action_id)) is not None:
        return StartRequest(crew_id=new.crew_id, action_id=new.action_id, input={}, timeout_ms=request.timeout_ms)
    old = reader.get(old_id)
    if old is None and reader.quarantined(old_id) is not None:
        raise ResumeUnknown("run was quarantined at start: its journal record is inconsistent")
    if old is None:
        raise ResumeUnknown("run was not found")
    # Only a run's input is kept: another operation's job is refused with the 409s, whatever this says.
    return StartRequest(
        crew_id=old.crew_id,
        action_id=request.action_id,
        operation=Operation.RUN,
        input=reader.input(old_id) or {},
        timeout_ms=request.timeout_ms,
    )
