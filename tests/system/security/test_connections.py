"""Connections that never send a byte cost an attacker nothing; they must not cost the supervisor its
descriptors, its availability or its jobs.

Thousands of silent sockets (10,000 when this process may open that many) are opened against a supervisor
keeping at most MAX_CONNECTIONS=1000: meanwhile a fresh client's ``/health`` answers and a job admitted
then completes, the supervisor's descriptors stay bounded, and every silent socket is closed by the server
(the newest ones by the header timeout, no earlier). A supervisor whose every connection is serving a
request answers a newcomer 503 with ``Retry-After`` rather than cutting a stream.
"""

from __future__ import annotations

import resource
import selectors
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from supervisor.console import sse
from tests.conftest import start_server, wait_until

SILENT = 10_000
MAX_CONNECTIONS = 1000
HEADER_TIMEOUT = 3.0
SPARE_FILES = 512  # this process's own: the server's clients, the interpreter, pytest
# Fewer silent sockets than the cap, a listen backlog's burst (2048) and a margin would never make the
# supervisor shed one: the test would show nothing.
FEWEST_SILENT = MAX_CONNECTIONS + 2048 + 500


@pytest.fixture
def open_files() -> Iterator[int]:
    """This process's soft RLIMIT_NOFILE raised to its hard limit for the test; yields the limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    yield hard
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_silent_sockets_neither_exhaust_nor_block_the_supervisor(tmp_path: Path, open_files: int) -> None:
    if open_files - SPARE_FILES < FEWEST_SILENT:
        pytest.skip(f"the hard open-files limit ({open_files}) allows fewer than {FEWEST_SILENT} silent sockets")
    settings = {"AIP_CREWAI_MAX_CONNECTIONS": str(MAX_CONNECTIONS), "AIP_CREWAI_HEADER_TIMEOUT_SECONDS": "3"}
    # Started with the common soft limit of 1024, to see the supervisor raise its own to the hard limit.
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, open_files), open_files))
    try:
        server = start_server(tmp_path / "state", env=settings, wait=False)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files))
    server.wait_ready(90)
    silent: dict[socket.socket, float] = {}  # each silent socket and when it connected
    try:
        assert psutil.Process(server.pid).rlimit(psutil.RLIMIT_NOFILE) == (open_files, open_files)
        count = min(SILENT, open_files - SPARE_FILES)
        began = time.monotonic()
        for _ in range(count):
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            silent[sock] = time.monotonic()
        opened_seconds = time.monotonic() - began
        server_fds = psutil.Process(server.pid).num_fds()

        # With all of them open on this side: a fresh client is answered, and a job admitted now completes.
        with server.client(timeout=10) as client:
            asked = time.monotonic()
            assert client.get("/health").status_code == 200
            health_seconds = time.monotonic() - asked
            body = {"crew_id": "demo", "action_id": "under-pressure", "input": {"topic": "fds"}}
            response = client.post("/jobs", json=body, headers={"Idempotency-Key": "pressure"})
            assert response.status_code == 200, response.text
        assert server_fds < MAX_CONNECTIONS + 2048 + 200  # the cap, a backlog's burst, the supervisor's own

        closed = _closed_by_server(silent, deadline=time.monotonic() + HEADER_TIMEOUT + 30)
        assert len(closed) == count, f"{count - len(closed)} silent sockets are still open"
        newest = max(silent, key=silent.__getitem__)  # no newcomer came after it to shed it: it timed out
        held_seconds = closed[newest] - silent[newest]
        assert HEADER_TIMEOUT - 0.2 <= held_seconds < HEADER_TIMEOUT + 5
        print(
            f"\n{count} silent sockets opened in {opened_seconds:.1f} s; supervisor fds {server_fds};"
            f" /health {health_seconds * 1000:.0f} ms; the newest closed after {held_seconds:.2f} s"
        )
    finally:
        for sock in silent:
            sock.close()
        server.stop()


def _closed_by_server(sockets: dict[socket.socket, float], deadline: float) -> dict[socket.socket, float]:
    """When each socket saw the server close it (EOF or a reset), until all have or the deadline passes."""
    closed: dict[socket.socket, float] = {}
    with selectors.DefaultSelector() as selector:
        for sock in sockets:
            sock.setblocking(False)
            selector.register(sock, selectors.EVENT_READ)
        while len(closed) < len(sockets) and time.monotonic() < deadline:
            for key, _ in selector.select(timeout=max(0.0, deadline - time.monotonic())):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                try:
                    data = sock.recv(4096)
                except ConnectionResetError:
                    data = b""
                assert data == b"", data  # a silent client is never sent anything
                closed[sock] = time.monotonic()
                selector.unregister(sock)
    return closed


def test_when_every_connection_is_serving_a_newcomer_gets_503_and_no_stream_is_cut(tmp_path: Path) -> None:
    server = start_server(tmp_path / "state", env={"AIP_CREWAI_MAX_CONNECTIONS": "2"})
    body = {"crew_id": "stubborn", "action_id": "held", "input": {"topic": "streams"}}
    try:
        with server.client() as starter, server.client() as follower, server.client() as newcomer:
            with starter.stream("POST", "/jobs/stream", json=body, headers={"Idempotency-Key": "held"}) as start:
                started = sse.events(start.iter_lines())
                assert next(started)["event"] == "started"
                with follower.stream("GET", "/jobs/held/events", headers={"Accept": "text/event-stream"}) as follow:
                    followed = sse.events(follow.iter_lines())
                    assert next(followed)["event"] == "started"
                    refused = newcomer.get("/health")
                    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
                    assert refused.text == "too many connections"
            # Both streams ended by their clients: there is room again once the server has seen them go.
            assert wait_until(lambda: _health(newcomer) == 200)
            cancel = {"crew_id": "stubborn", "action_id": "held", "reason": "done"}
            assert newcomer.post("/jobs/held/cancel", json=cancel).status_code == 200
    finally:
        server.stop()


def _health(client: httpx.Client) -> int:
    try:
        return client.get("/health").status_code
    except httpx.TransportError:
        return 0
