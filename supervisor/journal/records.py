"""What the journal holds, as its readers and writers pass it around: a job's record, an event (parsed or
as stored), a worker's captured output."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, NamedTuple

from supervisor.enums import TERMINAL_EVENTS
from supervisor.redaction import redact_within

if TYPE_CHECKING:
    from supervisor.processes.pipes import Tail


@dataclasses.dataclass(frozen=True)
class Job:
    action_id: str
    crew_id: str
    operation: str
    request_hash: str
    status: str
    event_count: int
    worker_pid: int | None = None
    worker_start_time: float | None = None
    worker_pgid: int | None = None
    exit_status: int | None = None  # the worker's, once the job is terminal (negative: killed by that signal)
    admitted_at: float | None = None  # wall clock, as the journal keeps it (None: not read from it)
    ended_at: float | None = None  # wall clock: when its terminal event was written (None: running, or unknown)
    boundary: bytes | None = None  # JSON: what identifies its processes beside its worker (``containment.Boundary``)
    leftovers: bytes | None = None  # JSON: what its worker left running when it exited, killed and named


@dataclasses.dataclass(frozen=True)
class Event:
    event: str  # as the journal holds it, like StoredEvent's: an EventName's text unless someone edited the file
    sequence: int
    data: dict[str, Any]

    @property
    def terminal(self) -> bool:
        return self.event in TERMINAL_EVENTS

    def as_dict(self) -> dict[str, Any]:
        return {"event": self.event, "sequence": self.sequence, "data": self.data}


class StoredEvent(NamedTuple):
    """An event as stored: its data still the compact JSON it was written as, for a reader that only
    passes it on (an SSE stream) and need not parse it and encode it again."""

    event: str
    sequence: int
    data: bytes

    @property
    def terminal(self) -> bool:
        return self.event in TERMINAL_EVENTS


@dataclasses.dataclass(frozen=True)
class Streams:
    """A worker's captured stdout/stderr tails and the bytes each carried in all."""

    stdout: str
    stderr: str
    stdout_total: int
    stderr_total: int

    @classmethod
    def of(cls, stdout: Tail, stderr: Tail, secrets: tuple[str, ...]) -> Streams:
        """The tails as shown and stored (``shown``)."""
        return cls(shown(stdout, secrets), shown(stderr, secrets), stdout.total, stderr.total)


def shown(tail: Tail, secrets: tuple[str, ...], last: int | None = None) -> str:
    """A worker's tail as shown and stored, or only its ``last`` characters: ``secrets`` replaced
    (``supervisor/redaction.py``), one cut at the start of what lost its beginning, or at its end, where a
    write may have stopped mid-way, too. Never longer than the text it redacts (``redact_within``), which is
    decoded from at most the bytes counted: a stored tail keeps within its byte count, as the journal checks."""
    text, cut = tail.text(), tail.truncated
    if last is not None and len(text) > last:
        text, cut = text[-last:], True
    return redact_within(text, secrets, len(text), cut_start=cut, cut_end=True)


@dataclasses.dataclass(frozen=True)
class EffectRecord:
    """One entry of a job's effect ledger (``journal/ledger.py``): a tool or LLM call, as the journal keeps it. Times
    are wall clock (Unix seconds); ``ended_at`` is None while it runs, and for an ``uncertain`` one."""

    id: int
    kind: str
    name: str
    digest: str
    status: str
    started_at: float
    ended_at: float | None
    error_type: str | None
    error_message: str | None
    prompt_tokens: int
    completion_tokens: int


@dataclasses.dataclass(frozen=True)
class TaskRecord:
    """A task a ``run`` completed (``tasks_done``): its index in the crew's tasks, the crew's fingerprint then, and
    its output as the worker's ``TaskDone`` said it (masked)."""

    index: int
    fingerprint: str
    output: dict[str, Any]


Resumed = tuple[str, int]  # a resume's admission: the job it continues, and how many of that job's tasks it completed
TraceIds = tuple[str, str]  # a traced job's trace id (32 lowercase hex digits) and its root span's id (16)
