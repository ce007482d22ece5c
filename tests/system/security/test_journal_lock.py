"""Another process holds the journal's write lock (a crew runs as our uid, a backup, an operator's
``sqlite3``) while jobs are admitted, run and finish: the event loop keeps answering, admission is refused
promptly with 503 and ``Retry-After`` (never 500), a running job waits at its next ledger entry, and once the lock
is free every job's terminal event is durable and no record is left ``running``."""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from tests.conftest import start_body, start_server, wait_until

HOLD = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN IMMEDIATE")
print("held", flush=True)
sys.stdin.readline()
db.execute("COMMIT")
"""


@contextlib.contextmanager
def held_lock(journal: Path) -> Iterator[None]:
    """A plain sqlite3 connection in another process holds ``BEGIN IMMEDIATE`` until the block ends."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(journal)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        yield
    finally:
        holder.communicate("release\n", timeout=10)
    assert holder.returncode == 0


def test_a_held_journal_lock_stalls_nothing_and_loses_nothing(tmp_path: Path) -> None:
    server = start_server(tmp_path / "state", env={"AIP_CREWAI_MAX_CONCURRENCY": "2"})
    journal = server.state / "journal.db"
    answers: dict[str, httpx.Response] = {}

    def run(action_id: str) -> None:
        with server.client() as client:
            # Long enough to be running still once the lock is held (a process started for it: seconds at load).
            body = start_body("demo-slow", action_id, input={"seconds": 5}, timeout_ms=60_000)
            answers[action_id] = client.post("/jobs", json=body, headers={"Idempotency-Key": action_id})

    jobs = ["first", "second", "queued"]  # the third waits for a slot: its worker is recorded under the lock
    threads = [threading.Thread(target=run, args=(action_id,)) for action_id in jobs]
    with server.client(timeout=10) as client:
        for action_id, thread in zip(jobs, threads, strict=True):  # admitted in this order
            thread.start()
            assert wait_until(lambda a=action_id: client.get(f"/jobs/{a}").status_code == 200, 30)
        assert wait_until(lambda: all(client.get(f"/jobs/{a}").json().get("event_count", 0) >= 2 for a in jobs[:2]), 60)
        with held_lock(journal):
            round_trips = []
            for _ in range(20):
                sent = time.monotonic()
                assert client.get("/health").status_code == 200
                round_trips.append(time.monotonic() - sent)
                time.sleep(0.02)
            sent = time.monotonic()
            refused = client.post("/jobs/stream", json=start_body("demo", "late"), headers={"Idempotency-Key": "k"})
            refused_after = time.monotonic() - sent
            assert refused.status_code == 503 and refused.headers["Retry-After"] == "1", refused.text
            # Refused once its second of patience is spent, not at once and not never (the ceiling is a hang's).
            assert 1.0 <= refused_after < 1.0 + 10
            # The running jobs go no further than their next ledger entry (a completed task, a call about to start):
            # none of them may go out before it is durable (docs/reconcile-and-resume.md), so they wait for the lock.
            time.sleep(1.0)  # a window, not a wait: nothing may be answered while the lock is held
            assert not answers  # nobody was told the job failed, nor that it continues
            assert client.get("/jobs/first").json()["status"] == "running"  # readers see only what committed
            during = client.get("/health")
            assert during.status_code == 200
        for thread in threads:
            thread.join(60)
        assert {action_id: answer.status_code for action_id, answer in answers.items()} == dict.fromkeys(jobs, 200)
        # The event loop never waited for the lock: had it, the first /health would have waited for the lock's
        # release, which comes only after these requests (the client's timeout would fail the test). The ceiling
        # is loose enough for a machine at load 10.
        assert max(round_trips) < 5, round_trips
        assert (
            client.post("/jobs", json=start_body("demo", "later"), headers={"Idempotency-Key": "k"}).status_code == 200
        )
        assert client.get("/jobs/late").status_code == 404  # the refused start left no record
    server.stop()
    with contextlib.closing(sqlite3.connect(journal)) as db:
        assert db.execute("SELECT action_id FROM jobs WHERE status = 'running'").fetchall() == []
        terminal = dict(db.execute("SELECT action_id, status FROM jobs").fetchall())
    assert terminal == {**dict.fromkeys(jobs, "completed"), "later": "completed"}
