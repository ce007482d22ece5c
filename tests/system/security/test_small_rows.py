"""The smaller rows of the second abuse round, each with its expected answer: log fields no action id can
forge, non-finite and unreadable numbers answered 422, one rule for every header and query parameter that
decides something, bidirectional controls written out by the CLI, no websocket reaching the app, and memory
given back after an attack."""

from __future__ import annotations

import asyncio
import logging
import socket
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson
import psutil
import pytest

from supervisor.escaping import visible
from supervisor.http.auth import BearerAuth
from supervisor.logs import TextFormatter
from tests.conftest import Server, start_body, wait_until

KEY = {"Idempotency-Key": "small"}


def test_a_text_log_field_cannot_forge_another() -> None:
    record = logging.LogRecord("crew_supervisor.jobs", logging.INFO, "f", 1, "job finished", None, None)
    record.action_id = "job7 outcome=completed"
    record.outcome = "failed"
    line = TextFormatter().format(record)
    assert line.endswith(' action_id="job7 outcome=completed" outcome=failed'), line


@pytest.mark.parametrize(
    ("number", "says"),
    [("1e400", "out of range"), ("-1e400", "out of range"), ("1" * 4301, "cannot be read"), ("1" * 30, "carried")],
)
def test_a_number_json_cannot_carry_is_422_never_null(server: Server, number: str, says: str) -> None:
    body = b'{"crew_id": "demo", "action_id": "num", "input": {"x": %s}}' % number.encode()
    with server.client() as client:
        answer = client.post("/jobs", content=body, headers={**KEY, "Content-Type": "application/json"})
        assert answer.status_code == 422, answer.text
        assert says in answer.text
        assert client.get("/jobs/num").status_code == 404  # nothing admitted


@pytest.mark.parametrize("header", ["Idempotency-Key", "Last-Event-ID", "Accept", "Content-Type"])
def test_a_deciding_header_given_twice_is_400(server: Server, header: str) -> None:
    with server.client() as client:
        headers = [(header, "1"), (header, "2"), *KEY.items()]
        answer = client.post("/jobs", json=start_body("demo", "twice"), headers=headers)
        assert answer.status_code == 400 and header.lower() in answer.json()["detail"].lower(), answer.text
        assert client.get("/jobs/twice").status_code == 404


def test_a_query_parameter_given_twice_is_400(server: Server) -> None:
    with server.client() as client:
        assert client.get("/jobs", params=[("status", "running")]).status_code == 200
        answer = client.get("/jobs", params=[("status", "running"), ("status", "failed")])
        assert answer.status_code == 400 and "'status'" in answer.json()["detail"]
        spelt = client.get("/jobs?limit=1&%6cimit=2")  # the same name, percent-encoded
        assert spelt.status_code == 400


def test_the_cli_writes_bidirectional_controls_and_line_separators_out() -> None:
    assert visible("rtl\u202egnp.exe") == "rtl\\u202egnp.exe"
    assert visible("a\u2028b\u2029c\u2066d\u200fe") == "a\\u2028b\\u2029c\\u2066d\\u200fe"
    assert visible("tab\tand\nnewline\u202e", layout=True) == "tab\tand\nnewline\\u202e"


def test_a_websocket_upgrade_is_plain_http_behind_the_token(server: Server) -> None:
    upgrade = (
        "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
        "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(upgrade.encode())
        assert sock.recv(4096).startswith(b"HTTP/1.1 401 ")


def test_the_middleware_closes_a_scope_that_is_not_http() -> None:
    """Defence in depth for a server that would speak websockets: such a scope never reaches the app."""
    reached: list[str] = []
    sent: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        reached.append(scope["type"])

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "websocket.connect"}

    guard = BearerAuth(app, credentials=None)
    asyncio.run(guard({"type": "websocket", "path": "/ws", "headers": []}, receive, send))
    assert reached == [] and sent == [{"type": "websocket.close", "code": 1008}]


def test_memory_is_given_back_after_an_attack(server: Server) -> None:
    """Authorised clients each send a 3 MiB input at once (each refused 413, after it was read and parsed): the
    supervisor's RSS grows while it holds them, and comes back down once they are gone. Twice: the first burst
    teaches glibc to keep buffers of that size on its heap (its mmap threshold rises), as a long-running
    supervisor's allocator has learned."""
    process = psutil.Process(server.pid)
    before = process.memory_info().rss
    body = orjson.dumps(start_body("demo", "big", input={"text": "x" * (3 * 1024 * 1024)}))

    def send() -> int:
        with server.client() as client:
            return client.post("/jobs", content=body, headers={**KEY, "Content-Type": "application/json"}).status_code

    for _ in range(2):
        with ThreadPoolExecutor(16) as pool:
            assert list(pool.map(lambda _: send(), range(32))) == [413] * 32
    peak = process.memory_info().rss
    settled = wait_until(lambda: process.memory_info().rss < before + 24 * 1024 * 1024, timeout=30)
    now = process.memory_info().rss
    assert settled, f"RSS {before // 2**20} MiB before, {peak // 2**20} after, {now // 2**20} now"
