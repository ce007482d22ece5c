"""An emulation of the AIP CrewAI connector (the contract's production client), strict about its rules.

Written only from /work/shared/facts/aip-client.md: what the Rust connector sends, which route it picks
for which operation, the health gate it applies before any work, how it reads an event stream and how it
classifies every answer. It is deliberately unforgiving: whatever it rejects, the real client rejects too,
so a sidecar that passes it can be swapped in for the reference without the client noticing.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import re
import secrets
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

import httpx

# What the client sends and accepts.
ACTION_ID = re.compile(r"act_[0-9a-f]{32}")
MAX_INPUT_BYTES = 1024 * 1024
MAX_REQUEST_BYTES = MAX_INPUT_BYTES + 64 * 1024
MAX_FRAME_BYTES = 1024 * 1024  # the SSE buffer, checked before delimited frames are extracted
MAX_STREAM_BYTES = 64 * 1024 * 1024
MAX_STREAM_EVENTS = 100_000
CANCEL_REASON = "AIP connector rejected the sidecar event stream"

# Which route each operation takes when the AIP runtime drives an action.
STREAMED = frozenset({"run", "batch_run", "replay", "train", "test"})
BLOCKING = frozenset({"knowledge_query", "memory_reset"})
OPERATIONS = STREAMED | BLOCKING
DEFAULT_OPERATIONS = ("run", "status", "events", "cancel")  # what the health gate always requires
CANCEL_ON_STREAM_ERROR = frozenset({"run", "batch_run"})
READ_ONLY = frozenset({"health", "status", "events", "knowledge_query"})  # a temporary error is retried only for these
RETRY_ATTEMPTS = 3
RETRY_PAUSE_SECONDS = 0.2

TERMINAL = frozenset({"completed", "cancelled", "failed"})
LOOPBACK_NAMES = frozenset({"localhost"})

ResultKind = Literal["completed", "cancelled", "failed"]
ChunkKind = Literal["tool", "data", "progress"]


# --- errors ---------------------------------------------------------------------------------------------


class AipError(Exception):
    """Anything the client refuses; ``retryable`` and ``uncertain`` are what it tells the AIP runtime."""

    retryable: bool = False
    uncertain: bool = False


class ConfigError(AipError):
    """The client's own configuration or request is invalid; nothing was sent."""


class HttpError(AipError):
    """A non-2xx answer, classified by status."""

    def __init__(self, status: int, body: str, operation: str) -> None:
        super().__init__(f"{operation}: HTTP {status}: {body[:500]}")
        self.status = status
        self.body = body
        self.operation = operation

    def json(self) -> Any:
        return json.loads(self.body)


class AuthenticationError(HttpError):
    """401/403."""


class TemporaryError(HttpError):
    """429 and every 5xx: retried for read-only operations; for a mutation the outcome is uncertain."""

    def __init__(self, status: int, body: str, operation: str) -> None:
        super().__init__(status, body, operation)
        self.retryable = operation in READ_ONLY
        self.uncertain = not self.retryable


class RejectedError(HttpError):
    """Every other non-2xx status (409, 404, 422, ...): permanent, and the outcome is certain."""

    permanent = True


class TransportFailure(AipError):
    """The connection failed: temporary like a 5xx."""

    def __init__(self, operation: str, cause: Exception) -> None:
        super().__init__(f"{operation}: {type(cause).__name__}: {cause}")
        self.operation = operation
        self.retryable = operation in READ_ONLY
        self.uncertain = not self.retryable


class HealthGateError(AipError):
    """``GET /health`` does not admit this client's configuration: no work is sent."""


class StreamError(AipError):
    """The event stream broke a rule of the client; the client does not resume."""


def classify(status: int, body: str, operation: str) -> HttpError:
    if status in (401, 403):
        return AuthenticationError(status, body, operation)
    if status == 429 or 500 <= status <= 599:
        return TemporaryError(status, body, operation)
    return RejectedError(status, body, operation)


# --- results --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Event:
    name: str
    sequence: int
    data: Any
    payload: dict[str, Any]  # the whole JSON of the frame's ``data:``


@dataclass(frozen=True)
class Chunk:
    kind: ChunkKind
    text: str
    sequence: int


@dataclass
class Result:
    """What the client hands the AIP runtime: the terminal event's ``data`` is the result."""

    kind: ResultKind
    output: dict[str, Any] | None = None  # completed
    details: dict[str, Any] | None = None  # cancelled, failed
    error_code: str | None = None  # failed: execution_failed
    retryable: bool = False
    route: str = ""
    chunks: list[Chunk] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    comments: int = 0  # keep-alives and other comment lines seen
    closed_after_terminal: bool | None = None  # when the stream was drained past its terminal event
    bytes_after_terminal: int = 0

    @property
    def text(self) -> str:
        return "".join(chunk.text for chunk in self.chunks)


def result_from_terminal(event: Event, route: str) -> Result:
    if event.name == "completed":
        if not isinstance(event.data, dict):
            raise StreamError(f"completed event {event.sequence} has no output object: {event.data!r}")
        return Result("completed", output=event.data, route=route)
    details = event.data if isinstance(event.data, dict) else {"data": event.data}
    if event.name == "cancelled":
        return Result("cancelled", details=details, route=route)
    return Result("failed", details=details, error_code="execution_failed", retryable=False, route=route)


def chunk_of(event: Event) -> Chunk | None:
    """Chunk text is ``data.content``, else ``data.data.chunk``; the channel decides the kind."""
    data = event.data if isinstance(event.data, dict) else {}
    text = data.get("content")
    if not isinstance(text, str):
        inner = data.get("data")
        text = inner.get("chunk") if isinstance(inner, dict) else None
    if not isinstance(text, str):
        return None
    channel = data.get("channel")
    kind: ChunkKind = "tool" if channel == "tools" else "data" if channel in ("llm", "messages") else "progress"
    return Chunk(kind, text, event.sequence)


# --- the SSE parser -------------------------------------------------------------------------------------


class SseParser:
    """Incremental: ``feed`` bytes as they arrive, get whole events back.

    Frames end at a blank line (LF LF or CRLF CRLF). The buffer is checked against 1 MiB *before* frames
    are extracted from it, as the real parser does; the body is bounded at 64 MiB and 100,000 events.
    Comments and frames without ``data:`` are skipped; ``data`` must be JSON with an integer
    ``sequence``, contiguous from the cursor.
    """

    def __init__(self, cursor: int = 0) -> None:
        self.expected = cursor
        self.buffer = b""
        self.total_bytes = 0
        self.events = 0
        self.comments = 0

    def feed(self, data: bytes) -> list[Event]:
        """Every event of the frames ``data`` completes (a terminal one does not stop it: see read_stream)."""
        return [event for frame in self.frames(data) if (event := self.parse(frame)) is not None]

    def frames(self, data: bytes) -> list[bytes]:
        """The frames ``data`` completes, undecoded: the bounds are checked here, the rules in ``parse``."""
        self.total_bytes += len(data)
        if self.total_bytes > MAX_STREAM_BYTES:
            raise StreamError(f"event stream body exceeds {MAX_STREAM_BYTES} bytes")
        self.buffer += data
        if len(self.buffer) > MAX_FRAME_BYTES:
            raise StreamError(f"event stream buffer exceeds {MAX_FRAME_BYTES} bytes before a frame ended")
        frames: list[bytes] = []
        buffer, position = self.buffer, 0
        found = {b"\n\n": -2, b"\r\n\r\n": -2}  # -2: not searched yet; -1: not in the buffer
        while True:
            for delimiter, index in found.items():
                if index == -2 or 0 <= index < position:  # searching again only past a used frame
                    found[delimiter] = buffer.find(delimiter, position)
            ends = [(index, len(delimiter)) for delimiter, index in found.items() if index >= 0]
            if not ends:
                break
            index, width = min(ends)
            frames.append(buffer[position : index + width])  # with its delimiter: blank lines parse to nothing
            position = index + width
        self.buffer = buffer[position:]
        return frames

    def parse(self, frame: bytes) -> Event | None:
        name: str | None = None
        data_lines: list[str] = []
        try:
            text = frame.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise StreamError(f"event stream frame is not UTF-8: {exc}") from None
        for line in text.split("\n"):
            line = line.removesuffix("\r")
            if line.startswith(":"):
                self.comments += 1
                continue
            key, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if key == "event":
                name = value
            elif key == "data":
                data_lines.append(value)
        if not data_lines:
            return None
        self.events += 1
        if self.events > MAX_STREAM_EVENTS:
            raise StreamError(f"event stream has more than {MAX_STREAM_EVENTS} events")
        try:
            payload = json.loads("\n".join(data_lines))
        except ValueError as exc:
            raise StreamError(f"event data is not JSON: {exc}") from None
        if not isinstance(payload, dict):
            raise StreamError("event data is not a JSON object")
        sequence = payload.get("sequence")
        if not isinstance(sequence, int) or isinstance(sequence, bool):
            raise StreamError(f"event has no integer sequence: {payload.get('sequence')!r}")
        if sequence != self.expected:
            raise StreamError(f"event sequence {sequence} where {self.expected} was expected")
        self.expected += 1
        if name is None:
            name = payload.get("event")
        if not isinstance(name, str) or not name:
            raise StreamError(f"event {sequence} has no name")
        return Event(name, sequence, payload.get("data"), payload)


def read_stream(
    chunks: Iterable[bytes],
    *,
    cursor: int = 0,
    route: str = "",
    on_event: Callable[[Event], None] | None = None,
    on_comment: Callable[[int], None] | None = None,
    drain: Callable[[], bool] | None = None,
) -> Result:
    """The first terminal event decides; a stream that closes without one is an error.

    ``on_event`` sees each event and ``on_comment`` the count of comment lines (keep-alives) as they come.
    With ``drain`` the body is read on past the terminal event until it closes (or ``drain()`` says to
    stop, e.g. at a deadline), recording whether it closed and how many bytes followed.
    """
    parser = SseParser(cursor)
    seen: list[Event] = []
    chunk_list: list[Chunk] = []
    terminal: Event | None = None
    iterator: Iterator[bytes] = iter(chunks)
    unread: list[bytes] = []
    for data in iterator:
        frames = parser.frames(data)
        for index, frame in enumerate(frames):  # one by one: nothing after the first terminal is looked at
            comments = parser.comments
            event = parser.parse(frame)
            if on_comment is not None and parser.comments > comments:
                on_comment(parser.comments)
            if event is None:
                continue
            seen.append(event)
            if on_event is not None:
                on_event(event)
            if event.name == "chunk" and (chunk := chunk_of(event)) is not None:
                chunk_list.append(chunk)
            if event.name in TERMINAL:
                terminal, unread = event, frames[index + 1 :]
                break
        if terminal is not None:
            break
    if terminal is None:
        raise StreamError("event stream closed without a terminal event")
    result = result_from_terminal(terminal, route)
    result.chunks, result.events, result.comments = chunk_list, seen, parser.comments
    if drain is not None:
        tail = len(parser.buffer) + sum(len(frame) for frame in unread)
        closed = True
        try:
            for data in iterator:
                tail += len(data)
                if not drain():
                    closed = False
                    break
        except httpx.TransportError:
            closed = False
        result.closed_after_terminal, result.bytes_after_terminal = closed, tail
    return result


# --- the client -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Watch:
    """How a test looks into a stream the client reads: events, keep-alives, and reading past the end."""

    on_event: Callable[[Event], None] | None = None
    on_comment: Callable[[int], None] | None = None
    drain_seconds: float | None = None  # read on this long past the terminal event, to see the stream close


def new_action_id() -> str:
    return "act_" + secrets.token_hex(16)


def _compact(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def _check_origin(base_url: str) -> str:
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"base URL must be an http(s) origin: {base_url!r}")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username or parts.password:
        raise ConfigError(f"base URL must be an origin, without path, query or credentials: {base_url!r}")
    if parts.scheme == "http":
        host = parts.hostname
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = host.lower() in LOOPBACK_NAMES
        if not loopback:
            raise ConfigError(f"plain http only on loopback: {base_url!r}")
    return f"{parts.scheme}://{parts.netloc}"


class AipClient:
    """One configured connector: a sidecar origin, a token, the crews and operations it may use."""

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        crews: Iterable[str],
        operations: Iterable[str] = ("run",),
        timeout: float = 60.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = _check_origin(base_url)
        if not token:
            raise ConfigError("a bearer token is required")
        self.crews = tuple(crews)
        self.operations = tuple(operations)
        unknown = set(self.operations) - OPERATIONS
        if unknown:
            raise ConfigError(f"unknown operations: {sorted(unknown)}")
        self.http = httpx.Client(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout,
            transport=transport,
        )

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> AipClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- health gate --

    def check_health(self) -> dict[str, Any]:
        response = self._read_only("health", lambda: self.http.get("/health"))
        try:
            health = response.json()
        except ValueError:
            raise HealthGateError("health answer is not JSON") from None
        if not isinstance(health, dict):
            raise HealthGateError("health answer is not a JSON object")
        if health.get("status") != "ready":
            raise HealthGateError(f"sidecar is not ready: {health.get('status')!r}")
        if health.get("durable_journal") is not True:
            raise HealthGateError(f"sidecar journal is not durable: {health.get('durable_journal')!r}")
        crews, operations = health.get("crews"), health.get("operations")
        if not isinstance(crews, list) or not isinstance(operations, list):
            raise HealthGateError("health answer lacks crews or operations lists")
        missing_crews = [crew for crew in self.crews if crew not in crews]
        if missing_crews:
            raise HealthGateError(f"sidecar does not offer crews {missing_crews}")
        required = dict.fromkeys([*DEFAULT_OPERATIONS, *self.operations])
        missing_ops = [op for op in required if op not in operations]
        if missing_ops:
            raise HealthGateError(f"sidecar does not allow operations {missing_ops}")
        return health

    # -- starting work --

    def start_request(
        self,
        crew_id: str,
        operation: str,
        input: Mapping[str, Any],
        *,
        action_id: str,
        idempotency_key: str,
        timeout_ms: int | None = None,
    ) -> tuple[dict[str, Any], dict[str, str]]:
        if crew_id not in self.crews:
            raise ConfigError(f"crew {crew_id!r} is not configured")
        if operation not in self.operations:
            raise ConfigError(f"operation {operation!r} is not allowed for this connector")
        if not ACTION_ID.fullmatch(action_id):
            raise ConfigError(f"action id must be act_ and 32 hex digits: {action_id!r}")
        if not idempotency_key:
            raise ConfigError("an idempotency key is required")
        if len(_compact(dict(input))) > MAX_INPUT_BYTES:
            raise ConfigError("input exceeds 1 MiB")
        body: dict[str, Any] = {"crew_id": crew_id, "action_id": action_id, "operation": operation, "input": input}
        if timeout_ms is not None:
            body["timeout_ms"] = timeout_ms
        if len(_compact(body)) > MAX_REQUEST_BYTES:
            raise ConfigError("request body exceeds 1 MiB + 64 KiB")
        headers = {"Idempotency-Key": idempotency_key, "X-AIP-Action-ID": action_id}
        return body, headers

    def execute(
        self,
        crew_id: str,
        operation: str,
        input: Mapping[str, Any],
        *,
        action_id: str,
        idempotency_key: str,
        timeout_ms: int | None = None,
        on_event: Callable[[Event], None] | None = None,
        on_comment: Callable[[int], None] | None = None,
        drain_seconds: float | None = None,
    ) -> Result:
        """As the AIP runtime drives an action: stream for run/batch_run/replay/train/test, block for the rest."""
        body, headers = self.start_request(
            crew_id, operation, input, action_id=action_id, idempotency_key=idempotency_key, timeout_ms=timeout_ms
        )
        if operation in BLOCKING:
            return self._blocking(body, headers)
        watch = Watch(on_event, on_comment, drain_seconds)
        return self._streamed(body, headers, watch)

    def invoke(
        self,
        crew_id: str,
        operation: str,
        input: Mapping[str, Any],
        *,
        action_id: str,
        idempotency_key: str,
        timeout_ms: int | None = None,
    ) -> Result:
        """The client's plain ``invoke`` entry point: ``POST /jobs`` for everything; the 2xx body is the output."""
        body, headers = self.start_request(
            crew_id, operation, input, action_id=action_id, idempotency_key=idempotency_key, timeout_ms=timeout_ms
        )
        return self._blocking(body, headers)

    def _blocking(self, body: dict[str, Any], headers: dict[str, str]) -> Result:
        operation = body["operation"]

        def send() -> httpx.Response:
            return self.http.post("/jobs", content=_compact(body), headers=self._json(headers))

        response = self._read_only(operation, send) if operation in READ_ONLY else self._once(operation, send)
        try:
            output = response.json()
        except ValueError:
            raise StreamError(f"{operation}: 2xx answer is not JSON") from None
        if not isinstance(output, dict):
            raise StreamError(f"{operation}: 2xx answer is not a JSON object")
        return Result("completed", output=output, route="POST /jobs")

    def _streamed(
        self,
        body: dict[str, Any],
        headers: dict[str, str],
        watch: Watch,
    ) -> Result:
        operation = body["operation"]
        request_headers = {**self._json(headers), "Accept": "text/event-stream"}
        try:
            with self.http.stream("POST", "/jobs/stream", content=_compact(body), headers=request_headers) as response:
                if not response.is_success:
                    raise classify(response.status_code, response.read().decode(errors="replace"), operation)
                try:
                    return self._consume(response, 0, "POST /jobs/stream", watch)
                except StreamError:
                    if operation in CANCEL_ON_STREAM_ERROR:
                        self._cancel_quietly(body["crew_id"], body["action_id"])
                    raise
        except httpx.TransportError as exc:
            raise TransportFailure(operation, exc) from exc

    def _consume(
        self,
        response: httpx.Response,
        cursor: int,
        route: str,
        watch: Watch,
    ) -> Result:
        content_type = response.headers.get("content-type", "")
        if not content_type.startswith("text/event-stream"):
            raise StreamError(f"{route} answered {content_type!r}, not text/event-stream")
        drain: Callable[[], bool] | None = None
        if watch.drain_seconds is not None:
            seconds, deadline = watch.drain_seconds, [0.0]

            def drain() -> bool:
                if not deadline[0]:
                    deadline[0] = time.monotonic() + seconds
                return time.monotonic() < deadline[0]

        try:
            return read_stream(
                response.iter_bytes(),
                cursor=cursor,
                route=route,
                on_event=watch.on_event,
                on_comment=watch.on_comment,
                drain=drain,
            )
        except httpx.TransportError as exc:
            raise StreamError(f"event stream broke: {type(exc).__name__}: {exc}") from exc

    def _cancel_quietly(self, crew_id: str, action_id: str) -> None:
        with contextlib.suppress(AipError):
            self.cancel(action_id, crew_id, CANCEL_REASON)

    # -- status, events, cancel --

    def status(self, action_id: str) -> dict[str, Any]:
        response = self._read_only(
            "status", lambda: self.http.get(f"/jobs/{action_id}", headers={"X-AIP-Action-ID": action_id})
        )
        record = response.json()
        if not isinstance(record, dict):
            raise StreamError("status answer is not a JSON object")
        return record

    def cancel(self, action_id: str, crew_id: str, reason: str) -> dict[str, Any] | None:
        """Any 2xx, empty or JSON, confirms."""
        body = {"crew_id": crew_id, "action_id": action_id, "reason": reason}
        headers = self._json({"Idempotency-Key": f"cancel-{action_id}", "X-AIP-Action-ID": action_id})
        response = self._once(
            "cancel", lambda: self.http.post(f"/jobs/{action_id}/cancel", content=_compact(body), headers=headers)
        )
        if not response.content:
            return None
        try:
            answer = response.json()
        except ValueError:
            return None
        return answer if isinstance(answer, dict) else None

    def events_json(self, action_id: str, cursor: int = 0) -> list[Event]:
        """Re-read as JSON, page after page, from ``cursor`` through the terminal event."""
        events: list[Event] = []
        expected = cursor
        while True:
            page_cursor = expected
            response = self._read_only(
                "events",
                lambda page_cursor=page_cursor: self.http.get(
                    f"/jobs/{action_id}/events",
                    params={"cursor": page_cursor},
                    headers={"X-AIP-Action-ID": action_id},
                ),
            )
            page = response.json()
            if not isinstance(page, dict) or not isinstance(page.get("events"), list):
                raise StreamError("events answer is not an object with an events list")
            if page.get("cursor") != page_cursor:
                raise StreamError(f"events page starts at {page.get('cursor')!r}, not {page_cursor}")
            for payload in page["events"]:
                sequence = payload.get("sequence") if isinstance(payload, dict) else None
                if not isinstance(sequence, int) or isinstance(sequence, bool) or sequence != expected:
                    raise StreamError(f"event sequence {sequence!r} where {expected} was expected")
                name = payload.get("event")
                if not isinstance(name, str) or not name:
                    raise StreamError(f"event {sequence} has no name")
                events.append(Event(name, sequence, payload.get("data"), payload))
                expected += 1
                if name in TERMINAL:
                    return events
            if page.get("next_cursor") != expected:
                raise StreamError(f"next_cursor {page.get('next_cursor')!r} where {expected} was expected")
            if not page["events"]:
                return events  # the job has no terminal event yet

    def events_stream(
        self, action_id: str, cursor: int = 0, *, on_event: Callable[[Event], None] | None = None
    ) -> Result:
        """Re-read as SSE (``Accept: text/event-stream``): contiguous from ``cursor``, ending in a terminal event."""
        headers = {"Accept": "text/event-stream", "X-AIP-Action-ID": action_id}
        route = "GET /jobs/{id}/events"
        for attempt in range(RETRY_ATTEMPTS):
            try:
                with self.http.stream(
                    "GET", f"/jobs/{action_id}/events", params={"cursor": cursor}, headers=headers
                ) as response:
                    if not response.is_success:
                        error = classify(response.status_code, response.read().decode(errors="replace"), "events")
                        if error.retryable and attempt + 1 < RETRY_ATTEMPTS:
                            time.sleep(RETRY_PAUSE_SECONDS)
                            continue
                        raise error
                    return self._consume(response, cursor, route, Watch(on_event))
            except httpx.TransportError as exc:
                if attempt + 1 >= RETRY_ATTEMPTS:
                    raise TransportFailure("events", exc) from exc
                time.sleep(RETRY_PAUSE_SECONDS)
        raise AssertionError("unreachable")

    # -- plumbing --

    @staticmethod
    def _json(headers: Mapping[str, str]) -> dict[str, str]:
        return {**headers, "Content-Type": "application/json"}

    def _once(self, operation: str, send: Callable[[], httpx.Response]) -> httpx.Response:
        try:
            response = send()
        except httpx.TransportError as exc:
            raise TransportFailure(operation, exc) from exc
        if not response.is_success:
            raise classify(response.status_code, response.text, operation)
        return response

    def _read_only(self, operation: str, send: Callable[[], httpx.Response]) -> httpx.Response:
        for attempt in range(RETRY_ATTEMPTS):
            try:
                return self._once(operation, send)
            except AipError as error:
                if not error.retryable or attempt + 1 >= RETRY_ATTEMPTS:
                    raise
                time.sleep(RETRY_PAUSE_SECONDS)
        raise AssertionError("unreachable")
