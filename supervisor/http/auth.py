"""Bearer authentication as ASGI middleware: it answers before routing, validation or body reads."""

from __future__ import annotations

import hmac

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

CHALLENGE = [(b"www-authenticate", b"Bearer")]
JSON = (b"content-type", b"application/json")


class BearerAuth:
    """The whole Authorization header (exactly one), compared in constant time, on every route."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode() if token else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.expected is not None:
            given = [value for name, value in scope["headers"] if name == b"authorization"]
            # Two headers are ambiguous (proxies and frameworks disagree on which one counts): neither is.
            if len(given) > 1:
                await answer(send, 400, "more than one Authorization header", [])
                return
            if not hmac.compare_digest(given[0] if given else b"", self.expected):
                await answer(send, 401, "missing or invalid bearer token", CHALLENGE)
                return
        await self.app(scope, receive, send)


async def answer(send: Send, status: int, detail: str, extra: list[tuple[bytes, bytes]]) -> None:
    body = orjson.dumps({"detail": detail})
    headers = [JSON, (b"content-length", b"%d" % len(body)), *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
