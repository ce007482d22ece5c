"""Every bound of the contract, just inside and just outside, as one table; then a slowloris.

A start that passes every bound names a crew that does not exist, so it ends at the 404 "unknown crew '…'"
(the last check before admission in the reference's order) and starts nothing: 404 there means "accepted".
"""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson
import pytest

from tests.conftest import Server

MIB = 1024 * 1024
KEY = "bounds-key"
ACCEPTED = 404  # see the module docstring
UNKNOWN_CREW = "unknown crew '"
JSON = {"Content-Type": "application/json"}
FINISHED = "finished"  # a completed demo job the read, cursor and cancel rows use


def start(**fields: Any) -> dict[str, Any]:
    return {"crew_id": "no-such-crew", "action_id": "bounds", **fields}


def sized_input(encoded_bytes: int) -> dict[str, str]:
    """An input whose canonical encoding, ``{"a":"xx…"}``, is exactly ``encoded_bytes`` long."""
    return {"a": "x" * (encoded_bytes - len(b'{"a":""}'))}


def properties(count: int) -> dict[str, int]:
    return {f"p{i}": i for i in range(count)}


@dataclass(frozen=True)
class Row:
    method: str
    path: str
    status: int
    detail: str | None = None  # a piece of the response body that names the problem
    json: Any = None
    content: bytes | None = None
    headers: dict[str, str | bytes] = field(default_factory=dict)
    key: str | bytes | None = KEY  # Idempotency-Key; only starts read it
    params: dict[str, Any] = field(default_factory=dict)
    cursor_past_end: int | None = None  # cursor = the finished job's event_count + this


def post(status: int, detail: str | None = None, path: str = "/jobs", **kwargs: Any) -> Row:
    return Row("POST", path, status, detail, **kwargs)


def get(path: str, status: int, detail: str | None = None, **kwargs: Any) -> Row:
    return Row("GET", path, status, detail, **kwargs)


def cancel(status: int, detail: str | None = None, **body: Any) -> Row:
    return post(status, detail, f"/jobs/{FINISHED}/cancel", json={"crew_id": "demo", "action_id": FINISHED, **body})


A256, A257 = "a" * 256, "a" * 257
EVENTS = f"/jobs/{FINISHED}/events"

TABLE: dict[str, Row] = {
    # Envelope ids: 1..256 characters (ASCII here, so bytes); action ids also nameable in a path.
    "action_id 256 bytes": post(ACCEPTED, UNKNOWN_CREW, json=start(action_id=A256)),
    "action_id 257 bytes": post(422, "action_id", json=start(action_id=A257)),
    "action_id empty": post(422, "action_id", json=start(action_id="")),
    "crew_id 256 bytes": post(ACCEPTED, UNKNOWN_CREW, json=start(crew_id="c" * 256)),
    "crew_id 257 bytes": post(422, "crew_id", json=start(crew_id="c" * 257)),
    "action_id with slash": post(422, "'/'", json=start(action_id="a/b")),
    "action_id with control character": post(422, "control characters", json=start(action_id="a\x01b")),
    "action_id with DEL": post(422, "control characters", json=start(action_id="a\x7fb")),
    # Path ids: the same rule, checked before the journal is asked.
    "path id 256 bytes": get(f"/jobs/{A256}", 404, "run was not found"),
    "path id 257 bytes": get(f"/jobs/{A257}", 422, "1 to 256"),
    "path id 257 bytes, events": get(f"/jobs/{A257}/events", 422, "1 to 256"),
    "path id 257 bytes, archive": Row(
        "DELETE", f"/jobs/{A257}", 422, "1 to 256", key=None, headers={"X-AIP-Archive-Confirmation": A257}
    ),
    "path id with control character": get("/jobs/a%01b", 422, "control characters"),
    "path id with DEL": get("/jobs/a%7Fb", 422, "control characters"),
    "path id with slash": get("/jobs/a%2Fb", 404, "Not Found"),  # a slash splits the path: no such route
    # Input: at most 1 MiB encoded (413, first in admission order); the body limit beyond it (413 too).
    "input 1 MiB - 1": post(ACCEPTED, UNKNOWN_CREW, json=start(input=sized_input(MIB - 1))),
    "input 1 MiB": post(ACCEPTED, UNKNOWN_CREW, json=start(input=sized_input(MIB))),
    "input 1 MiB + 1": post(413, "1 MiB", json=start(input=sized_input(MIB + 1))),
    "body over the body limit": post(413, "Too Large", json=start(input=sized_input(5 * MIB))),
    # Properties: at most 512 at the top level of a run input and of each batch item.
    "run input 512 properties": post(ACCEPTED, UNKNOWN_CREW, json=start(input=properties(512))),
    "run input 513 properties": post(422, "513", json=start(input=properties(513))),
    "batch item 513 properties": post(
        422, "input.inputs.0", json=start(operation="batch_run", input={"inputs": [properties(513)]})
    ),
    # Batches: 1..100 items.
    "batch 100 items": post(ACCEPTED, UNKNOWN_CREW, json=start(operation="batch_run", input={"inputs": [{}] * 100})),
    "batch 101 items": post(422, "input.inputs", json=start(operation="batch_run", input={"inputs": [{}] * 101})),
    "batch 0 items": post(422, "input.inputs", json=start(operation="batch_run", input={"inputs": []})),
    # Timeout: 1..3600000 ms.
    "timeout 0": post(422, "timeout_ms", json=start(timeout_ms=0)),
    "timeout 1": post(ACCEPTED, UNKNOWN_CREW, json=start(timeout_ms=1)),
    "timeout 3600000": post(ACCEPTED, UNKNOWN_CREW, json=start(timeout_ms=3_600_000)),
    "timeout 3600001": post(422, "timeout_ms", json=start(timeout_ms=3_600_001)),
    # Booleans where integers (or numbers) belong.
    "timeout true": post(422, "timeout_ms", json=start(timeout_ms=True)),
    "n_iterations true": post(
        422, "input.n_iterations", json=start(operation="test", input={"n_iterations": True, "eval_llm": "x"})
    ),
    "results_limit true": post(
        422,
        "input.results_limit",
        json=start(operation="knowledge_query", input={"query": ["q"], "results_limit": True}),
    ),
    "score_threshold false": post(
        422,
        "input.score_threshold",
        json=start(operation="knowledge_query", input={"query": ["q"], "score_threshold": False}),
    ),
    "cursor true": get(EVENTS, 422, "cursor", params={"cursor": "true"}),
    # Unknown fields: the envelopes and operation inputs are closed.
    "unknown envelope field": post(422, "extra", json=start(priority=1)),
    "unknown input field": post(
        422, "input.extra", json=start(operation="memory_reset", input={"command_type": "all", "extra": 1})
    ),
    "unknown cancel field": cancel(422, "extra", force=True),
    # Bodies that are not JSON, or not JSON this server can carry (hash, journal, worker frames).
    "invalid JSON": post(422, "json_invalid", content=b'{"crew_id": ', headers=JSON),
    "invalid UTF-8": post(422, "UTF-8", content=b'{"crew_id": "\xff\xfe", "action_id": "x"}', headers=JSON),
    "NaN": post(422, "NaN", content=b'{"crew_id": "c", "action_id": "x", "input": {"a": NaN}}', headers=JSON),
    "integer beyond 64 bits": post(422, "64-bit", json=start(input={"a": 2**64})),
    "lone surrogate": post(422, "surrogate", content=b'{"crew_id": "c", "action_id": "\\ud800"}', headers=JSON),
    "nesting 300 deep": post(
        422,
        "cannot be carried",
        content=b'{"crew_id": "c", "action_id": "x", "input": {"a": ' + b"[" * 300 + b"]" * 300 + b"}}",
        headers=JSON,
    ),
    "body is an array": post(422, "body", json=[start()]),
    "empty body": post(422, "body", content=b"", headers=JSON),
    # Content types other than JSON.
    "text/plain": post(422, "body", content=orjson.dumps(start()), headers={"Content-Type": "text/plain"}),
    "form": post(
        422, "body", content=b"crew_id=c&action_id=x", headers={"Content-Type": "application/x-www-form-urlencoded"}
    ),
    "no content type": post(422, "body", content=orjson.dumps(start())),
    # Idempotency-Key: required, non-blank, at most 512 UTF-8 bytes, nothing below U+0020.
    "key missing": post(428, "Idempotency-Key", json=start(), key=None),
    "key empty": post(428, "Idempotency-Key", json=start(), key=""),
    "key 512 bytes": post(ACCEPTED, UNKNOWN_CREW, json=start(), key="k" * 512),
    "key 513 bytes": post(400, "512 bytes", json=start(), key="k" * 513),
    "key 512 UTF-8 bytes": post(ACCEPTED, UNKNOWN_CREW, json=start(), key=("é" * 256).encode()),
    "key 513 UTF-8 bytes": post(400, "512 bytes", json=start(), key=("é" * 256 + "k").encode()),
    "key with control character": post(400, "control characters", json=start(), key="a\tb"),
    # The reference's admission order where two problems meet.
    "order: 413 before 400 (legacy)": post(
        413, "1 MiB", "/runs", json=start(operation="test", input=sized_input(MIB + 1))
    ),
    "order: 400 (legacy) before 403": post(400, "only the run operation", "/runs", json=start(operation="train")),
    "order: 403 before 428": post(403, "train", json=start(operation="train"), key=None),
    "order: 428 before 422": post(428, "Idempotency-Key", json=start(operation="batch_run"), key=None),
    "order: 400 (key) before 422": post(400, "512 bytes", json=start(operation="batch_run"), key="k" * 513),
    "order: 422 before 404": post(422, "input.inputs", json=start(operation="batch_run")),
    # Cursors: 0..event_count.
    "cursor -1": get(EVENTS, 416, "cursor", params={"cursor": -1}),
    "cursor 0": get(EVENTS, 200, params={"cursor": 0}),
    "cursor event_count": get(EVENTS, 200, cursor_past_end=0),
    "cursor event_count + 1": get(EVENTS, 416, "cursor", cursor_past_end=1),
    "cursor not an integer": get(EVENTS, 422, "cursor", params={"cursor": "1.5"}),
    "Last-Event-ID not ASCII digits": get(EVENTS, 400, "Last-Event-ID", headers={"Last-Event-ID": b"\xb2"}),
    "Last-Event-ID negative": get(EVENTS, 400, "Last-Event-ID", headers={"Last-Event-ID": "-1"}),
    # Cancel: reason at most 2048 characters; ids must match the path and the job's crew.
    "reason 2048": cancel(200, '"status":"completed"', reason="r" * 2048),
    "reason 2049": cancel(422, "reason", reason="r" * 2049),
    "cancel ids differ": post(400, "differs", f"/jobs/{FINISHED}/cancel", json={"crew_id": "demo", "action_id": "x"}),
    "cancel other crew": post(
        404, "run was not found", f"/jobs/{FINISHED}/cancel", json={"crew_id": "other", "action_id": FINISHED}
    ),
    # Archive needs its confirmation header (checked before the job is looked up).
    "archive unconfirmed": Row("DELETE", f"/jobs/{FINISHED}", 428, "X-AIP-Archive-Confirmation", key=None),
    "archive confirmation differs": Row(
        "DELETE",
        f"/jobs/{FINISHED}",
        428,
        "X-AIP-Archive-Confirmation",
        key=None,
        headers={"X-AIP-Archive-Confirmation": "other"},
    ),
}


@pytest.fixture(scope="module")
def event_count(server: Server) -> int:
    """The finished job's event count; it ran on the demo crew to the end."""
    with server.client() as client:
        response = client.post(
            "/jobs", json={"crew_id": "demo", "action_id": FINISHED}, headers={"Idempotency-Key": KEY}
        )
        assert response.status_code == 200, response.text
        return int(client.get(f"/jobs/{FINISHED}").json()["event_count"])


@pytest.mark.parametrize("row", list(TABLE.values()), ids=list(TABLE))
def test_bound(server: Server, event_count: int, row: Row) -> None:
    headers = dict(row.headers)
    if row.key is not None:
        headers["Idempotency-Key"] = row.key
    params = dict(row.params)
    if row.cursor_past_end is not None:
        params["cursor"] = event_count + row.cursor_past_end
    with server.client() as client:
        response = client.request(
            row.method, row.path, json=row.json, content=row.content, headers=headers, params=params
        )
    assert response.status_code == row.status, response.text[:500]
    if row.detail is not None:
        assert row.detail in response.text
    if row.status == 200 and row.path == EVENTS:
        sliced = response.json()
        assert sliced["next_cursor"] == event_count and sliced["cursor"] + len(sliced["events"]) == event_count


BEARERS = {
    "missing": None,
    "wrong token": "Bearer wrong",
    "lower-case scheme": "bearer {token}",
    "no scheme": "{token}",
    "two spaces": "Bearer  {token}",
}


@pytest.mark.parametrize("path", ["/health", "/openapi.json", f"/jobs/{FINISHED}"])
@pytest.mark.parametrize("authorization", list(BEARERS.values()), ids=list(BEARERS))
def test_bearer_must_be_exact(server: Server, authorization: str | None, path: str) -> None:
    headers = {} if authorization is None else {"Authorization": authorization.format(token=server.token)}
    response = httpx.get(server.url + path, headers=headers)
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert response.json() == {"detail": "missing or invalid bearer token"}


def raw_exchange(server: Server, request: bytes) -> bytes:
    """Bytes no HTTP client library would send; the answer as read until the server closes."""
    address = urlsplit(server.url)
    with socket.create_connection((address.hostname, address.port), timeout=10) as sock:
        sock.sendall(request)
        return b"".join(iter(lambda: sock.recv(65536), b""))


def test_a_key_of_spaces_is_missing(server: Server) -> None:
    body = orjson.dumps(start())
    request = (
        b"POST /jobs HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer %s\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\nIdempotency-Key:    \r\n\r\n%s"
    ) % (server.token.encode(), len(body), body)
    answer = raw_exchange(server, request)
    assert answer.startswith(b"HTTP/1.1 428 ") and b"Idempotency-Key" in answer


SLOW_CLIENTS = 16
TRICKLE_SECONDS = 3.0
# Answered while they trickle (at least 10 probes before they are done) and faster than the trickle: a probe
# that took as long as the trickle waited for it. Below that, nothing that a machine at load 10 would break.
PROMPT_SECONDS = TRICKLE_SECONDS
PROBE_SECONDS = 0.1  # between the prompt client's requests while the slow ones trickle


def test_slowloris_clients_do_not_block_others(server: Server) -> None:
    """Clients that trickle their headers a byte at a time hold connections, not the server."""
    request = b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer %s\r\n\r\n" % (
        server.token.encode()
    )
    address = urlsplit(server.url)
    auth = {"Authorization": f"Bearer {server.token}"}

    # Every slow client, and the prompt one, waits here until each slow one has connected and sent a byte.
    trickling = threading.Barrier(SLOW_CLIENTS + 1, timeout=30)

    def trickle() -> bytes:
        with socket.create_connection((address.hostname, address.port), timeout=30) as sock:
            sock.sendall(request[:1])
            trickling.wait()
            for byte in request[1:]:
                time.sleep(TRICKLE_SECONDS / len(request))
                sock.sendall(bytes([byte]))
            return b"".join(iter(lambda: sock.recv(65536), b""))

    latencies: list[float] = []
    with (
        ThreadPoolExecutor(SLOW_CLIENTS) as pool,
        httpx.Client(base_url=server.url, headers=auth, timeout=PROMPT_SECONDS * 2) as client,
    ):
        slow = [pool.submit(trickle) for _ in range(SLOW_CLIENTS)]
        trickling.wait()
        while True:
            began = time.monotonic()
            assert client.get("/health").status_code == 200
            latencies.append(time.monotonic() - began)
            if not wait(slow, timeout=PROBE_SECONDS).not_done:  # the next probe once this one's time is up
                break
        answers = [future.result() for future in slow]
    assert len(latencies) >= 10, "the slow clients finished before they could get in the way"
    assert max(latencies) < PROMPT_SECONDS, latencies
    # And the trickled requests themselves were served in the end.
    assert all(answer.startswith(b"HTTP/1.1 200 ") for answer in answers)
