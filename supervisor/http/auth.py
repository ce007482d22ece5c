"""Bearer authentication as ASGI middleware: it answers before routing, validation or body reads."""

from __future__ import annotations

import hmac

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

CHALLENGE = [(b"www-authenticate", b"Bearer")]
JSON = (b"content-type", b"application/json")


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
        if scope["type"] == "http" and self.expected is not None and not self._is_public(scope):
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
