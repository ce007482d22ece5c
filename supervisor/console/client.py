"""The operator CLI's side of the wire: where the supervisor is, its token, and every failure as one line."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from typing import Any

import httpx
import orjson

from supervisor.config import PREFIX
from supervisor.console import sse
from supervisor.console.reconnect import GaveUp, Reconnect
from supervisor.enums import TERMINAL_EVENTS
from supervisor.tokens import MAX_FILE_BYTES

DEFAULT_URL = "http://127.0.0.1:8090"
SSE = {"Accept": "text/event-stream"}
# What a supervisor, or a proxy before it, answers while it restarts: an outage to wait out, once it has answered.
PASSING = frozenset({502, 503, 504})
# Streams are idle between heartbeats (15 s by default): a read this long without a byte means a dead link.
TIMEOUT = httpx.Timeout(30.0, connect=5.0, read=60.0)

Opener = Callable[[int | None], AbstractContextManager[httpx.Response]]


class OperatorError(Exception):
    """What went wrong, said in one line; the CLI prints it and exits non-zero."""


class Unsettled(OperatorError):
    """A follower gave up after its request may have reached the server: what it asked for may be under way."""


@dataclasses.dataclass(frozen=True)
class Target:
    url: str
    token: str | None


def resolve_target(
    url: str | None, token: str | None, token_file: str | None, environ: Mapping[str, str] = os.environ
) -> Target:
    """Flags win over the environment, as with ``serve``; the token file is the server's own setting name."""
    token_file = token_file or (None if token else environ.get(PREFIX + "BEARER_TOKEN_FILE"))
    token = token or (None if token_file else environ.get(PREFIX + "BEARER_TOKEN"))
    if token_file:
        try:
            with open(token_file) as file:  # a server's file may hold several, one a line: the first is used
                token = next(iter(file.read(MAX_FILE_BYTES).split()), "")
        except (OSError, UnicodeDecodeError) as exc:
            raise OperatorError(f"cannot read the token file {token_file}: {exc}") from None
    return Target((url or environ.get(PREFIX + "URL") or DEFAULT_URL).rstrip("/"), token or None)


class Client:
    """Blocking httpx calls that either return JSON or raise OperatorError, never a transport traceback."""

    def __init__(self, target: Target) -> None:
        self.url = target.url
        headers = {"Authorization": f"Bearer {target.token}"} if target.token else {}
        self._http = httpx.Client(base_url=target.url, headers=headers, timeout=TIMEOUT)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.close()

    def get(self, path: str, params: Mapping[str, Any] | None = None) -> Any:
        with self._talking():
            response = self._http.get(path, params={k: v for k, v in (params or {}).items() if v is not None})
        return self._json(response)

    def found(self, path: str) -> bool:
        """Whether ``path`` names something: False for a 404; any other refusal raises, as ``get``'s."""
        with self._talking():
            response = self._http.get(path)
        if response.status_code == 404:
            return False
        self._json(response)
        return True

    def post(self, path: str, body: Mapping[str, Any], headers: Mapping[str, str] | None = None) -> Any:
        with self._talking():
            response = self._http.post(path, json=body, headers=headers)
        return self._json(response)

    def follow(self, action_id: str, wait: float) -> Iterator[dict[str, Any]]:
        """A job's events from the first through the terminal one, resuming after a lost link for up to ``wait``
        seconds (``reconnect.py``)."""

        def reopen(last: int | None) -> AbstractContextManager[httpx.Response]:
            return self._http.stream("GET", job_path(action_id, "events"), headers={**SSE, **resume_header(last)})

        return self._resumable(reopen, wait)

    def start(
        self, body: Mapping[str, Any], key: str, wait: float, accepted: Callable[[], None], path: str = "/jobs/stream"
    ) -> Iterator[dict[str, Any]]:
        """Start a job and follow it (``path``: the route that starts it, streamed: a start's, or a resume's);
        ``accepted`` is called once the server took the start (a refusal raises first). A reconnect repeats the
        exact start, which observes the same job."""

        def reopen(last: int | None) -> AbstractContextManager[httpx.Response]:
            headers = {**SSE, "Idempotency-Key": key, **resume_header(last)}
            return self._http.stream("POST", path, json=body, headers=headers)

        return self._resumable(reopen, wait, accepted)

    def admit(self, body: Mapping[str, Any], key: str, path: str = "/jobs/stream") -> None:
        """Start a job (``path`` as ``start``'s) and leave it: returns once it is admitted (durable), before it has a
        worker. Hanging up never cancels a job."""
        headers = {**SSE, "Idempotency-Key": key}
        with self._talking():
            try:
                with self._http.stream("POST", path, json=body, headers=headers) as response:
                    if response.is_error:
                        response.read()
                        self._json(response)
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout):
                raise  # nothing was sent: a plain failure
            except httpx.TransportError as exc:  # sent, then no answer: the start may have been admitted
                raise Unsettled(f"{self.url} did not answer the start: {_reason(exc)}") from None

    def _resumable(
        self, reopen: Opener, wait: float, accepted: Callable[[], None] = lambda: None
    ) -> Iterator[dict[str, Any]]:
        """Until the first answer, a refusal or a refused connection is the command's end (one line, exit 1);
        once the server has answered, or a request may have reached it (sent, then no answer: a start it may have
        admitted), a lost link, or a 502/503/504 while it restarts, is an outage to wait out (``Unsettled`` at
        the end of ``wait``)."""
        last: int | None = None
        opened = reached = False
        link = Reconnect(self.url, wait)
        while True:
            try:
                with reopen(last) as response:
                    if response.is_error and not (reached and response.status_code in PASSING):
                        response.read()
                        self._json(response)
                    if response.is_error:
                        reason = f"{response.status_code} {response.reason_phrase}"
                    else:
                        if not opened:
                            opened = reached = True
                            accepted()
                        # a partial last one is asked for again
                        for event in sse.events(sse.lines(_noting(response.iter_bytes(), link, last))):
                            yield event
                            last = event["sequence"]
                            if event["event"] in TERMINAL_EVENTS:
                                return
                        reason = "the stream ended before the job did"
            except sse.StreamError as exc:  # resuming would read the same bytes again
                raise OperatorError(f"the event stream from {self.url} is broken: {exc}") from None
            except httpx.TransportError as exc:
                unsent = isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)
                if not reached and isinstance(exc, httpx.ConnectError):
                    raise OperatorError(f"cannot connect to {self.url}: {_reason(exc)}") from None
                reached, reason = reached or not unsent, _reason(exc)
            try:
                pause = link.lost(reason, last)
            except GaveUp as exc:
                raise (Unsettled if reached else OperatorError)(str(exc)) from None
            time.sleep(pause)

    @contextlib.contextmanager
    def _talking(self) -> Iterator[None]:
        try:
            yield
        except httpx.ConnectError as exc:
            raise OperatorError(f"cannot connect to {self.url}: {_reason(exc)}") from None
        except httpx.TimeoutException:
            raise OperatorError(f"{self.url} did not answer in time") from None
        except httpx.HTTPError as exc:
            raise OperatorError(f"talking to {self.url} failed: {_reason(exc)}") from None

    def _json(self, response: httpx.Response) -> Any:
        try:
            body = response.json()
        except ValueError:
            body = None
        if response.status_code == 401:
            raise OperatorError(
                f"{self.url} refused the bearer token (401); give --token, --token-file or {PREFIX}BEARER_TOKEN"
            )
        if response.is_error:
            detail = body.get("detail") if isinstance(body, dict) else None
            raise OperatorError(f"{response.status_code} from {response.request.url.path}: {_detail(detail, response)}")
        return body


def job_path(action_id: str, *rest: str) -> str:
    """``/jobs/{id}/…`` with the id percent-encoded: ``?``, ``#`` or ``%`` in an id are part of it, not of
    the URL (``show 'a?b#c'`` asks for job ``a?b#c``, not ``a``)."""
    return "/".join(("/jobs", urllib.parse.quote(action_id, safe=""), *rest))


def _noting(chunks: Iterator[bytes], link: Reconnect, resume_after: int | None) -> Iterator[bytes]:
    """``chunks``, telling ``link`` that each one came: a heartbeat says as well as an event that the link is back."""
    for chunk in chunks:
        link.alive(resume_after)
        yield chunk


def resume_header(last: int | None) -> dict[str, str]:
    return {} if last is None else {"Last-Event-ID": str(last)}


def _detail(detail: Any, response: httpx.Response) -> str:
    """FastAPI's validation errors are a list of {loc, msg}: name the field, keep one line."""
    if isinstance(detail, str):
        return detail
    if isinstance(detail, list) and detail and all(isinstance(item, dict) for item in detail):
        return "; ".join(f"{'.'.join(map(str, item.get('loc', [])[1:]))}: {item.get('msg')}" for item in detail)
    return orjson.dumps(detail).decode()[:300] if detail else response.reason_phrase


def _reason(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[-1] if text else type(exc).__name__
