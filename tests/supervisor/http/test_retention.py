"""Retention (ARCHIVE_AFTER_SECONDS): a record past the window is archived by the sweep, and by admission when the
journal is full, which answers 507 saying what to do only when none is; the operator's bulk archive (its filters,
dry run, limit and confirmation; never a running job) and ``crew-supervisor archive`` on it; ``/health``'s
``retention``."""

from __future__ import annotations

import contextlib
import datetime
import sqlite3
import time
from collections.abc import Iterable
from typing import Any

import httpx
import orjson
import psutil

from tests.conftest import Server, start_body, start_server, wait_until
from tests.supervisor.console.test_cli import cli
from tests.supervisor.http.test_bulk_cancel import start_running

BULK = {"X-AIP-Archive-Confirmation": "bulk"}
HOUR = 3600


def completed(client: httpx.Client, *actions: str, crew: str = "demo") -> None:
    for action in actions:
        answer = client.post("/jobs", json=start_body(crew, action), headers={"Idempotency-Key": action})
        assert answer.status_code == (200 if crew == "demo" else 502), answer.text


def age(server: Server, actions: Iterable[str], seconds: float) -> None:
    """Make the records look as if they ended ``seconds`` earlier, as an operator's ``sqlite3`` would write them
    (the supervisor's writer waits out another process's lock)."""
    with contextlib.closing(sqlite3.connect(server.state / "journal.db", timeout=30, isolation_level=None)) as db:
        db.execute(
            "UPDATE jobs SET ended_at = ended_at - ? WHERE action_id IN (SELECT value FROM json_each(?))",
            (seconds, orjson.dumps(list(actions)).decode()),
        )


def archive(client: httpx.Client, headers: dict[str, str] | None = BULK, **body: Any) -> httpx.Response:
    return client.post("/jobs/archive", json=body, headers=headers)


def exists(client: httpx.Client, action: str) -> bool:
    return client.get(f"/jobs/{action}").status_code == 200


def test_the_sweep_archives_a_record_once_it_ended_more_than_the_window_ago(tmp_path: Any) -> None:
    server = start_server(tmp_path / "state", env={"AIP_CREWAI_ARCHIVE_AFTER_SECONDS": "3"})
    with server.client() as client:
        completed(client, "swept")
        ended = client.get("/jobs/swept").json()["ended_at"]
        retention = client.get("/health").json()["retention"]
        assert retention["archive_after_seconds"] == 3 and retention["oldest_retained_at"] is not None
        assert wait_until(lambda: not exists(client, "swept"), timeout=60)
        assert time.time() - ended >= 3  # not before the window
        assert client.get("/health").json()["retention"] == {
            "archive_after_seconds": 3,
            "oldest_retained_at": None,
            "archivable": 0,
        }


def test_a_full_journal_archives_what_is_past_the_window_before_it_refuses(tmp_path: Any) -> None:
    env = {"AIP_CREWAI_ARCHIVE_AFTER_SECONDS": str(HOUR), "AIP_CREWAI_MAX_RETAINED_RUNS": "4"}
    server = start_server(tmp_path / "state", env=env)
    with server.client() as client:
        completed(client, "c1", "c2", "c3")
        completed(client, "f1", crew="boom")
        full = client.post("/jobs", json=start_body("demo", "refused"), headers={"Idempotency-Key": "refused"})
        assert full.status_code == 507 and not exists(client, "refused")
        detail = full.json()["detail"]
        assert "journal holds its 4 retained runs" in detail, detail
        assert "none ended more than AIP_CREWAI_ARCHIVE_AFTER_SECONDS=3600 ago" in detail, detail
        assert "crew-supervisor archive --older-than" in detail and "raise AIP_CREWAI_MAX_RETAINED_RUNS" in detail

        age(server, ["c2", "f1"], 2 * HOUR)
        health = client.get("/health").json()
        assert health["retention"]["archivable"] == 2 and health["retained_runs"] == 4
        oldest = datetime.datetime.fromisoformat(health["retention"]["oldest_retained_at"])
        assert abs(oldest.timestamp() - client.get("/jobs/c1").json()["admitted_at"]) < 1  # c1's admission
        admitted = client.post("/jobs", json=start_body("demo", "room-made"), headers={"Idempotency-Key": "room"})
        assert admitted.status_code == 200, admitted.text
        # Those past the window went, oldest end first; the others stay.
        assert not exists(client, "c2") and not exists(client, "f1")
        assert all(exists(client, action) for action in ("c1", "c3", "room-made"))
        assert client.get("/health").json()["retention"]["archivable"] == 0


def test_the_bulk_archive_and_the_cli(tmp_path: Any) -> None:
    server = start_server(tmp_path / "state", env={"AIP_CREWAI_ARCHIVE_AFTER_SECONDS": str(HOUR)})
    live = start_running(server, "demo-slow", "live")
    with server.client() as client:
        completed(client, "a1", "a2", "a3", "a4")
        completed(client, "b1", crew="boom")
        age(server, ["a1", "a2", "a3", "b1"], 2 * HOUR)

        assert archive(client, headers=None, older_than_seconds=0).status_code == 428
        assert archive(client, headers={"X-AIP-Archive-Confirmation": "a1"}, older_than_seconds=0).status_code == 428
        for bad in ({}, {"older_than_seconds": -1}, {"older_than_seconds": 0, "limit": 1001}):
            assert archive(client, **bad).status_code == 422, bad
        assert archive(client, older_than_seconds=0, status=["running"]).status_code == 422
        assert archive(client, older_than_seconds=0, dry_run="no").status_code == 422  # JSON booleans only

        looked = archive(client, older_than_seconds=HOUR, dry_run=True).json()
        assert looked == {"archived": 4, "action_ids": ["a1", "a2", "a3", "b1"], "dry_run": True, "more": 0}
        assert all(exists(client, action) for action in looked["action_ids"])  # a dry run touches none

        failed = archive(client, older_than_seconds=HOUR, status=["failed"]).json()
        assert failed == {"archived": 1, "action_ids": ["b1"], "dry_run": False, "more": 0}
        first = archive(client, older_than_seconds=HOUR, crew_id="demo", limit=2).json()
        assert (first["archived"], first["action_ids"], first["more"]) == (2, ["a1", "a2"], 1)
        assert not exists(client, "a1") and exists(client, "a3") and exists(client, "a4")

        # Every ended record, never the running one: its worker runs on.
        dry = cli(server, "archive", "--older-than", "0s", "--dry-run")
        assert dry.returncode == 0 and "would archive 2 jobs" in dry.stdout and "a4" in dry.stdout, dry
        refused = cli(server, "archive", "--older-than", "1d")
        assert refused.returncode == 1 and "add --yes" in refused.stderr and exists(client, "a3"), refused
        done = cli(server, "archive", "--older-than", "1h", "--yes", "--json")
        assert done.returncode == 0, done.stderr
        assert orjson.loads(done.stdout)["action_ids"] == ["a3"] and exists(client, "a4")
        everything = cli(server, "archive", "--older-than", "0s", "--yes")
        assert everything.returncode == 0 and "archived 1 job" in everything.stdout, everything
        assert not exists(client, "a4")
        job = client.get("/jobs/live").json()
        assert job["status"] == "running" and job["phase"] == "running"
        assert cli(server, "archive", "--older-than", "soon", "--yes").returncode == 2  # argparse: not a duration
        assert psutil.pid_exists(live)
        client.post("/jobs/live/cancel", json={"crew_id": "demo-slow", "action_id": "live"})
