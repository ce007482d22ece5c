"""Connections that cost an attacker nothing must not cost us a descriptor, memory or the event loop for long.

uvicorn arms its keep-alive timer only after a first response, so a socket that never sends a byte is
held forever, and its ``limit_concurrency`` counts those sockets too: with the table full of silent
sockets it would answer 503 to everyone, a fresh ``/health`` included. httptools bounds nothing: it builds
a header's value by concatenation, each read's piece onto the last (a 64 MiB header kept the loop busy for
seconds), keeps every header however many, and a buffer of pipelined requests is parsed whole, each one
queued with its own request cycle (1 MiB of them held ~60 MB). Here instead, for every connection, before
any request reaches the app (and so before auth):

- every connection must complete a request's headers within ``HEADER_TIMEOUT_SECONDS`` of being
  accepted (or of its previous response), else it is closed: silent sockets, slowloris and idle
  keep-alive alike;
- a request's line and headers together may take ``MAX_HEADER_BYTES``, one header line ``HEADER_LINE_BYTES``,
  and there may be ``MAX_HEADERS`` of them: past any, 431 and the connection closed (a request target counts
  in the first bound only: a page cursor of the API's longest, percent-encoded, takes ~24 KiB). The parser is
  fed at most what the headers may still take, so it never holds more (but for a request that came in the read
  that ended the one before: httptools says not where that one ended, so that read's bytes of it are not
  counted, and it may take up to twice as much);
- any request of a connection refused (431, 400, 408) is answered as the first would be: after the answers to
  the requests before it, then the connection is closed;
- while an answer is pending, no further request is read: what came with it waits, unparsed, and reading
  stops until the answer is sent; more than ``MAX_PIPELINED`` requests parsed from one read closes the
  connection;
- a request's body must arrive within ``BODY_TIMEOUT_SECONDS`` of its headers (408, closed), and a client
  that reads nothing of an answer for ``SEND_TIMEOUT_SECONDS`` while it waits to be sent is cut off;
- when a connection that brought a megabyte or more has gone, the memory the C allocator holds free is
  given back to the system (``malloc_trim``, a second later, once for a burst): glibc keeps freed large
  buffers for reuse, so a burst of big requests left the supervisor at its peak RSS until restarted;
- at most ``MAX_CONNECTIONS`` are kept. A newcomer beyond that closes the oldest connection still
  waiting for its headers; only when every one is serving a request (a stream, a blocking start) is
  the newcomer answered 503 with ``Retry-After`` and closed. Streams are never cut for a newcomer.

httptools rather than h11 (whose size cap uvicorn exposes): measured here with the same bounds, a request
cost the server 150-290 µs of CPU with httptools and 400-430 µs with h11, one with 100 headers of 300 bytes
230-380 against 1,000-1,210 µs.
"""

from __future__ import annotations

import asyncio
import ctypes
import dataclasses
from typing import Any, ClassVar

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\nretry-after: 1\r\n"
    b"connection: close\r\ncontent-length: 20\r\n\r\ntoo many connections"
)
HEADER_LINE_BYTES = 8192  # nginx's large_client_header_buffers: one line
MAX_HEADERS = 100  # what http.client and h11's users meet elsewhere
MAX_PIPELINED = 16  # requests queued behind a pending answer, parsed from what one read brought
LARGE_BYTES = 1024 * 1024  # what a connection brings before its end gives freed memory back
TRIM_DELAY = 1.0  # seconds: one trim for a burst of such connections, after the last
BASE_DESCRIPTORS = 64  # the interpreter, the journal and its lock, logs, the fork server's socket
DESCRIPTORS_PER_WORKER = 8  # four pipes' ends, a pidfd, a cgroup's files
MAX_BACKLOG = 2048  # uvicorn's default


def budget(max_connections: int, open_files: int, max_concurrency: int) -> tuple[int, int]:
    """The connection cap and listen backlog that fit in ``open_files`` beside the workers' descriptors.

    A burst of up to ``backlog`` connections is accepted before any of them is seen (asyncio accepts in
    a batch), and a shed connection's descriptor is released on the next loop pass: both are headroom.
    """
    backlog = min(MAX_BACKLOG, max(16, open_files // 8))
    reserve = BASE_DESCRIPTORS + DESCRIPTORS_PER_WORKER * max_concurrency + backlog
    return max(1, min(max_connections, open_files - reserve)), backlog


@dataclasses.dataclass(frozen=True)
class Bounds:
    """What one connection may hold or take (the settings of the same names)."""

    max_connections: int
    header_timeout: float
    max_header_bytes: int
    body_timeout: float
    send_timeout: float


class _Refusal(Exception):
    """A request over a bound: the status to answer (None: close without one) and why."""

    def __init__(self, status: int | None, reason: str) -> None:
        self.status, self.reason = status, reason


class _Guard:
    """Shared by every connection of one server."""

    def __init__(self, bounds: Bounds) -> None:
        self.bounds = bounds
        self.waiting: dict[GuardedProtocol, None] = {}  # no complete request headers yet, oldest first
        self.shed: set[GuardedProtocol] = set()  # closed by us, their descriptors not yet released
        self._trim: asyncio.TimerHandle | None = None

    def give_back_soon(self, loop: asyncio.AbstractEventLoop) -> None:
        """Trim the allocator a moment from now (once, however many large connections end meanwhile)."""
        if self._trim is not None:
            self._trim.cancel()
        self._trim = loop.call_later(TRIM_DELAY, _trim_allocator)

    def make_room(self, newcomer: GuardedProtocol) -> bool:
        """Close the oldest connection still waiting for its headers; False when none is."""
        for victim in self.waiting:
            if victim is not newcomer:
                victim.close()
                return True
        return False


class GuardedProtocol(HttpToolsProtocol):
    guard: ClassVar[_Guard]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None  # for the headers (header timeout)
        self._body_deadline: asyncio.TimerHandle | None = None
        self._send_deadline: asyncio.TimerHandle | None = None
        self._head_bytes: int | None = 0  # fed since the request began; None once its headers are complete
        self._header_count = 0
        self._unparsed = b""  # read while an answer was pending: parsed once it is sent
        self._refusal: _Refusal | None = None  # of a request behind a pending answer: answered once that is sent
        self._received = 0

    # The connection ------------------------------------------------------------------------------------

    # uvicorn's protocols narrow asyncio's BaseTransport to the Transport a TCP connection is, ignoring it as we do.
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._await_headers()
        crowded = len(self.connections) - len(self.guard.shed) > self.guard.bounds.max_connections
        if crowded and not self.guard.make_room(self):
            transport.write(BUSY)
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._headers_arrived()
        for timer in (self._body_deadline, self._send_deadline):
            if timer is not None:
                timer.cancel()
        self._unparsed = b""
        self.guard.shed.discard(self)
        if self._received >= LARGE_BYTES:
            self.guard.give_back_soon(self.loop)
        super().connection_lost(exc)

    def close(self) -> None:
        self._headers_arrived()
        if not self.transport.is_closing():
            self.guard.shed.add(self)
            self.transport.close()

    # Reading: never more than the bounds allow, and nothing more while an answer is pending -------------

    def data_received(self, data: bytes) -> None:
        self._unset_keepalive_if_required()
        self._received += len(data)
        if self._refusal is not None:  # nothing after a refused request is read
            return
        if self._unparsed or self._answer_pending():
            self._unparsed += data
            self.flow.pause_reading()
            return
        self._feed(data)

    def _feed(self, data: bytes) -> None:
        view = memoryview(data)
        while view and not self.transport.is_closing():
            if self._answer_pending():  # a request was parsed and is being answered: read on after it
                self._unparsed = bytes(view)
                self.flow.pause_reading()
                return
            room = self.guard.bounds.max_header_bytes
            if self._head_bytes is not None:
                room -= self._head_bytes
                if room <= 0:
                    self._refuse(_Refusal(431, "request headers too large"))
                    return
            piece, view = view[:room], view[room:]
            if self._head_bytes is not None:
                self._head_bytes += len(piece)
            try:
                self.parser.feed_data(piece)
            except httptools.HttpParserCallbackError as exc:
                refusal = exc.__context__ if isinstance(exc.__context__, _Refusal) else None
                self._refuse(refusal or _Refusal(400, "Invalid HTTP request received."))
                return
            except httptools.HttpParserError:
                self._refuse(_Refusal(400, "Invalid HTTP request received."))
                return
            except httptools.HttpParserUpgrade:
                self._unsupported_upgrade_warning()  # no websockets here: it was answered as plain HTTP
                return

    def _answer_pending(self) -> bool:
        return self.cycle is not None and not self.cycle.response_complete and self._head_bytes is not None

    def _refuse(self, refusal: _Refusal) -> None:
        """Answer the request ``refusal`` refuses and close, whichever request of the connection it is: once the
        answers to the requests before it are sent (pipelined ones parsed with it), never into another's answer."""
        if refusal.status is not None and self._answers_owed():
            self._refusal = refusal
            self.flow.pause_reading()
            return
        # In its body, a request has its own cycle: an answer it began cannot be replaced.
        began = self._head_bytes is None and self.cycle is not None and self.cycle.response_started
        if refusal.status is not None and not began:
            phrase = STATUS_LINE[refusal.status]
            body = refusal.reason.encode()
            head = b"content-type: text/plain; charset=utf-8\r\nconnection: close\r\ncontent-length: %d\r\n\r\n"
            self.transport.write(phrase + head % len(body) + body)
        self.close()

    def _answers_owed(self) -> bool:
        """Whether an answer to a request before the one being read is still to be sent: in its head, that of the
        connection's last cycle; in its body (its own cycle the last), that of one it still waits behind."""
        if self._head_bytes is not None:
            return self.cycle is not None and not self.cycle.response_complete
        return any(cycle is self.cycle for cycle, _ in self.pipeline)

    # Parser callbacks ----------------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._header_count = 0
        if self._head_bytes is None:
            self._head_bytes = 0

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        if self._header_count > MAX_HEADERS:
            raise _Refusal(431, f"more than {MAX_HEADERS} request headers")
        if len(name) + len(value) > HEADER_LINE_BYTES:
            raise _Refusal(431, "a request header line too large")
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._headers_arrived()
        self._head_bytes = None
        super().on_headers_complete()
        if len(self.pipeline) > MAX_PIPELINED:
            raise _Refusal(None, "too many pipelined requests")
        self._body_deadline = self.loop.call_later(self.guard.bounds.body_timeout, self._body_too_slow)

    def on_message_complete(self) -> None:
        if self._body_deadline is not None:
            self._body_deadline.cancel()
            self._body_deadline = None
        self._head_bytes = 0  # what follows is the next request's head
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._refusal is not None and not self._answers_owed():
            self._refuse(self._refusal)
            return
        # Idle again, unless a pipelined request is already being served: its headers have arrived.
        if not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete):
            self._await_headers()
            if self._unparsed:  # what came while the answer was pending
                data, self._unparsed = self._unparsed, b""
                self.flow.resume_reading()
                self._feed(data)

    # Timers ----------------------------------------------------------------------------------------------

    def _body_too_slow(self) -> None:
        self._body_deadline = None
        self._refuse(_Refusal(408, "the request body did not arrive in time"))

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._send_deadline is None:
            self._send_deadline = self.loop.call_later(self.guard.bounds.send_timeout, self._not_reading)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._send_deadline is not None:
            self._send_deadline.cancel()
            self._send_deadline = None

    def _not_reading(self) -> None:
        """The client read nothing of what waits to be sent for the send timeout: drop it and what waits."""
        self._send_deadline = None
        self.guard.shed.add(self)
        self.transport.abort()

    def _await_headers(self) -> None:
        self._headers_arrived()
        self.guard.waiting[self] = None
        self._deadline = self.loop.call_later(self.guard.bounds.header_timeout, self.close)

    def _headers_arrived(self) -> None:
        self.guard.waiting.pop(self, None)
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None


def _trim_allocator() -> None:
    """glibc's ``malloc_trim``; elsewhere (musl) nothing."""
    trim = getattr(_LIBC, "malloc_trim", None)
    if trim is not None:
        trim(0)


_LIBC = ctypes.CDLL(None)


def guarded_protocol(bounds: Bounds) -> type[GuardedProtocol]:
    """The protocol class for one server: uvicorn makes one instance per connection."""
    return type("GuardedProtocol", (GuardedProtocol,), {"guard": _Guard(bounds)})
