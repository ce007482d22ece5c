"""What of the supervisor's environment reaches a crew: all of it but its settings (``AIP_CREWAI_*``, the bearer
token's among them) by default, or only what ``WORKER_ENV`` names (with PATH and PYTHONPATH, and the worker's own
places), as process supervisors' environment allow-lists do."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from tests.conftest import start_body, start_server
from tests.crews.base import LEAKED_KEY

PLANTED = {"KEEP_ONE": "1", "KEEP_TWO": "2", "ALSO": "3", "DROP": "4", "AIP_CREWAI_BEARER_TOKEN_HINT": "5"}


def names_a_crew_sees(tmp_path: Path, **settings: str) -> set[str]:
    server = start_server(tmp_path / "state", env={**PLANTED, **settings})
    with server.client() as client:
        answer = client.post("/jobs", json=start_body("environ", "env-1"), headers={"Idempotency-Key": "env"})
        assert answer.status_code == 200, answer.text
        stdout = client.get("/jobs/env-1/output").json()["stdout"]["text"]
    (line,) = [line for line in stdout.splitlines() if line.startswith("environ ")]
    return set(line.split()[1:])


def test_by_default_every_variable_but_the_settings_reaches_a_crew(tmp_path: Path) -> None:
    names = names_a_crew_sees(tmp_path)
    assert {"KEEP_ONE", "KEEP_TWO", "ALSO", "DROP", "PATH"} <= names
    assert not any(name.startswith("AIP_CREWAI_") for name in names)


@pytest.mark.parametrize("listed", ["KEEP_*,ALSO", " KEEP_* , ALSO "])
def test_worker_env_passes_only_what_it_names(tmp_path: Path, listed: str) -> None:
    names = names_a_crew_sees(tmp_path, AIP_CREWAI_WORKER_ENV=listed)
    assert {"KEEP_ONE", "KEEP_TWO", "ALSO", "PATH", "PYTHONPATH"} <= names
    assert {"HOME", "CREWAI_STORAGE_DIR", "TMPDIR"} <= names  # the worker's own, set for it
    assert "DROP" not in names and not any(name.startswith("AIP_CREWAI_") for name in names)


def test_a_key_a_crew_prints_is_nowhere_in_the_journal_the_api_or_the_log(tmp_path: Path) -> None:
    """A provider's error quoting the key it was given (on stdout, on stderr and in the exception): the tails
    kept in the journal and shown by the API (and so by the CLI and the console) say ``[redacted]``."""
    key = "sk-acme-" + secrets.token_hex(16)
    server = start_server(tmp_path / "state", env={LEAKED_KEY: key})
    with server.client() as client:
        answer = client.post("/jobs", json=start_body("leaky", "leak-1"), headers={"Idempotency-Key": "leak"})
        assert answer.status_code == 502, answer.text
        said = [answer.text, *(client.get(f"/jobs/leak-1{path}").text for path in ("", "/events", "/output"))]
        said += [client.get("/jobs").text, client.get("/console").text]
        output = client.get("/jobs/leak-1/output").json()
    assert all(key not in text for text in said)
    assert "calling the provider with [redacted]" in output["stdout"]["text"]  # the line kept, the key not
    assert "Incorrect API key provided: [redacted]" in output["stderr"]["text"]
    journal = sorted((tmp_path / "state").glob("journal.db*"))
    assert journal and all(key.encode() not in path.read_bytes() for path in journal)
    assert key not in server.log.read_text()
