"""One trace per job (docs/tracing.md): OpenTelemetry spans from admission to the terminal event, the worker's own
spans beneath the supervisor's, exported over OTLP when the standard ``OTEL_*`` variables name an endpoint.

With none named, every job gets ``NO_TRACE``, which records nothing: a job pays a method call per step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

from protocol import Reason, SpanEnded, SpanStarted
from supervisor.jobs.phases import StopReason


class TracingError(Exception):
    """The ``OTEL_*`` variables ask for what cannot be had (said in one line at start)."""


class JobTrace:
    """One job's trace. This base is ``NO_TRACE``: it records nothing, and its ids are None."""

    trace_id: str | None = None  # 32 lowercase hex digits
    span_id: str | None = None  # the job's root span: 16 lowercase hex digits

    def admitted(self) -> None:
        """The job is durable: its admission span ends."""

    def lap(self, step: str) -> None:
        """A step of the job's time ended now (``LiveJob.lap``: queue, launch, worker_start, job, exit, cleanup,
        journal): one span each, beneath the root."""

    def worker_started(self, pid: int) -> str:
        """The ``worker`` span begins as its ``Start`` is sent; its W3C ``traceparent`` (``Start.trace``), or empty
        when the job is not traced."""
        return ""

    def take(self, message: SpanStarted | SpanEnded) -> tuple[Reason, str] | None:
        """A span frame of the job's worker, checked as untrusted: a fault (reason, message) for one that breaks
        the rules, else None."""
        return None

    def stop_asked(self, reason: StopReason, said: str | None) -> None:
        """A stop won (``LiveJob.ask_stop``): its span begins, ended with the job."""

    def killing(self) -> contextlib.AbstractContextManager[None]:
        """Around the kill of the job's worker and what it left: the kill span."""
        return contextlib.nullcontext()

    def exited(self, evidence: Mapping[str, Any]) -> None:
        """The worker is gone (its exit read, or its kill confirmed): the ``worker`` span ends, with how."""

    def end(self, event: str, data: Mapping[str, Any]) -> None:
        """The job's terminal event is committed: the root ends with it; a span still open ends as cut off."""

    @contextlib.contextmanager
    def current(self) -> Iterator[None]:
        """Within, the job's root span is the current one: log lines carry its ``trace_id`` and ``span_id``."""
        yield


NO_TRACE = JobTrace()


class Tracing:
    """The supervisor's tracer: off, or exporting over OTLP as the ``OTEL_*`` variables say."""

    exporter: str | None = None  # "otlp/http" or "otlp/grpc"; None: off

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> Tracing:
        """Off unless an OTLP endpoint is named; ``TracingError`` for a protocol that cannot be had."""
        return cls()

    def begin(
        self,
        action_id: str,
        crew_id: str,
        operation: str,
        traceparent: str | None,
        began_ns: int,
        *,
        tracestate: str | None = None,
        link: tuple[str, str] | None = None,
    ) -> JobTrace:
        """A new job's trace, its root span begun at ``began_ns`` (the request's arrival at admission), a child of
        the caller's span when ``traceparent`` names one (``tracestate``: the caller's, carried with it; both the
        raw headers, a malformed one ignored). ``link``: the trace id and root span id of the job a resume
        continues, which the root links to."""
        return NO_TRACE

    def close(self) -> None:
        """What is still queued exported (bounded), then the exporter shut down."""
