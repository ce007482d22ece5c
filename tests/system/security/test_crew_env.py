"""A provider key per crew (``CREW_ENV_DIR``): a job of crew A finds A's key and not B's, B's finds B's and
not A's, and neither finds a supervisor setting (``AIP_CREWAI_*``) or the bearer token, on both launchers; the
fork server holds no crew's key; a rewritten file is read by the next job; a bad file fails the crew's jobs
in one line naming the file and the line, quoting nothing of it, and the other crews' jobs run on."""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import pytest

from protocol import WorkerSettings
from supervisor.testing import Server
from tests.conftest import start_server
from tests.crews.base import LEAKED_KEY
from tests.crews.prober import digest

# The fork server's own: what the worker contract always writes (WORKER_IDS, TRAINING_DIR only when set, not here).
WORKER_SETTINGS = set(WorkerSettings().to_environ())


def crew_env_dir(tmp_path: Path, files: dict[str, str]) -> Path:
    directory = tmp_path / "crew-env"
    directory.mkdir(mode=0o700)
    for crew_id, text in files.items():
        (directory / f"{crew_id}.env").write_text(text)
        (directory / f"{crew_id}.env").chmod(0o600)
    return directory


def serve(tmp_path: Path, directory: Path, token: str, **env: str) -> Server:
    """A supervisor on ``directory`` with the token also under a name of no setting's."""
    settings = {"AIP_CREWAI_CREW_ENV_DIR": str(directory), "COPY_OF_TOKEN": token}
    return start_server(tmp_path / "state", token=token, env={**settings, **env})


def run(server: Server, crew_id: str, action_id: str, status: int = 200) -> dict[str, Any]:
    with server.client() as client:
        body = {"crew_id": crew_id, "action_id": action_id, "input": {"environ": True}}
        answer = client.post("/jobs", json=body, headers={"Idempotency-Key": action_id})
    assert answer.status_code == status, answer.text
    return answer.json()


def environ(server: Server, crew_id: str, action_id: str) -> tuple[dict[str, str], list[str]]:
    """What the job's code saw: its environment, each value as its digest, and its initial block's names."""
    found = json.loads(run(server, crew_id, action_id)["raw"])
    return found["environ"], found["initial"]


def block(pid: int) -> bytes:
    """A process's initial environment block (this suite runs as root, so the fork server's is readable)."""
    return Path(f"/proc/{pid}/environ").read_bytes()


# WORKER_ENV naming settings and the token's copy passes neither.
@pytest.mark.parametrize(("launcher", "worker_env"), [("forkserver", ""), ("spawn", "AIP_CREWAI_*,COPY_OF_TOKEN,P*")])
def test_each_crew_gets_its_own_key_and_no_job_a_setting_or_the_token(
    tmp_path: Path, launcher: str, worker_env: str
) -> None:
    key_a, key_b = "sk-a-" + secrets.token_hex(16), "sk-b-" + secrets.token_hex(16)
    files = {
        "crew-a": f"# crew A's provider\nOPENAI_API_KEY={key_a}\n\nA_ONLY = a\n",
        "crew-b": f"OPENAI_API_KEY={key_b}\n",
    }
    directory = crew_env_dir(tmp_path, files)
    token = secrets.token_urlsafe(16)
    server = serve(
        tmp_path,
        directory,
        token,
        AIP_CREWAI_LAUNCHER=launcher,
        AIP_CREWAI_PREFORK="1",
        AIP_CREWAI_WORKER_ENV=worker_env,
    )
    seen_a, initial_a = environ(server, "crew-a", "a-1")
    seen_b, initial_b = environ(server, "crew-b", "b-1")
    seen_other, _ = environ(server, "prober", "other-1")  # a crew without a file

    assert (seen_a["OPENAI_API_KEY"], seen_a["A_ONLY"]) == (digest(key_a), digest("a"))
    assert seen_b["OPENAI_API_KEY"] == digest(key_b) and "A_ONLY" not in seen_b
    assert "OPENAI_API_KEY" not in seen_other
    for seen, initial in ((seen_a, initial_a), (seen_b, initial_b), (seen_other, [])):
        assert not [name for name in seen if name.startswith("AIP_CREWAI_")], sorted(seen)
        assert digest(token) not in seen.values() and "COPY_OF_TOKEN" not in seen
        assert {"PATH", "PYTHONPATH", "HOME", "CREWAI_STORAGE_DIR", "TMPDIR", "CREWAI_DISABLE_TELEMETRY"} <= set(seen)
        assert not [name for name in initial if "BEARER_TOKEN" in name or name == "COPY_OF_TOKEN"]
    forkserver = server.forkserver()
    assert (forkserver is not None) == (launcher == "forkserver")
    if forkserver is not None:  # what every forked worker's own block starts as
        names = {item.split(b"=", 1)[0].decode() for item in block(forkserver.pid).split(b"\0") if item}
        assert {name for name in names if name.startswith("AIP_CREWAI_")} <= WORKER_SETTINGS
        assert not {key_a.encode(), key_b.encode(), token.encode()} & set(block(forkserver.pid).split(b"="))

    rotated = "sk-a-" + secrets.token_hex(16)
    (directory / "crew-a.env").write_text(f"OPENAI_API_KEY={rotated}\n")  # read again at the next job's start
    assert environ(server, "crew-a", "a-2")[0]["OPENAI_API_KEY"] == digest(rotated)


def test_a_crew_s_values_are_redacted_whatever_their_names(tmp_path: Path) -> None:
    """``leaky`` prints its key on stdout and stderr and fails quoting it; here the key comes from its crew's
    file, where it would be a secret even under a name that does not look like one."""
    key = "acme-" + secrets.token_hex(16)
    directory = crew_env_dir(tmp_path, {"leaky": f"{LEAKED_KEY}={key}\nPLAIN_LOOKING={key}x\n"})
    server = serve(tmp_path, directory, secrets.token_urlsafe(16))
    with server.client() as client:
        answer = client.post("/jobs", json={"crew_id": "leaky", "action_id": "leak"}, headers={"Idempotency-Key": "l"})
        assert answer.status_code == 502, answer.text
        output = client.get("/jobs/leak/output").json()
    assert "Incorrect API key provided: [redacted]" in output["stderr"]["text"]
    assert key not in json.dumps(output) and key not in server.log.read_text()


@pytest.mark.parametrize(
    ("text", "mode", "said"),
    [
        ("GOOD=1\nsk-secret-in-a-bad-line\n", 0o600, "crew-a.env, line 2: not NAME=VALUE"),
        ("export OPENAI_API_KEY=sk-secret-in-a-bad-line\n", 0o600, "crew-a.env, line 1: not NAME=VALUE"),
        ("HOME=/elsewhere\n", 0o600, "crew-a.env, line 1: HOME is the supervisor's to set"),
        ("AIP_CREWAI_WORKER_NICE=0\n", 0o600, "line 1: AIP_CREWAI_WORKER_NICE is the supervisor's to set"),
        ("K=sk-secret-in-a-bad-line\nK=2\n", 0o600, "crew-a.env, line 2: K is set twice"),
        ("K=1\n", 0o620, "crew-a.env: mode 0620"),
        ("K=" + "x" * 70_000, 0o600, "crew-a.env: larger than 65536 bytes"),
    ],
)
def test_a_bad_file_fails_its_crew_s_jobs_naming_the_file_and_line(
    tmp_path: Path, text: str, mode: int, said: str
) -> None:
    directory = crew_env_dir(tmp_path, {"crew-a": text, "crew-b": "OPENAI_API_KEY=sk-b\n"})
    (directory / "crew-a.env").chmod(mode)
    server = serve(tmp_path, directory, secrets.token_urlsafe(16), AIP_CREWAI_PREFORK="1")
    failed = run(server, "crew-a", "bad", status=502)["terminal"]
    assert failed["reason"] == "crew_env_invalid" and failed["uncertain_outcome"] is False, failed
    assert said in failed["message"] and str(directory) in failed["message"], failed["message"]
    assert "sk-secret" not in json.dumps(failed) and "sk-secret" not in server.log.read_text()
    assert environ(server, "crew-b", "good")[0]["OPENAI_API_KEY"] == digest("sk-b")  # the other crews run on
