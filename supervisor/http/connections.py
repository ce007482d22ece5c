"""Connections that cost an attacker nothing must not cost us a descriptor for long.

uvicorn arms its keep-alive timer only after a first response, so a socket that never sends a byte is
held forever, and its ``limit_concurrency`` counts those sockets too: with the table full of silent
sockets it would answer 503 to everyone, a fresh ``/health`` included. Here instead:

- every connection must complete a request's headers within ``HEADER_TIMEOUT_SECONDS`` of being
  accepted (or of its previous response), else it is closed: silent sockets, slowloris and idle
  keep-alive alike;
- at most ``MAX_CONNECTIONS`` are kept. A newcomer beyond that closes the oldest connection still
  waiting for its headers; only when every one is serving a request (a stream, a blocking start) is
  the newcomer answered 503 with ``Retry-After`` and closed. Streams are never cut for a newcomer.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\nretry-after: 1\r\n"
    b"connection: close\r\ncontent-length: 20\r\n\r\ntoo many connections"
)
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


class _Guard:
    """Shared by every connection of one server."""

    def __init__(self, limit: int, header_timeout: float) -> None:
        self.limit = limit
        self.header_timeout = header_timeout
        self.waiting: dict[GuardedProtocol, None] = {}  # no complete request headers yet, oldest first
        self.shed: set[GuardedProtocol] = set()  # closed by us, their descriptors not yet released

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
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._await_headers()
        if len(self.connections) - len(self.guard.shed) > self.guard.limit and not self.guard.make_room(self):
            transport.write(BUSY)
            self.close()

    def on_headers_complete(self) -> None:
        self._headers_arrived()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # Idle again, unless a pipelined request is already being served: its headers have arrived.
        if not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete):
            self._await_headers()

    def connection_lost(self, exc: Exception | None) -> None:
        self._headers_arrived()
        self.guard.shed.discard(self)
        super().connection_lost(exc)

    def close(self) -> None:
        self._headers_arrived()
        if not self.transport.is_closing():
            self.guard.shed.add(self)
            self.transport.close()

    def _await_headers(self) -> None:
        self._headers_arrived()
        self.guard.waiting[self] = None
        self._deadline = self.loop.call_later(self.guard.header_timeout, self.close)

    def _headers_arrived(self) -> None:
        self.guard.waiting.pop(self, None)
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None


def guarded_protocol(limit: int, header_timeout: float) -> type[GuardedProtocol]:
    """The protocol class for one server: uvicorn makes one instance per connection."""
    return type("GuardedProtocol", (GuardedProtocol,), {"guard": _Guard(limit, header_timeout)})
