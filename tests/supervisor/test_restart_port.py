"""The port at a restart: what a dead supervisor's job left to take it is killed before the new supervisor binds, so
no leftover of a job answers a client or sees its token; a journal that cannot be opened stops no such kill. (A
port a stranger holds: ``test_listen.py``.)"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from supervisor.testing import Server, free_port
from tests.conftest import gone, start_body, start_server, wait_until
from tests.crews.base import EVIDENCE_DIR
from tests.helpers import squatter

pytestmark = pytest.mark.usefixtures("launcher")

KEY = {"Idempotency-Key": "key-1"}
EXIT_SECONDS = 120.0  # a refusal after the fence, before any child: seconds even at load 10; more is a hang
CORRUPT = b"SQLite format 3\x00" + b"\xff" * 4096  # a header SQLite knows, then nothing it can read


@contextlib.contextmanager
def squatting(tmp_path: Path) -> Iterator[tuple[Server, psutil.Process, dict[str, str]]]:
    """A supervisor killed (-9) while its job ran, and the job's leftover (``tests/helpers/squatter.py``) holding
    the supervisor's port; the leftover is killed at the end (by pid and start time) if the test did not."""
    state, evidence = tmp_path / "state", tmp_path / "evidence"
    evidence.mkdir()
    port = free_port()
    (evidence / squatter.PORT).write_text(str(port))
    env = {EVIDENCE_DIR: str(evidence)}
    first = start_server(state, env=env, port=port)
    with (
        first.client() as client,
        client.stream("POST", "/jobs/stream", json=start_body("runaway-squatter", "squat"), headers=KEY) as response,
    ):
        for line in response.iter_lines():
            if line == "event: started":
                break
        else:
            raise AssertionError(f"the job ended before it started:\n{first.log_tail()}")
        left = wait_until((evidence / squatter.PID).exists, timeout=EXIT_SECONDS)
        assert left, f"the job never left its squatter:\n{first.log_tail()}"
    pid, started = (evidence / squatter.PID).read_text().split()
    leftover = psutil.Process(int(pid))
    try:
        assert abs(leftover.create_time() - float(started)) < 0.01  # it is the squatter, not a pid reused
        # While the supervisor serves, its port is its own: the options that share an address do not share it.
        assert (evidence / squatter.TRIED).read_text() == "EADDRINUSE"
        assert not holds(leftover, port)
        first.kill()
        assert wait_until(lambda: holds(leftover, port), timeout=30), "the leftover never took the port"
        yield first, leftover, env
    finally:
        with contextlib.suppress(psutil.NoSuchProcess):
            leftover.kill()  # psutil checks the start time first: never a process that reused the pid


def holds(process: psutil.Process, port: int) -> bool:
    """Whether ``process`` listens on ``port``."""
    return any(
        connection.laddr.port == port and connection.pid == process.pid
        for connection in psutil.net_connections("tcp")
        if connection.status == psutil.CONN_LISTEN
    )


def test_a_restart_kills_the_leftover_on_its_port_before_binding(tmp_path: Path) -> None:
    with squatting(tmp_path) as (first, leftover, env):
        # Not asked whether it is ready until the leftover is gone: until then, the leftover would answer.
        second = start_server(first.state, env=env, port=first.port, token=first.token, wait=False)
        try:
            dead = wait_until(lambda: gone(leftover.pid, leftover.create_time()), timeout=EXIT_SECONDS)
            assert dead, f"the leftover outlived the restart:\n{second.log_tail()}"
            second.wait_ready()
            with second.client() as client:
                health = client.get("/health")
                assert health.status_code == 200 and health.json()["status"] == "ready"
                terminal = client.get("/jobs/squat").json()["terminal"]
            assert terminal["error_type"] == "supervisor_restarted" and terminal["uncertain_outcome"] is True
            assert terminal["orphan_killed"] is True and leftover.pid in terminal["orphan_pids"]
            assert not (first.state.parent / "evidence" / squatter.HEARD).exists(), "a client's request reached it"
            assert "killed what a dead supervisor's jobs left in their cgroups" in second.log.read_text()
        finally:
            second.stop()


def test_a_corrupt_journal_stops_no_kill_of_the_leftovers(tmp_path: Path) -> None:
    with squatting(tmp_path) as (first, leftover, env):
        journal = first.state / "journal.db"
        journal.write_bytes(CORRUPT)
        for companion in ("journal.db-wal", "journal.db-shm"):
            (first.state / companion).unlink(missing_ok=True)
        second = start_server(first.state, env=env, port=first.port, wait=False)
        assert second.process.wait(EXIT_SECONDS) == 1
        last = second.log_tail().strip().splitlines()[-1]
        assert last.startswith(f"crew-supervisor: journal {journal}"), last
        assert wait_until(lambda: gone(leftover.pid, leftover.create_time()), timeout=10), "the leftover lives on"
