"""Bearer authentication as ASGI middleware: it answers before routing, validation or body reads.

It also refuses what is ambiguous, with one rule: a header or a query parameter that decides something may
come once (two Authorization headers, two Idempotency-Keys, ``?status=`` twice are each a 400, since
frameworks and proxies disagree on which one counts), and anything but HTTP (the server speaks no websockets;
a scope of another kind is closed unanswered, so a route added later is not open by default).
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from urllib.parse import parse_qsl

import orjson
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from supervisor.enums import Role
from supervisor.scopes import allows, needed, refusal
from supervisor.tokens import Credentials

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
    """The whole Authorization header (exactly one), compared in constant time with every token, on every route but
    ``public``: 401 without a token of any role, 403 with one whose role the route does not allow
    (``supervisor/scopes.py``). ``credentials`` None: no token at all (``ALLOW_UNAUTHENTICATED``).

    ``public`` are exact paths read with GET or HEAD: the console's files, which hold no data (a browser
    cannot send a header when it loads a page; the page sends the token on each call it makes). ``routes`` are
    the app's, each as a route of its own (FastAPI keeps an included router's behind one), to find the one a request
    goes to.
    """

    def __init__(
        self,
        app: ASGIApp,
        credentials: Credentials | None,
        routes: Sequence[BaseRoute] = (),
        public: frozenset[str] = frozenset(),
    ) -> None:
        self.app = app
        self.credentials = credentials
        self.routes = routes
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
        if self.credentials is not None and not self._is_public(scope):
            given = [value for name, value in scope["headers"] if name == b"authorization"]
            role = self.credentials.role_of(given[0] if given else b"")
            if role is None:
                await answer(send, 401, "missing or invalid bearer token", CHALLENGE)
                return
            if problem := self._beyond(role, scope):
                await answer(send, 403, problem, [])
                return
        if problem := ambiguity(headers, scope["query_string"]):
            await answer(send, 400, problem, [])
            return
        await self.app(scope, receive, send)

    def _beyond(self, role: Role, scope: Scope) -> str | None:
        """Why ``role`` may not do what ``scope`` asks, or None (no route takes it: any known token gets the
        router's own answer, as the contract's does)."""
        if role == Role.CONTRACT or (route := needed(self.routes, scope)) is None:
            return None
        needs_role, path = route
        return None if allows(role, needs_role) else refusal(role, needs_role, scope["method"], path)


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
