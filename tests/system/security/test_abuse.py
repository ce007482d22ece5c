"""Held under abuse, before auth and after: what an attacker sends costs the supervisor bounded memory, never
the event loop, and its connection is closed within its bound, while a fresh authorised ``/health`` answers
in under a second and a job admitted meanwhile completes.

Each attack (no token unless said): one huge header value; megabytes of tiny headers; megabytes of pipelined
requests whose answers are never read; a request body trickling a byte a second (with the token); a server
stream whose client stops reading. Each was measured failing before its bound existed (seconds of a busy loop,
hundreds of MB held, connections held for minutes).
"""

from __future__ import annotations

import contextlib
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from supervisor.testing import Server
from tests.conftest import start_body, start_server, stop_server

MIB = 1024 * 1024
RSS_GROWTH = 64 * MIB  # the most an attack of rows 1-3 may add to the supervisor's RSS
BODY_TIMEOUT = 2.0
SEND_TIMEOUT = 2.0
SETTINGS = {
    "AIP_CREWAI_BODY_TIMEOUT_SECONDS": str(BODY_TIMEOUT),
    "AIP_CREWAI_SEND_TIMEOUT_SECONDS": str(SEND_TIMEOUT),
    "AIP_CREWAI_MAX_CONNECTIONS": "64",
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = start_server(tmp_path_factory.mktemp("abuse") / "state", env=SETTINGS)
    yield running
    stop_server(running)


@dataclass
class Watch:
    """The supervisor's RSS, sampled every 50 ms while an attack runs: how far it grew."""

    pid: int
    before: int = 0
    peak: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.before = self.peak = psutil.Process(self.pid).memory_info().rss
        self.thread = threading.Thread(target=self._run)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(0.05):
            self.peak = max(self.peak, psutil.Process(self.pid).memory_info().rss)

    def grown(self) -> int:
        self.stop.set()
        self.thread.join()
        return self.peak - self.before


def raw(server: Server) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=30)


def answer_of(sock: socket.socket, seconds: float = 30) -> bytes:
    """Everything the server sends until it closes the connection (or ``seconds`` pass: then None marks it)."""
    sock.settimeout(seconds)
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except (ConnectionResetError, BrokenPipeError):
        pass
    return received


def send_quietly(sock: socket.socket, data: bytes) -> None:
    """Send all of ``data`` unless the server closes first (which is what a bound should do)."""
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        sock.sendall(data)


def still_serves(server: Server, action: str) -> float:
    """A fresh authorised /health's latency, after a job admitted now completed."""
    with server.client(timeout=30) as client:
        began = time.monotonic()
        assert client.get("/health").status_code == 200
        latency = time.monotonic() - began
        answer = client.post("/jobs", json=start_body("demo", action), headers={"Idempotency-Key": action})
        assert answer.status_code == 200, answer.text
    return latency


def under_attack(server: Server, action: str, attack: Callable[[], None], attackers: int = 2) -> tuple[float, int]:
    """Run ``attackers`` copies of ``attack`` while a client checks the supervisor still serves; the /health
    latency and how far the supervisor's RSS grew."""
    watch = Watch(server.pid)
    with ThreadPoolExecutor(attackers) as pool:
        running = [pool.submit(attack) for _ in range(attackers)]
        latency = still_serves(server, action)
        for done in running:
            done.result(60)
    return latency, watch.grown()


def test_one_huge_header_value_is_431_after_the_bound_and_costs_nothing(server: Server) -> None:
    def attack() -> None:
        with raw(server) as sock:
            send_quietly(sock, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (64 * MIB))
            assert answer_of(sock).startswith(b"HTTP/1.1 431 ")

    latency, grown = under_attack(server, "huge-header", attack)
    assert latency < 1.0 and grown < RSS_GROWTH, (latency, grown)


def test_megabytes_of_tiny_headers_are_431_after_100_headers(server: Server) -> None:
    def attack() -> None:
        with raw(server) as sock:
            send_quietly(sock, b"GET /health HTTP/1.1\r\n" + b"a:b\r\n" * (4 * MIB))
            assert answer_of(sock).startswith(b"HTTP/1.1 431 ")

    latency, grown = under_attack(server, "tiny-headers", attack)
    assert latency < 1.0 and grown < RSS_GROWTH, (latency, grown)


@pytest.mark.parametrize("size", [1000, 8190])
def test_a_header_line_over_8_kib_is_refused_alone(server: Server, size: int) -> None:
    with raw(server) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nConnection: close\r\nX-Line: " + b"v" * size + b"\r\n\r\n")
        head = answer_of(sock, 10).split(b"\r\n", 1)[0]
    assert head == (b"HTTP/1.1 401 Unauthorized" if size == 1000 else b"HTTP/1.1 431 Request Header Fields Too Large")
    with raw(server) as sock:
        sock.sendall(b"GET /" + b"p" * 40_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")  # the target counts in the total
        assert answer_of(sock, 10).startswith(b"HTTP/1.1 431 ")


FIRST = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"  # answered 401 (no token), the connection kept
OVER_A_BOUND = {  # a request's head past one bound of connections.py: each alone
    "a 60 KB header": b"X-Big: " + b"a" * 60_000 + b"\r\n",  # past the head's 32 KiB and a line's 8 KiB
    "a 9 KB header line": b"X-Line: " + b"v" * 9000 + b"\r\n",
    "101 headers": b"a:b\r\n" * 101,
    "60 KB of 1 KB headers": b"".join(b"X-%d: %s\r\n" % (i, b"v" * 1000) for i in range(60)),
}


@pytest.mark.parametrize(
    ("head", "sent"),
    [
        *((head, "after the first's answer") for head in OVER_A_BOUND),
        # Parsed from the read that brought the first: the bytes of it that came with the first are not counted
        # (httptools says not where a request ended), so the head's bound alone is not what refuses these.
        *((head, "pipelined") for head in ("a 60 KB header", "a 9 KB header line", "101 headers")),
    ],
)
def test_a_request_over_a_bound_is_431_on_a_connection_that_was_answered_before(
    server: Server, head: str, sent: str
) -> None:
    """As on a fresh connection: 431, after the first request's answer, then closed. The refusal used to look at
    the connection's last answer, already sent, and closed without a word."""
    second = b"GET /health HTTP/1.1\r\nHost: x\r\n" + OVER_A_BOUND[head] + b"\r\n"
    with raw(server) as sock:
        if sent == "pipelined":
            send_quietly(sock, FIRST + second)
        else:
            sock.sendall(FIRST)
            assert _one_answer(sock).startswith(b"HTTP/1.1 401 ")
            send_quietly(sock, second)
        answers = answer_of(sock, 10)
    statuses = re.findall(rb"HTTP/1\.1 \d{3} [^\r]*", answers)  # a body ends with no line break
    expected = [b"HTTP/1.1 431 Request Header Fields Too Large"]
    assert statuses == ([b"HTTP/1.1 401 Unauthorized"] if sent == "pipelined" else []) + expected, answers[:300]


def _one_answer(sock: socket.socket) -> bytes:
    """The head of the next answer on ``sock``, its body read past (by its content-length), the connection kept."""
    received = b""
    while b"\r\n\r\n" not in received:
        chunk = sock.recv(65536)
        assert chunk, f"closed after {received!r}"
        received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1]) for line in head.lower().split(b"\r\n") if line.startswith(b"content-length:")
    )
    while len(body) < length:
        body += sock.recv(65536)
    return head


def test_pipelined_requests_whose_answers_are_never_read_are_bounded(server: Server) -> None:
    request = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    closed: list[bool] = []

    def attack() -> None:
        with raw(server) as sock:
            send_quietly(sock, request * (MIB // len(request)))  # 1 MiB of them, no answer read
            closed.append(answer_of(sock, 30).count(b"HTTP/1.1 401 ") <= 17)  # then closed: at most 16 queued

    latency, grown = under_attack(server, "pipelined", attack, attackers=16)
    assert latency < 1.0 and grown < RSS_GROWTH, (latency, grown)
    assert closed == [True] * 16


def test_a_few_pipelined_requests_are_all_answered_in_order(server: Server) -> None:
    with raw(server) as sock:
        sock.sendall(b"".join(b"GET /nowhere-%d HTTP/1.1\r\nHost: x\r\n\r\n" % i for i in range(8)))
        answers = b""
        deadline = time.monotonic() + 30
        while answers.count(b"HTTP/1.1 401 ") < 8 and time.monotonic() < deadline:
            answers += sock.recv(65536)
    assert answers.count(b"HTTP/1.1 401 ") == 8


def test_a_trickling_body_is_cut_off_at_the_body_timeout(server: Server) -> None:
    """With the token, as many trickling bodies as MAX_CONNECTIONS: each gets 408 in time, and then fresh
    clients are served again."""
    head = (
        f"POST /jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {server.token}\r\n"
        "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    ).encode()
    held: list[float] = []

    def trickle() -> None:
        with raw(server) as sock:
            sock.sendall(head)
            began = time.monotonic()
            sock.settimeout(0.5)
            answer = b""
            while not answer and time.monotonic() - began < BODY_TIMEOUT + 30:
                send_quietly(sock, b"{")
                try:
                    answer = sock.recv(65536)
                except TimeoutError:
                    continue
            held.append(time.monotonic() - began)
            assert answer.startswith(b"HTTP/1.1 408 "), answer[:100]

    with ThreadPoolExecutor(64) as pool:
        for done in [pool.submit(trickle) for _ in range(64)]:
            done.result(60)
    assert len(held) == 64 and min(held) >= BODY_TIMEOUT - 0.2 and max(held) < BODY_TIMEOUT + 5, held
    assert still_serves(server, "after-trickle") < 1.0


def test_a_stream_whose_client_stops_reading_is_dropped_at_the_send_timeout(server: Server, tmp_path: Path) -> None:
    """A blocking job's events streamed to a client that never reads: the answer backs up in the socket, and
    SEND_TIMEOUT_SECONDS after it stalls the server drops the connection (the job runs on)."""
    body = start_body("sized", "stall", input={"sizes": " ".join(["200000"] * 40)})
    with server.client() as client:
        assert client.post("/jobs", json=body, headers={"Idempotency-Key": "stall"}).status_code == 200
    with raw(server) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(
            f"GET /jobs/stall/events HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n"
            f"Authorization: Bearer {server.token}\r\n\r\n".encode()
        )
        stalled = time.monotonic()
        # Accepted by the kernel at once, by the supervisor when its loop gets to it: wait for its end to exist.
        assert _until(lambda: _server_side(server, sock) is not None, 30) is not None
        dropped = _until(lambda: _server_side(server, sock) is None, SEND_TIMEOUT + 30)
        assert dropped is not None and SEND_TIMEOUT - 0.2 <= dropped - stalled < SEND_TIMEOUT + 10
    assert still_serves(server, "after-stall") < 1.0


def _server_side(server: Server, sock: socket.socket) -> psutil._common.pconn | None:
    """The supervisor's end of ``sock``, while it has one."""
    mine = sock.getsockname()
    for connection in psutil.Process(server.pid).net_connections(kind="tcp"):
        if connection.raddr and tuple(connection.raddr) == tuple(mine) and connection.status == "ESTABLISHED":
            return connection
    return None


def _until(condition: Callable[[], bool], seconds: float) -> float | None:
    """When ``condition`` first held (monotonic), polled every 50 ms; None past ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return time.monotonic()
        time.sleep(0.05)
    return None


FOLLOWERS = 12
FOLLOWER_GROWTH = 20 * MIB  # the most a follower that never reads may add to the supervisor's RSS


def test_followers_that_never_read_large_events_hold_a_batch_each_and_are_dropped(server: Server) -> None:
    """12 streams of a finished job's 40 events of ~200 KB, none ever read: the supervisor holds a bounded
    batch per stream (never the 8 MB of events), drops each at the send timeout, and serves meanwhile."""
    body = start_body("sized", "followed", input={"sizes": " ".join(["200000"] * 40)})
    with server.client() as client:
        assert client.post("/jobs", json=body, headers={"Idempotency-Key": "followed"}).status_code == 200
    request = (
        f"GET /jobs/followed/events HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n"
        f"Authorization: Bearer {server.token}\r\n\r\n"
    ).encode()
    watch = Watch(server.pid)
    socks = []
    for _ in range(FOLLOWERS):
        sock = raw(server)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(request)
        socks.append(sock)
    try:
        latency = still_serves(server, "while-followed")
        dropped = _until(lambda: all(_server_side(server, sock) is None for sock in socks), SEND_TIMEOUT + 30)
        grown = watch.grown()
    finally:
        for sock in socks:
            sock.close()
    print(f"\n{FOLLOWERS} followers that never read: /health {latency * 1000:.0f} ms, RSS +{grown / MIB:.0f} MiB")
    assert latency < 1.0 and dropped is not None
    assert grown < FOLLOWERS * FOLLOWER_GROWTH, grown
