"""Capacity limits reached through HTTP: events per job, bytes per event, bytes per journal."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import gone, start_body, start_server

pytestmark = pytest.mark.usefixtures("launcher")

KEY = {"Idempotency-Key": "key-1"}


def test_event_count_and_event_size_limits_fail_the_job_and_keep_the_terminal(tmp_path: Path) -> None:
    env = {
        "AIP_CREWAI_REGISTRY": "tests.hostile_crews:registry",
        "AIP_CREWAI_MAX_EVENTS_PER_RUN": "5",
        "AIP_CREWAI_MAX_EVENT_BYTES": "2048",
        "AIP_CREWAI_MAX_STATE_BYTES": str(1024 * 1024),
    }
    server = start_server(tmp_path / "state", env=env)
    try:
        with server.client() as client:
            many = client.post("/jobs", json=start_body("demo", "many"), headers=KEY)
            assert many.status_code == 502
            events = client.get("/jobs/many/events").json()["events"]
            assert len(events) == 5 and [e["sequence"] for e in events] == [0, 1, 2, 3, 4]
            terminal = events[-1]["data"]
            assert events[-1]["event"] == "failed" and terminal["error_type"] == "event_limit_exceeded"
            assert terminal["stop_confirmed"] is True and gone(terminal["pid"])

            big = client.post("/jobs", json=start_body("big-chunk", "big"), headers=KEY)
            assert big.status_code == 502 and big.json()["terminal"]["error_type"] == "event_too_large"

            # A completed output too big for one event stays in the record; the journal then passes its bound.
            output = client.post("/jobs", json=start_body("big-output", "out"), headers=KEY)
            assert output.status_code == 200 and len(output.json()["raw"]) == 700 * 1024
            completed = client.get("/jobs/out/events").json()["events"][-1]["data"]
            assert completed["output_in_record"] is True and "output" not in completed
            full = client.post("/jobs", json=start_body("demo", "one-too-many"), headers=KEY)
            assert full.status_code == 507 and client.get("/jobs/one-too-many").status_code == 404
            client.delete("/jobs/out", headers={"X-AIP-Archive-Confirmation": "out"})
    finally:
        server.stop()
