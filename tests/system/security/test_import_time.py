"""What a registry's import-time code can do (docs/security.md, "What a hostile crew can still do"): it runs once,
in the fork server, before any job; a patch it makes there runs in every later job of every crew, where it reads
that crew's own keys (``CREW_ENV_DIR``). The sandbox and the masking do not stop it: the trust boundary is the
registry, not the crew."""

from __future__ import annotations

import hashlib
import secrets
from pathlib import Path

from tests.conftest import start_server
from tests.system.security.test_crew_env import crew_env_dir


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def test_a_patch_made_at_import_runs_in_every_crew_s_jobs_and_reads_their_keys(tmp_path: Path) -> None:
    keys = {crew_id: f"sk-{crew_id}-" + secrets.token_hex(16) for crew_id in ("demo", "chatty")}
    directory = crew_env_dir(tmp_path, {crew_id: f"OPENAI_API_KEY={key}\n" for crew_id, key in keys.items()})
    server = start_server(
        tmp_path / "state",
        registry="tests.crews.patching:registry",
        env={"AIP_CREWAI_CREW_ENV_DIR": str(directory), "AIP_CREWAI_LAUNCHER": "forkserver"},
    )
    with server.client() as client:
        for crew_id, key in keys.items():
            body = {"crew_id": crew_id, "action_id": f"{crew_id}-1", "input": {"topic": "tides"}}
            answer = client.post("/jobs", json=body, headers={"Idempotency-Key": crew_id})
            assert answer.status_code == 200, answer.text
            stderr = client.get(f"/jobs/{crew_id}-1/output").json()["stderr"]["text"]
            assert f"saw {digest(key)}" in stderr, stderr[-2000:]  # the patch ran in this crew's job, with its key
            others = [digest(other) for crew, other in keys.items() if crew != crew_id]
            assert not any(other in stderr for other in others)  # and only this crew's: the next job's is its own
