"""One trace per job (docs/tracing.md): OpenTelemetry spans from admission to the terminal event, the worker's own
spans beneath the supervisor's, exported over OTLP when the standard ``OTEL_*`` variables name an endpoint.

With none named, every job gets ``NO_TRACE``, which records nothing: a job pays a method call per step. The supervisor
exports alone, on a ``TracerProvider`` of its own (never the global one): a worker never gets an endpoint, nor the
exporter's headers, which may hold a vendor's key.
"""

from __future__ import annotations

import contextlib
import enum
import importlib.metadata
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanContext, Status, StatusCode, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from protocol import Reason, SpanEnded, SpanStarted
from supervisor.enums import EventName
from supervisor.jobs.phases import StopReason
from supervisor.jobs.worker_spans import CUT_OFF, WorkerSpans
from supervisor.journal.records import Job
from supervisor.processes.process import StopEvidence

if TYPE_CHECKING:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

SERVICE_NAME = "crew-supervisor"  # unless OTEL_SERVICE_NAME or OTEL_RESOURCE_ATTRIBUTES names another
CLOSE_SECONDS = 5.0  # what is still queued at close gets this long to be exported
PROPAGATOR = TraceContextTextMapPropagator()
Killed = Callable[[StopEvidence], StopEvidence]
REFUSED = "refused"  # the outcome of a job whose start was refused once its trace had begun (JobTrace.refused)
# A caller's W3C headers, checked before the propagator reads them. Version 00 of a traceparent is 55 characters:
# a later version may be longer, never this long. A tracestate's own bounds are W3C's (32 members; what a vendor must
# pass on, 512 characters), each member ``key=value`` in its grammar.
MAX_TRACEPARENT_CHARS = 512
MAX_TRACESTATE_CHARS = 512
MAX_TRACESTATE_MEMBERS = 32
_KEY = r"(?:[a-z][_0-9a-z*/-]{0,255}|[a-z0-9][_0-9a-z*/-]{0,240}@[a-z][_0-9a-z*/-]{0,13})"
_VALUE = r"[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]"
TRACESTATE_MEMBER = re.compile(f"{_KEY}={_VALUE}")
TRACE_ID, SPAN_ID = re.compile("[0-9a-f]{32}"), re.compile("[0-9a-f]{16}")


class Refusal(enum.StrEnum):
    """Why a start was refused after its trace began: its root's ``crew_supervisor.reason``."""

    JOURNAL_UNAVAILABLE = "journal_unavailable"  # another process held the journal's write lock (503)
    JOURNAL_FULL = "journal_full"  # the admission could not be made durable (507)


class TracingError(Exception):
    """The ``OTEL_*`` variables ask for what cannot be had (said in one line at start)."""


class JobTrace:
    """One job's trace. This base is ``NO_TRACE``: it records nothing, and its ids are None."""

    trace_id: str | None = None  # 32 lowercase hex digits
    span_id: str | None = None  # the job's root span: 16 lowercase hex digits

    def admitted(self) -> None:
        """The job is durable: its admission span ends."""

    def refused(self, reason: Refusal) -> None:
        """The start was refused after the trace began (the journal could not make it durable): the admission span
        and the root end, both an error, the root's outcome ``refused`` with ``reason``."""

    def lap(self, step: str) -> None:
        """A step of the job's time ended now (``LiveJob.lap``: queue, launch, worker_start, job, exit, cleanup,
        journal): one span each, beneath the root."""

    def worker_started(self, pid: int, secrets: Iterable[str]) -> str:
        """The ``worker`` span begins as its ``Start`` is sent; its W3C ``traceparent`` (``Start.trace``), or empty
        when the job is not traced. ``secrets``: the job's, masked in every string its worker's spans carry."""
        return ""

    def take(self, message: SpanStarted | SpanEnded) -> tuple[Reason, str] | None:
        """A span frame of the job's worker, checked as untrusted: a fault (reason, message) for one that breaks
        the rules, else None."""
        return None

    def stop_asked(self, reason: StopReason, said: str | None) -> None:
        """A stop won (``LiveJob.ask_stop``): its span begins, ended with the job. What a canceller ``said`` is free
        text: never exported."""

    def killing(self) -> contextlib.AbstractContextManager[Killed]:
        """Around the kill of the job's worker: the kill span. Gives a function the kill's evidence is passed
        through, which the span keeps (signal, descendants killed, confirmed)."""
        return contextlib.nullcontext(_through)

    def exited(self, evidence: Mapping[str, Any]) -> None:
        """The worker is gone (its exit read, or its kill confirmed): the ``worker`` span ends, with how
        (``exit_status``), and its spans still open end as cut off."""

    def end(self, event: EventName, evidence: Mapping[str, Any], input_tokens: int = 0, output_tokens: int = 0) -> None:
        """The job's terminal event is committed: the root ends with it (``evidence``: a failed or cancelled event's
        data, never a completed one's output); a span still open ends as cut off."""

    @contextlib.contextmanager
    def current(self) -> Iterator[None]:
        """Within, the job's root span is the current one: log lines carry its ``trace_id`` and ``span_id``."""
        yield


NO_TRACE = JobTrace()


def _through(evidence: StopEvidence) -> StopEvidence:
    return evidence


class Traced(JobTrace):
    """A job traced: its root span began at admission, every span of it beneath, each with the job's attributes."""

    def __init__(self, tracer: trace.Tracer, root: Span, job: dict[str, str], began_ns: int) -> None:
        self.tracer, self.root, self.job = tracer, root, job
        ids = root.get_span_context()
        self.trace_id, self.span_id = trace.format_trace_id(ids.trace_id), trace.format_span_id(ids.span_id)
        self.inside = trace.set_span_in_context(root)
        self.admission: Span | None = self._span("admission", began_ns)
        self.lapped = began_ns  # when the step in hand began
        self.worker: Span | None = None  # from its Start to its exit
        self.spans: WorkerSpans | None = None  # the worker's, beneath its span
        self.stop: Span | None = None  # from the stop that won to the job's end
        self.ended = False

    def _span(
        self, name: str, start: int, parent: Context | None = None, attributes: Mapping[str, str | int] | None = None
    ) -> Span:
        within = parent or self.inside
        return self.tracer.start_span(name, within, attributes={**self.job, **(attributes or {})}, start_time=start)

    def admitted(self) -> None:
        if self.admission is not None:
            self.lapped = time.time_ns()
            self.admission.end(self.lapped)
            self.admission = None

    def refused(self, reason: Refusal) -> None:
        if self.ended:
            return
        self.ended = True
        now = max(time.time_ns(), self.lapped)
        error = Status(StatusCode.ERROR, reason)
        if self.admission is not None:
            self.admission.set_status(error)
            self.admission.end(now)
            self.admission = None
        self.root.set_attributes({"crew_supervisor.outcome": REFUSED, "crew_supervisor.reason": reason})
        self.root.set_status(error)
        self.root.end(now)

    def lap(self, step: str) -> None:
        if not self.ended:
            now = time.time_ns()
            self._span(step, self.lapped).end(now)
            self.lapped = now

    def worker_started(self, pid: int, secrets: Iterable[str]) -> str:
        began = time.time_ns()
        self.worker = self._span("worker", began, attributes={"process.pid": pid})
        inside = trace.set_span_in_context(self.worker)
        self.spans = WorkerSpans(self.tracer, inside, self.job, secrets, began)
        carrier: dict[str, str] = {}
        PROPAGATOR.inject(carrier, inside)
        return carrier["traceparent"]

    def take(self, message: SpanStarted | SpanEnded) -> tuple[Reason, str] | None:
        if self.spans is None or self.worker is None:  # not given its trace yet, or gone: nothing of it is taken
            return None
        return self.spans.take(message)

    def stop_asked(self, reason: StopReason, said: str | None) -> None:
        if not self.ended and self.stop is None:
            self.stop = self._span("stop", time.time_ns(), attributes={"crew_supervisor.stop_reason": str(reason)})

    @contextlib.contextmanager
    def killing(self) -> Iterator[Killed]:
        parent = trace.set_span_in_context(self.stop) if self.stop is not None else None
        span = self._span("kill", time.time_ns(), parent)

        def killed(evidence: StopEvidence) -> StopEvidence:
            span.set_attributes(
                {
                    "crew_supervisor.signal": evidence.signal,
                    "crew_supervisor.descendants_killed": evidence.descendants_killed,
                    "crew_supervisor.stop_confirmed": evidence.stop_confirmed,
                }
            )
            return evidence

        try:
            yield killed
        finally:
            span.end()

    def exited(self, evidence: Mapping[str, Any]) -> None:
        if self.worker is None:
            return
        now = time.time_ns()
        if self.spans is not None:
            self.spans.cut_off(now)
        how = _exit(evidence.get("exit_status"))
        self.worker.add_event("exit", how, now)
        self.worker.set_attributes(how)
        self.worker.end(now)
        self.worker = None

    def end(self, event: EventName, evidence: Mapping[str, Any], input_tokens: int = 0, output_tokens: int = 0) -> None:
        if self.ended:
            return
        self._cut_off()
        attributes: dict[str, Any] = {"crew_supervisor.outcome": event}
        attributes |= {"gen_ai.usage.input_tokens": input_tokens, "gen_ai.usage.output_tokens": output_tokens}
        if event == EventName.FAILED:  # a cancel's reason is what its caller said: free text, never exported
            attributes["crew_supervisor.reason"] = str(evidence.get("reason"))
            self.root.set_status(Status(StatusCode.ERROR, str(evidence.get("reason"))))
        if isinstance(uncertain := evidence.get("uncertain_outcome"), bool):
            attributes["crew_supervisor.uncertain_outcome"] = uncertain
        self.root.set_attributes(attributes)
        self.root.end(self.lapped)

    @contextlib.contextmanager
    def current(self) -> Iterator[None]:
        try:
            with trace.use_span(self.root, record_exception=False, set_status_on_exception=False):
                yield
        finally:  # a job whose end never came (the supervisor failed settling it): its trace ends all the same
            if not self.ended:
                self._cut_off()
                _cut(self.root, time.time_ns())

    def _cut_off(self) -> None:
        """The job's end, now: its stop span ends with it, every other span still open ends as cut off; the root is
        left to its caller."""
        self.ended = True
        self.lapped = now = max(time.time_ns(), self.lapped)
        if self.spans is not None:
            self.spans.cut_off(now)
            if self.spans.dropped:
                self.root.set_attribute("crew_supervisor.spans_dropped", self.spans.dropped)
        for span in (self.admission, self.worker):
            if span is not None:
                _cut(span, now)
        if self.stop is not None:
            self.stop.end(now)
        self.admission = self.worker = self.stop = None


def _cut(span: Span, at: int) -> None:
    span.set_attribute("error.type", CUT_OFF)
    span.set_status(Status(StatusCode.ERROR, CUT_OFF))
    span.end(at)


def _exit(status: Any) -> dict[str, Any]:
    """How a worker left, as its span says it: its exit code, or the signal that ended it."""
    if not isinstance(status, int) or isinstance(status, bool):
        return {}
    if status >= 0:
        return {"process.exit.code": status}
    try:
        return {"crew_supervisor.exit_signal": signal.Signals(-status).name}
    except ValueError:
        return {"crew_supervisor.exit_signal": str(-status)}


class Tracing:
    """The supervisor's tracer: off, or exporting over OTLP as the ``OTEL_*`` variables say."""

    exporter: str | None = None  # "otlp/http" or "otlp/grpc"; None: off

    def __init__(self, provider: TracerProvider | None = None, exporter: str | None = None) -> None:
        self.provider, self.exporter = provider, exporter
        self.tracer = provider.get_tracer("crew_supervisor", _version() or None) if provider is not None else None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> Tracing:
        """Off unless an OTLP endpoint is named (``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or
        ``OTEL_EXPORTER_OTLP_ENDPOINT``), and off if ``OTEL_SDK_DISABLED`` is true or ``OTEL_TRACES_EXPORTER`` is
        ``none``; ``TracingError`` for an exporter or protocol that cannot be had. These, the service's name and the
        resource's attributes are read from ``environ``; the SDK reads the rest (headers, timeout, compression,
        certificates, ``OTEL_BSP_*``, the sampler) from the process's environment, which ``serve`` passes."""
        traces_endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
        endpoint = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
        exporters = {name.strip().lower() for name in environ.get("OTEL_TRACES_EXPORTER", "").split(",")} - {""}
        if not (traces_endpoint or endpoint) or sdk_disabled(environ) or exporters == {"none"}:
            return cls()
        if exporters - {"otlp"}:
            named = ",".join(sorted(exporters))
            raise TracingError(f"OTEL_TRACES_EXPORTER={named}: the supervisor exports over otlp alone (or none)")
        from opentelemetry.sdk.trace import TracerProvider  # here: a supervisor that does not trace never loads it
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        exporter, name = _exporter(environ, traces_endpoint, endpoint)
        provider = TracerProvider(resource=_resource(environ), shutdown_on_exit=False)
        provider.add_span_processor(BatchSpanProcessor(exporter))
        return cls(provider, name)

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
        the caller's span when ``traceparent`` (and ``tracestate``) name one: a malformed one is ignored, as W3C
        says. ``link``: the trace and span id of the job a resume continues, linked from the root. A job the sampler
        leaves out is not traced."""
        if self.tracer is None:
            return NO_TRACE
        job = _attributes(action_id, crew_id, operation)
        linked = _context(*link) if link is not None else None  # a row changed by hand: no link
        links = [Link(linked)] if linked is not None else []
        caller = PROPAGATOR.extract(_carrier(traceparent, tracestate), Context())
        root = self.tracer.start_span("job", caller, attributes=job, links=links, start_time=began_ns)
        return Traced(self.tracer, root, job, began_ns) if root.is_recording() else NO_TRACE

    def fenced(self, job: Job, ids: tuple[str, str], reason: Reason, began_ns: int) -> None:
        """A job a dead supervisor left running, failed by restart fencing (``fencing.py``): its root never ended,
        so a ``fenced`` span, a child of it (``ids``: its trace and root span id, as the journal keeps them), says
        the outcome in its trace, an error. Nothing for ids the journal holds malformed."""
        if self.tracer is None or (root := _context(*ids)) is None:
            return
        attributes: dict[str, str | bool] = {**_attributes(job.action_id, job.crew_id, job.operation)}
        attributes |= {"crew_supervisor.outcome": str(EventName.FAILED), "crew_supervisor.reason": str(reason)}
        attributes["crew_supervisor.uncertain_outcome"] = True  # its worker's end was never seen
        within = trace.set_span_in_context(trace.NonRecordingSpan(root))
        span = self.tracer.start_span("fenced", within, attributes=attributes, start_time=began_ns)
        span.set_status(Status(StatusCode.ERROR, reason))
        span.end()

    def close(self) -> None:
        """What is still queued exported, within CLOSE_SECONDS, then the exporter shut down. Blocks: called in a
        thread (the SDK's flush ignores its own timeout, so it is waited for here, in a thread of its own)."""
        if self.provider is None:
            return
        closing = threading.Thread(target=self.provider.shutdown, name="tracing-close", daemon=True)
        closing.start()
        closing.join(CLOSE_SECONDS)


def sdk_disabled(environ: Mapping[str, str]) -> bool:
    """``OTEL_SDK_DISABLED`` as the SDK reads it: "true", in any case, turns the supervisor's tracing off."""
    return environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"


def _exporter(environ: Mapping[str, str], traces_endpoint: str, endpoint: str) -> tuple[SpanExporter, str]:
    """The OTLP exporter the protocol variables ask for, on the endpoint named, and its name for ``/health``."""
    protocol = (
        environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or ""
    ).strip() or "http/protobuf"
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        # As the SDK resolves it: the traces endpoint as it is, the general one with the signal's path.
        return OTLPSpanExporter(traces_endpoint or f"{endpoint.removesuffix('/')}/v1/traces"), "otlp/http"
    if protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
        except ImportError:
            raise TracingError(
                "OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs the package opentelemetry-exporter-otlp-proto-grpc, which is"
                " not installed; install it, or use http/protobuf"
            ) from None
        return GrpcExporter(traces_endpoint or endpoint), "otlp/grpc"
    raise TracingError(f"OTLP protocol {protocol!r} is not one the supervisor exports with: http/protobuf or grpc")


def _resource(environ: Mapping[str, str]) -> Resource:
    """service.name (ours unless the variables name one), service.version, process.pid, and what
    ``OTEL_RESOURCE_ATTRIBUTES`` says."""
    from opentelemetry.sdk.resources import Resource

    given: dict[str, str] = {}
    for item in environ.get("OTEL_RESOURCE_ATTRIBUTES", "").split(","):  # as the SDK reads it: k=v, URL-encoded
        key, equals, value = item.partition("=")
        if equals and key.strip():
            given[key.strip()] = unquote(value.strip())
    if service := environ.get("OTEL_SERVICE_NAME", "").strip():
        given["service.name"] = service
    ours: dict[str, Any] = {"service.name": SERVICE_NAME, "process.pid": os.getpid()}
    if version := _version():
        ours["service.version"] = version
    return Resource.create({**ours, **given})


def _version() -> str:
    try:
        return importlib.metadata.version("crew-supervisor")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree never installed
        return ""


def _attributes(action_id: str, crew_id: str, operation: str) -> dict[str, str]:
    """What every span of a job carries."""
    return {
        "crew_supervisor.action_id": action_id,
        "crew_supervisor.crew_id": crew_id,
        "crew_supervisor.operation": str(operation),
    }


def _context(trace_id: object, span_id: object) -> SpanContext | None:
    """A job's root (sampled: only a job sampled has its ids journaled) by its ids as the journal keeps them; None
    for ids that are not (a journal changed by hand): what reads them (a resume's link, a fence) goes on without."""
    if not (isinstance(trace_id, str) and TRACE_ID.fullmatch(trace_id) and int(trace_id, 16)):
        return None
    if not (isinstance(span_id, str) and SPAN_ID.fullmatch(span_id) and int(span_id, 16)):
        return None
    return SpanContext(int(trace_id, 16), int(span_id, 16), is_remote=True, trace_flags=TraceFlags(1))


def _carrier(traceparent: str | None, tracestate: str | None) -> dict[str, str]:
    """The caller's headers the propagator may read. One W3C would have discarded is left out here, before the
    propagator sees it: the SDK logs a malformed tracestate member whole, and a caller's text in a log line could
    forge its fields. A tracestate goes only with a traceparent (alone, the propagator reads none)."""
    if not traceparent or len(traceparent) > MAX_TRACEPARENT_CHARS:
        return {}
    if not tracestate or not _w3c_tracestate(tracestate):
        return {"traceparent": traceparent}
    return {"traceparent": traceparent, "tracestate": tracestate}


def _w3c_tracestate(tracestate: str) -> bool:
    """Within W3C's bounds, each member ``key=value`` in its grammar (empty members, and blanks around one, are
    allowed: HTTP joins two header lines with a comma)."""
    if len(tracestate) > MAX_TRACESTATE_CHARS:
        return False
    members = [member for member in (part.strip(" \t") for part in tracestate.split(",")) if member]
    return len(members) <= MAX_TRACESTATE_MEMBERS and all(TRACESTATE_MEMBER.fullmatch(member) for member in members)
