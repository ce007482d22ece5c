"""Capacity limits reached through HTTP: events per job, bytes per event and per output, bytes per journal.

An output must fit in its `completed` event (the real client takes that event's data as the output), so
an output over `MAX_EVENT_BYTES` fails the job as the reference's does; the worker's own bound is 4 MiB.
Each bound is met exactly and passed by one byte.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from protocol.frames import MAX_OUTPUT_BYTES
from tests.conftest import gone, start_body, start_server

pytestmark = pytest.mark.usefixtures("launcher")

KEY = {"Idempotency-Key": "key-1"}


def sized(client: httpx.Client, action_id: str, size: int) -> httpx.Response:
    """Run the crew whose output is a constant plus ``size`` bytes of raw."""
    body = start_body("sized-output", action_id, input={"bytes": size})
    return client.post("/jobs", json=body, headers=KEY)


def size_of_output(client: httpx.Client, raw_bytes: int) -> int:
    """The encoded size of the output that ``raw_bytes`` of raw gives (measured once, on a fresh job)."""
    answer = sized(client, f"probe-{raw_bytes}", raw_bytes)
    assert answer.status_code == 200, answer.text
    return len(orjson.dumps(answer.json()))


def assert_failed_over(client: httpx.Client, action_id: str, reason: str, size: int) -> dict[str, Any]:
    record = client.get(f"/jobs/{action_id}").json()
    events = client.get(f"/jobs/{action_id}/events").json()["events"]
    assert record["status"] == "failed" and record["output"] is None
    assert [e["event"] for e in events][-1] == "failed" and "completed" not in [e["event"] for e in events]
    terminal = record["terminal"]
    assert terminal["error_type"] == "RegistryError" and terminal["reason"] == reason, terminal
    assert terminal["uncertain_outcome"] is True and str(size) in terminal["message"]
    return dict(terminal)


def test_event_count_and_event_size_limits_fail_the_job_and_keep_the_terminal(tmp_path: Path) -> None:
    env = {"AIP_CREWAI_MAX_EVENTS_PER_RUN": "5", "AIP_CREWAI_MAX_EVENT_BYTES": "2048"}
    server = start_server(tmp_path / "state", env=env)
    try:
        with server.client() as client:
            many = client.post("/jobs", json=start_body("runaway-events", "many"), headers=KEY)
            assert many.status_code == 502
            events = client.get("/jobs/many/events").json()["events"]
            assert len(events) == 5 and [e["sequence"] for e in events] == [0, 1, 2, 3, 4]
            terminal = events[-1]["data"]
            assert events[-1]["event"] == "failed" and terminal["reason"] == "event_limit_exceeded"
            assert terminal["message"] == "more than 4 events: AIP_CREWAI_MAX_EVENTS_PER_RUN is 5"  # names the setting
            assert terminal["error_type"] == "RegistryError"  # what the reference reports for it
            assert terminal["stop_confirmed"] is True and gone(terminal["pid"])

            big = client.post("/jobs", json=start_body("big-chunk", "big"), headers=KEY)
            assert big.status_code == 502 and big.json()["terminal"]["reason"] == "event_too_large"
            assert "exceeds AIP_CREWAI_MAX_EVENT_BYTES (2048)" in big.json()["terminal"]["message"]
    finally:
        server.stop()


def test_an_output_fits_its_completed_event_or_the_job_fails(tmp_path: Path) -> None:
    bound = 2048
    env = {"AIP_CREWAI_MAX_EVENT_BYTES": str(bound)}
    server = start_server(tmp_path / "state", env=env)
    try:
        with server.client() as client:
            base = size_of_output(client, 0)
            exact = sized(client, "at-bound", bound - base)
            assert exact.status_code == 200 and len(orjson.dumps(exact.json())) == bound
            completed = client.get("/jobs/at-bound/events").json()["events"][-1]
            assert completed["event"] == "completed" and completed["data"] == exact.json()

            over = sized(client, "over-bound", bound - base + 1)
            assert over.status_code == 502
            terminal = assert_failed_over(client, "over-bound", "event_too_large", bound + 1)
            assert terminal["output_bytes"] == bound + 1 and terminal["limit_bytes"] == bound
    finally:
        server.stop()


def test_the_4_mib_output_bound_and_the_journal_byte_bound(tmp_path: Path) -> None:
    env = {
        "AIP_CREWAI_MAX_EVENT_BYTES": str(MAX_OUTPUT_BYTES),  # the largest setting: the output bound decides
        "AIP_CREWAI_MAX_STATE_BYTES": str(1024 * 1024),
    }
    server = start_server(tmp_path / "state", env=env)
    try:
        with server.client() as client:
            base = size_of_output(client, 0)
            over = sized(client, "over-4mib", MAX_OUTPUT_BYTES - base + 1)
            assert over.status_code == 502
            assert_failed_over(client, "over-4mib", "output_too_large", MAX_OUTPUT_BYTES + 1)

            exact = sized(client, "at-4mib", MAX_OUTPUT_BYTES - base)
            assert exact.status_code == 200 and len(orjson.dumps(exact.json())) == MAX_OUTPUT_BYTES
            stream = client.get("/jobs/at-4mib/events", params={"cursor": 1}, headers={"Accept": "text/event-stream"})
            assert stream.text.startswith("event: completed\n") and stream.text.count("\n\n") == 1

            # The 4 MiB output took the journal past its byte bound: admission says so.
            full = client.post("/jobs", json=start_body("demo", "one-too-many"), headers=KEY)
            assert full.status_code == 507 and client.get("/jobs/one-too-many").status_code == 404
            client.delete("/jobs/at-4mib", headers={"X-AIP-Archive-Confirmation": "at-4mib"})
    finally:
        server.stop()
