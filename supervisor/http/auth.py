"""Bearer authentication as ASGI middleware: it answers before routing, validation or body reads."""

from __future__ import annotations

import hmac

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

CHALLENGE = [(b"www-authenticate", b"Bearer")]


class BearerAuth:
    """The whole Authorization header, compared in constant time, on every route."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode() if token else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.expected is not None:
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                body = orjson.dumps({"detail": "missing or invalid bearer token"})
                headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)), *CHALLENGE]
                await send({"type": "http.response.start", "status": 401, "headers": headers})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)
