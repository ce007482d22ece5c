"""A traced job's worker spans (``SpanStarted``, ``SpanEnded``): crew code talking, so each frame is checked before
it becomes a span of the job's trace. An id is 16 lowercase hex digits, new in the job; a parent is empty (the job's
``worker`` span) or an id the job started; a name a ``SpanName``; attributes only ``SPAN_ATTRIBUTES``' keys, each of
its type, a string masked with the job's secrets and cut at ``MAX_SPAN_VALUE_CHARS``; an end only for a span open;
times clamped between the ``worker`` span's start and now. A frame that breaks a rule is the job's protocol fault.
Past ``MAX_SPANS`` spans, or with ``MAX_OPEN_SPANS`` open, a span is dropped and counted, not faulted: a crew busier
than those bounds is no broken worker, and its job must not fail for its trace. The exported spans get ids of the
supervisor's own."""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanContext, Status, StatusCode

from protocol import (
    MAX_OPEN_SPANS,
    MAX_SPAN_VALUE_CHARS,
    MAX_SPANS,
    SPAN_ATTRIBUTES,
    Reason,
    SpanEnded,
    SpanName,
    SpanStarted,
)
from supervisor.redaction import REDACTED, redact

SPAN_ID = re.compile(r"[0-9a-f]{16}")
NAMES = frozenset(SpanName)
INT64 = range(-(2**63), 2**63)  # what OTLP carries of an integer: a larger one would fail the whole batch's export
CUT_OFF = "cut_off"  # error.type of a span the job's end cut off (a kill interrupted its work)
QUOTED_CHARS = 40  # of a worker's text a fault quotes
Fault = tuple[Reason, str]  # a span frame that breaks the rules: the protocol fault it is


class WorkerSpans:
    def __init__(
        self, tracer: trace.Tracer, parent: Context, job: Mapping[str, str], secrets: Iterable[str], floor: int
    ) -> None:
        """``parent``: the context of the job's ``worker`` span, which began at ``floor`` (ns); ``job``: the attributes
        every span of the job carries; ``secrets``: masked in each string a span carries."""
        self.tracer, self.parent, self.job, self.floor = tracer, parent, dict(job), floor
        self.secrets = tuple(secrets)
        self.reach = _reach(self.secrets)
        self.started: dict[str, SpanContext] = {}  # every span taken, by the worker's id (parents of later ones)
        self.open: dict[str, tuple[Span, int]] = {}  # those not ended yet, with their start (ns)
        self.dropped = 0  # spans past MAX_SPANS or MAX_OPEN_SPANS, and those beneath them

    def take(self, message: SpanStarted | SpanEnded) -> Fault | None:
        """One frame of the worker's spans: a span begun or ended, or the fault it is."""
        if isinstance(message, SpanStarted):
            return self._start(message)
        return self._end(message)

    def cut_off(self, at: int) -> None:
        """Every span still open ends at ``at``, as cut off: the worker is gone, or the job ended."""
        for span, began in self.open.values():
            span.set_attribute("error.type", CUT_OFF)
            span.set_status(Status(StatusCode.ERROR, CUT_OFF))
            span.end(max(at, began))
        self.open.clear()

    def _start(self, message: SpanStarted) -> Fault | None:
        if not SPAN_ID.fullmatch(message.id):
            return _fault(f"span id {_quoted(message.id)} is not 16 lowercase hex digits")
        if message.name not in NAMES:
            return _fault(f"span name {_quoted(message.name)} is none a worker opens")
        attributes = self._attributes(message.attributes)
        if isinstance(attributes, tuple):
            return attributes
        if self._dropping(message.parent):  # its id is not kept: a later span beneath it is dropped alike
            self.dropped += 1
            return None
        if message.id in self.started:
            return _fault(f"span id {message.id} was used before in this job")
        if message.parent and message.parent not in self.started:
            return _fault(f"span parent {_quoted(message.parent)} is no span this job started")
        parent = self.parent
        if message.parent:
            parent = trace.set_span_in_context(trace.NonRecordingSpan(self.started[message.parent]), parent)
        began = min(max(message.start_ns, self.floor), time.time_ns())
        span = self.tracer.start_span(message.name, parent, attributes={**self.job, **attributes}, start_time=began)
        self.started[message.id] = span.get_span_context()
        self.open[message.id] = (span, began)
        return None

    def _dropping(self, parent: str) -> bool:
        """Whether a span begun now is dropped: past a bound, or beneath one dropped (once one is, a parent this
        job never started cannot be told from a dropped one's id, which is not kept: unbounded)."""
        if len(self.started) >= MAX_SPANS or len(self.open) >= MAX_OPEN_SPANS:
            return True
        return bool(parent and self.dropped and parent not in self.started)

    def _end(self, message: SpanEnded) -> Fault | None:
        attributes = self._attributes(message.attributes)
        if isinstance(attributes, tuple):
            return attributes
        if message.id not in self.open:
            if self.dropped:  # the end of a span dropped (its id not kept) cannot be told from a stray one
                return None
            return _fault(f"span end for {_quoted(message.id)}, which is no span of this job open")
        span, began = self.open.pop(message.id)
        span.set_attributes(attributes)
        if message.error:
            error = self._text(message.error)
            span.set_attribute("error.type", error)
            span.set_status(Status(StatusCode.ERROR, error))
        span.end(min(max(message.end_ns, began), time.time_ns()))
        return None

    def _attributes(self, given: Mapping[str, Any]) -> dict[str, str | int] | Fault:
        """``given`` checked against ``SPAN_ATTRIBUTES``, its strings masked and cut; or the fault it is."""
        taken: dict[str, str | int] = {}
        for key, value in given.items():
            kind = SPAN_ATTRIBUTES.get(key)
            if kind is None:
                return _fault(f"span attribute {_quoted(key)} is none a worker's span carries")
            if type(value) is not kind or (kind is int and value not in INT64):
                return _fault(f"span attribute {key} is not a {kind.__name__} (or out of range)")
            if isinstance(value, str):  # exactly its kind, as checked above
                taken[key] = self._text(value)
            elif isinstance(value, int):
                taken[key] = value
        return taken

    def _text(self, text: str) -> str:
        """A worker's string as exported: cut to what can reach the export (a frame's string may be near a MiB),
        its secrets masked (one cut at its end too: the worker's cut, or ours), then cut."""
        return redact(text[: self.reach], self.secrets, cut_end=True)[:MAX_SPAN_VALUE_CHARS]


def _reach(secrets: tuple[str, ...]) -> int:
    """How much of a string can reach its first MAX_SPAN_VALUE_CHARS once masked: each marker there may stand for a
    secret longer than itself (at most one marker per its length of them), and a secret begun within must be there
    whole to be masked whole."""
    longest = max(map(len, secrets), default=0)
    shrink = max(longest - len(REDACTED), 0)  # the most one marker gives back
    return MAX_SPAN_VALUE_CHARS + MAX_SPAN_VALUE_CHARS // len(REDACTED) * shrink + longest


def _fault(message: str) -> Fault:
    return Reason.PROTOCOL_ERROR, message


def _quoted(text: str) -> str:
    """A worker's text in a fault's message: quoted, and cut (the terminal event's data masks its secrets)."""
    return repr(text[:QUOTED_CHARS] + ("…" if len(text) > QUOTED_CHARS else ""))
