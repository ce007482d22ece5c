"""Bearer authentication as ASGI middleware: it answers before routing, validation or body reads.

It also refuses what is ambiguous, with one rule: a header or a query parameter that decides something may
come once (two Authorization headers, two Idempotency-Keys, ``?status=`` twice are each a 400, since
frameworks and proxies disagree on which one counts), and anything but HTTP (the server speaks no websockets;
a scope of another kind is closed unanswered, so a route added later is not open by default).
"""

from __future__ import annotations

import collections
import hmac
from urllib.parse import parse_qsl

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

CHALLENGE = [(b"www-authenticate", b"Bearer")]
JSON = (b"content-type", b"application/json")
# The request headers any route reads to decide what to do.
DECIDING = (
    b"authorization",
    b"idempotency-key",
    b"last-event-id",
    b"accept",
    b"content-type",
    b"x-aip-action-id",
    b"x-aip-archive-confirmation",
)


class BearerAuth:
    """The whole Authorization header (exactly one), compared in constant time, on every route but ``public``.

    ``public`` are exact paths read with GET or HEAD: the console's files, which hold no data (a browser
    cannot send a header when it loads a page; the page sends the token on each call it makes).
    """

    def __init__(self, app: ASGIApp, token: str | None, public: frozenset[str] = frozenset()) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode() if token else None
        self.public = public

    def _is_public(self, scope: Scope) -> bool:
        return scope["path"] in self.public and scope["method"] in ("GET", "HEAD")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":
            await send({"type": "websocket.close", "code": 1008})
            return
        headers = [name for name, _ in scope["headers"]]
        if headers.count(b"authorization") > 1:  # judged before the token: neither of two is the token
            await answer(send, 400, "more than one Authorization header", [])
            return
        if self.expected is not None and not self._is_public(scope):
            given = [value for name, value in scope["headers"] if name == b"authorization"]
            if not hmac.compare_digest(given[0] if given else b"", self.expected):
                await answer(send, 401, "missing or invalid bearer token", CHALLENGE)
                return
        if problem := ambiguity(headers, scope["query_string"]):
            await answer(send, 400, problem, [])
            return
        await self.app(scope, receive, send)


def ambiguity(headers: list[bytes], query: bytes) -> str | None:
    """What makes a request ambiguous: a deciding header or a query parameter given more than once."""
    for name in DECIDING:
        if headers.count(name) > 1:
            return f"more than one {name.decode().title()} header"
    counts = collections.Counter(name for name, _ in parse_qsl(query.decode("latin-1"), keep_blank_values=True))
    repeated = sorted(name for name, count in counts.items() if count > 1)
    return f"query parameter {repeated[0]!r} given more than once" if repeated else None


async def answer(send: Send, status: int, detail: str, extra: list[tuple[bytes, bytes]]) -> None:
    body = orjson.dumps({"detail": detail})
    headers = [JSON, (b"content-length", b"%d" % len(body)), *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
