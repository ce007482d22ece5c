"""No job output, however crafted, makes the journal unopenable: a job that ends its stderr with its crew's key
(an eight-character key whole, or a longer key's first six characters, each masked by a longer marker) is stored
within its byte count, and the supervisor, stopped with SIGTERM, starts again on that journal and serves it."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from tests.conftest import start_body, start_server, stop_server
from tests.crews.base import LEAKED_KEY
from tests.system.security.test_crew_env import crew_env_dir


@pytest.mark.parametrize(
    ("key", "chars"),
    [("k3y-" + secrets.token_hex(2), 8), ("sk-acme-" + secrets.token_hex(8), 6)],
    ids=["whole-8-character-key", "first-6-characters-of-a-key"],
)
def test_a_job_that_ends_its_stderr_with_its_key_cannot_stop_the_next_start(
    tmp_path: Path, key: str, chars: int
) -> None:
    env = {"AIP_CREWAI_CREW_ENV_DIR": str(crew_env_dir(tmp_path, {"key-tail": f"{LEAKED_KEY}={key}\n"}))}
    first = start_server(tmp_path / "state", env=env)
    with first.client() as client:
        body = start_body("key-tail", "tail-1", input={"chars": chars})
        answer = client.post("/jobs", json=body, headers={"Idempotency-Key": "tail"})
        assert answer.status_code == 200, answer.text
    first.stop()  # SIGTERM: a clean stop
    assert first.process.returncode is not None

    again = start_server(tmp_path / "state", env=env)  # it refused here: the journal was "inconsistent"
    with again.client() as client:
        assert client.get("/health").json()["status"] == "ready"
        record = client.get("/jobs/tail-1")
        assert record.status_code == 200 and record.json()["status"] == "completed"  # served, not quarantined
        stderr = client.get("/jobs/tail-1/output").json()["stderr"]
    # All it wrote was the key or its part: its marker, longer, does not fit in what it counts, so nothing is shown.
    assert stderr == {"text": "", "total_bytes": chars}
    assert "quarantined" not in again.log_tail()
    stop_server(again)
