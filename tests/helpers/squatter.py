"""``python -m tests.helpers.squatter EVIDENCE PORT``: what a job leaves behind to take its supervisor's port once the
supervisor is gone. It forks and its first process exits (no job's tree holds it: it is the supervisor's, a
subreaper, then whoever adopts orphans), leaves the session, ignores SIGTERM, and tries to bind 127.0.0.1:PORT
every few milliseconds, with SO_REUSEADDR and SO_REUSEPORT, until it has it. Then it answers every request with
``SQUATTED``, and keeps what it heard in EVIDENCE (``HEARD``): a client's bearer token, if one ever reached it.

The crew that leaves it (``runaway-squatter``, ``tests/crews/hostile.py``) reads the port from ``PORT`` and first
tries ``take`` itself, from inside its running job, writing what the kernel said to ``TRIED``. The squatter writes
``PID`` (its pid and start time) once it runs on its own, and ``BOUND`` once it holds the port. Bounded:
it gives up after ``GIVE_UP_SECONDS``, bound or not, so a test that failed leaves nothing running for long.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import sys
import time
from pathlib import Path

import psutil

PORT, TRIED = "squat.port", "squat.tried"  # in EVIDENCE: written by the test, by the job
PID, BOUND, HEARD = "squat.pid", "squat.bound", "squat.heard"  # by the squatter
SQUATTED = b"squatted"
GIVE_UP_SECONDS = 300
TRY_EVERY_SECONDS = 0.005


def take(port: int) -> socket.socket | str:
    """The port, bound as a squatter binds it (options that let a socket share an address), listening; else the
    errno's name."""
    squat = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    squat.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    squat.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        squat.bind(("127.0.0.1", port))
        squat.listen()
    except OSError as exc:
        squat.close()
        return errno.errorcode.get(exc.errno or 0, str(exc))
    return squat


def _serve(squat: socket.socket, heard: Path, until: float) -> None:
    squat.settimeout(1)
    while time.monotonic() < until:
        try:
            connection, _ = squat.accept()
        except TimeoutError:
            continue
        with connection:
            connection.settimeout(5)
            try:
                request = connection.recv(65536)
            except OSError:
                continue
            with heard.open("ab") as out:
                out.write(request)
            head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(SQUATTED)
            connection.sendall(head + SQUATTED)


def main(evidence: str, port: str) -> None:
    if os.fork() != 0:
        os._exit(0)  # the first process: the job reaps it; the second runs on, a child of whoever adopts orphans
    os.setsid()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    place = Path(evidence)
    (place / PID).write_text(f"{os.getpid()} {psutil.Process().create_time()}")
    until = time.monotonic() + GIVE_UP_SECONDS
    while time.monotonic() < until:
        squat = take(int(port))
        if isinstance(squat, socket.socket):
            (place / BOUND).write_text(str(os.getpid()))
            _serve(squat, place / HEARD, until)
            break
        time.sleep(TRY_EVERY_SECONDS)
    os._exit(0)


if __name__ == "__main__":
    main(*sys.argv[1:3])
