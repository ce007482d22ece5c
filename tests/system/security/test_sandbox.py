"""A job reaches only what is its own: its sandbox (WORKER_SANDBOX, on by default), attacked from inside a job.

While a job of another crew runs (the victim), a job of crew-a (``prober.reach``) tries to read the journal,
the tokens' files, the crews' env files, the training directory and the victim's HOME, storage and TMPDIR; to change
those, the project's code and /etc; to read the memory and environ of the victim's worker, the supervisor and the
fork server, attach to them, take a descriptor from them and signal them; and to connect to an abstract socket the
test holds. Each is refused (EACCES or EPERM), on both launchers; its own places stay readable and writable.
The supervisor runs as root here, so nothing but the sandbox stands in the way of a read or a change.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import socket
from pathlib import Path
from typing import Any

import pytest

from protocol import Layer
from tests.conftest import ROOT, gone_for_good, ours, sse_events, start_body, start_server
from tests.helpers.waiting import SLOWDOWN
from worker import landlock
from worker.seccomp import native_x86_64

DENIED = {"EACCES", "EPERM"}
pytestmark = pytest.mark.skipif(landlock.abi() < 2, reason="a job's sandbox needs Landlock ABI 2")


def _place(state: Path, kind: str, crew_id: str) -> Path:
    return state / kind / hashlib.sha256(crew_id.encode()).hexdigest()[:24]


@pytest.mark.parametrize("launcher", ["forkserver", "spawn"])
def test_a_job_reaches_nothing_outside_its_own(tmp_path: Path, launcher: str) -> None:
    token = secrets.token_urlsafe(16)
    token_file, envs, training = tmp_path / "token", tmp_path / "crew-env", tmp_path / "training"
    token_file.write_text(token)
    token_file.chmod(0o600)
    scoped = {role: tmp_path / f"{role}-tokens" for role in ("observer", "operator")}
    for path in scoped.values():
        path.write_text(f"{secrets.token_urlsafe(16)}\n")
        path.chmod(0o600)
    envs.mkdir(mode=0o700)
    for crew in ("crew-a", "demo-slow"):
        (envs / f"{crew}.env").write_text(f"KEY=sk-{crew}-secret\n")
        (envs / f"{crew}.env").chmod(0o600)
    training.mkdir(mode=0o700)
    (training / "trained.pkl").write_bytes(b"weights")
    settings = {
        "AIP_CREWAI_LAUNCHER": launcher,
        "AIP_CREWAI_BEARER_TOKEN": "",
        "AIP_CREWAI_BEARER_TOKEN_FILE": str(token_file),
        "AIP_CREWAI_OBSERVER_TOKEN_FILE": str(scoped["observer"]),
        "AIP_CREWAI_OPERATOR_TOKEN_FILE": str(scoped["operator"]),
        "AIP_CREWAI_CREW_ENV_DIR": str(envs),
        "AIP_CREWAI_TRAINING_DIR": str(training),
    }
    state = tmp_path / "state"
    server = start_server(state, env=settings, token=token)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    abstract = f"crew-supervisor-test-{secrets.token_hex(8)}"
    listener.bind("\0" + abstract)
    listener.listen()
    try:
        with server.client() as client:
            health = client.get("/health").json()["sandbox"]
            body = start_body("demo-slow", "victim", input={"seconds": 600})
            with client.stream("POST", "/jobs/stream", json=body, headers={"Idempotency-Key": "victim"}) as stream:
                started = next(sse_events(stream))
            assert started["event"] == "started", started
            victim = ours(server, started["data"]["pid"])
            theirs = {
                "home": _place(state, "home", "demo-slow"),
                "storage": _place(state, "storage", "demo-slow"),
                "tmp": Path(victim.cwd()) / "tmp",
            }
            for place in theirs.values():
                (place / "secret.txt").write_text("theirs")
            forkserver = server.forkserver()
            processes = {"victim": victim.pid, "supervisor": server.pid}
            if forkserver is not None:
                processes["forkserver"] = forkserver.pid
            reads = [str(state), str(state / "journal.db"), str(token_file), str(envs), str(envs / "demo-slow.env")]
            reads += [str(training / "trained.pkl"), *(str(place / "secret.txt") for place in theirs.values())]
            reads += [str(path) for path in scoped.values()]
            changes = [str(place) for place in theirs.values()] + [str(state / "journal.db"), str(token_file)]
            changes += [str(envs / "crew-a.env"), str(ROOT / "worker" / "__init__.py"), "/etc/hostname"]
            truncates = [str(state / "journal.db"), str(token_file), str(envs / "crew-a.env"), "/etc/hostname"]
            truncates += [str(path) for path in scoped.values()]
            reach = {"reads": reads, "changes": changes, "processes": processes, "abstract": abstract}
            reach |= {"truncates": truncates, "control_thread": True}
            body = start_body("crew-a", "attacker", input={"reach": reach})
            answer = client.post("/jobs", json=body, headers={"Idempotency-Key": "attacker"}, timeout=60 * SLOWDOWN)
            assert answer.status_code == 200, answer.text
            found: dict[str, Any] = json.loads(answer.json()["raw"])
            assert victim.is_running() and client.get("/jobs/victim").json()["status"] == "running"
            assert [(place / "secret.txt").read_text() for place in theirs.values()] == ["theirs"] * 3
            assert not [place for place in theirs.values() if (place / "probe-wrote-here").exists()]
            cancel = client.post("/jobs/victim/cancel", json={"crew_id": "demo-slow", "action_id": "victim"})
            assert cancel.json()["status"] == "cancelled", cancel.text
    finally:
        listener.close()
        server.stop()
    assert health == {"mode": "auto", "layers": [str(layer) for layer in _offered()], "missing": _missing()}
    assert {path: found["reads"][path] for path in reads} == dict.fromkeys(reads, "EACCES")
    # EROFS: where the code and /etc are a read-only mount (as in scripts/smoke-cgroup2's guest), that refuses first.
    assert found["changes"].keys() == set(changes) and set(found["changes"].values()) <= {"EACCES", "EROFS"}, found
    assert {path: found["changes"][path] for path in changes[:6]} == dict.fromkeys(changes[:6], "EACCES")
    assert set(found["truncates"].values()) <= DENIED and found["truncates"].keys() == set(truncates), found
    assert found["control_thread"] == "EACCES"  # the thread watching the control pipe is in the job's domain too
    signals = "EPERM" if Layer.SIGNALS in _offered() else "ok"
    for name, attempts in found["processes"].items():
        assert attempts == {
            "mem": "EACCES",
            "environ": "EACCES",
            "ptrace": "EPERM",
            "pidfd_getfd": "EPERM",
            "signal": signals,
        }, name
    assert found["abstract"] == ("EPERM" if Layer.SOCKETS in _offered() else "ok")
    assert set(found["own"].values()) == {"ok"} and set(found["own_reads"].values()) == {"ok"}, found
    assert gone_for_good(victim)


def test_a_crew_cannot_plant_code_its_next_worker_would_run_before_its_sandbox(tmp_path: Path) -> None:
    """A job may change its crew's HOME: a .pth file in its user site-packages would run at the start of the crew's
    next cold worker, before that worker drops anything (root, every capability). Workers run without the user
    site (``python -s``), so it never runs."""
    evidence = tmp_path / "evidence"
    evidence.mkdir()
    ran = evidence / "planted-code-ran"
    server = start_server(tmp_path / "state", env={"AIP_CREWAI_LAUNCHER": "spawn"})
    try:
        with server.client() as client:
            text = f"import pathlib; pathlib.Path({str(ran)!r}).touch()\n"
            body = start_body("crew-a", "plant", input={"plant": text})
            answer = client.post("/jobs", json=body, headers={"Idempotency-Key": "plant"}, timeout=120 * SLOWDOWN)
            assert answer.status_code == 200, answer.text
            planted = Path(json.loads(answer.json()["raw"])["planted"])
            body = start_body("crew-a", "next", input={"environ": True})
            answer = client.post("/jobs", json=body, headers={"Idempotency-Key": "next"}, timeout=120 * SLOWDOWN)
            assert answer.status_code == 200, answer.text
    finally:
        server.stop()
    assert planted.is_file() and planted.is_relative_to(_place(tmp_path / "state", "home", "crew-a"))
    assert not ran.exists()


def test_off_runs_jobs_unsandboxed(tmp_path: Path) -> None:
    """The switch is real: with WORKER_SANDBOX=off a job reads the journal (as root here) and signals its supervisor."""
    state = tmp_path / "state"
    server = start_server(state, env={"AIP_CREWAI_WORKER_SANDBOX": "off"})
    try:
        with server.client() as client:
            health = client.get("/health").json()["sandbox"]
            reach = {"reads": [str(state / "journal.db")], "changes": [], "processes": {}, "abstract": "none"}
            body = start_body("crew-a", "attacker", input={"reach": reach})
            answer = client.post("/jobs", json=body, headers={"Idempotency-Key": "attacker"}, timeout=60 * SLOWDOWN)
            assert answer.status_code == 200, answer.text
            found = json.loads(answer.json()["raw"])
    finally:
        server.stop()
    assert health["mode"] == "off" and health["layers"] == [Layer.SECCOMP] * native_x86_64()
    assert found["reads"] == {str(state / "journal.db"): "ok"}


def _offered() -> list[Layer]:
    return [Layer.SECCOMP] * native_x86_64() + landlock.layers(landlock.abi())


def _missing() -> list[str]:
    return [str(layer) for layer in Layer if layer not in _offered()]
