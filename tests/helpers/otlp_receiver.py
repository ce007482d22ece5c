"""A real OTLP/HTTP trace receiver on loopback: what a collector would take, decoded with opentelemetry-proto.

``with OtlpReceiver() as receiver:`` listens on 127.0.0.1 (a free port, or ``port``; ``receiver.endpoint`` for
``OTEL_EXPORTER_OTLP_ENDPOINT``), answers each ``POST /v1/traces`` as a collector does, and keeps every span it was
sent (``receiver.spans``), each as a ``ReceivedSpan``. ``receiver.wait_for(check)`` waits, with a deadline, until
``check(spans)`` is true of what arrived.
"""

from __future__ import annotations

import dataclasses
import gzip
import threading
import time
import zlib
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

MAX_BODY_BYTES = 64 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class ReceivedSpan:
    trace_id: str  # 32 hex digits
    span_id: str  # 16 hex digits
    parent_id: str  # "" for a root
    name: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    status: str  # "UNSET", "OK" or "ERROR"
    status_message: str
    events: tuple[tuple[str, dict[str, Any]], ...]  # each event's name and attributes
    links: tuple[tuple[str, str], ...]  # each link's trace and span id
    resource: dict[str, Any]  # its resource's attributes (service.name, ...)


class OtlpReceiver:
    def __init__(self, port: int = 0) -> None:
        self.spans: list[ReceivedSpan] = []
        self.requests: list[dict[str, str]] = []  # each request's headers, in arrival order
        self._changed = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if self.path != "/v1/traces" or not 0 < length <= MAX_BODY_BYTES:
                    self.send_error(404 if self.path != "/v1/traces" else 400)
                    return
                body = self.rfile.read(length)
                encoding = self.headers.get("Content-Encoding", "")
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver._take(dict(self.headers.items()), request)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:  # quiet: a test reads the spans
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="otlp-receiver", daemon=True)

    @property
    def endpoint(self) -> str:
        """The base URL, as ``OTEL_EXPORTER_OTLP_ENDPOINT`` takes it (the exporter adds ``/v1/traces``)."""
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def wait_for(self, check: Callable[[list[ReceivedSpan]], bool], timeout: float = 60.0) -> list[ReceivedSpan]:
        """Every span received, once ``check`` holds of them; AssertionError with what came if ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not check(list(self.spans)):
                left = deadline - time.monotonic()
                if left <= 0:
                    names = sorted({span.name for span in self.spans})
                    raise AssertionError(f"not received in {timeout} s; {len(self.spans)} span(s) came: {names}")
                self._changed.wait(left)
            return list(self.spans)

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        return [span for span in self.spans if span.trace_id == trace_id]

    def _take(self, headers: dict[str, str], request: ExportTraceServiceRequest) -> None:
        spans = [
            _span(span, _attributes(resource.resource.attributes))
            for resource in request.resource_spans
            for scope in resource.scope_spans
            for span in scope.spans
        ]
        with self._changed:
            self.requests.append(headers)
            self.spans.extend(spans)
            self._changed.notify_all()


def _span(span: Any, resource: dict[str, Any]) -> ReceivedSpan:
    return ReceivedSpan(
        trace_id=span.trace_id.hex(),
        span_id=span.span_id.hex(),
        parent_id=span.parent_span_id.hex(),
        name=span.name,
        start_ns=span.start_time_unix_nano,
        end_ns=span.end_time_unix_nano,
        attributes=_attributes(span.attributes),
        status=("UNSET", "OK", "ERROR")[span.status.code],
        status_message=span.status.message,
        events=tuple((event.name, _attributes(event.attributes)) for event in span.events),
        links=tuple((link.trace_id.hex(), link.span_id.hex()) for link in span.links),
        resource=resource,
    )


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which == "array_value":
        return [_value(item) for item in value.array_value.values]
    return getattr(value, which) if which else None
