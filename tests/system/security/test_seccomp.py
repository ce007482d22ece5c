"""From inside a job, the calls a crew never needs are refused by the worker's seccomp filter.

The prober (``tests/crews/prober.py``, input ``attack``) attacks another job's worker, which shares its uid and is
dumpable while it runs, so that only the filter stands in the way: PTRACE_ATTACH, process_vm_readv and
pidfd_getfd on it; then the kernel: a user namespace (unshare, and clone with CLONE_NEWUSER), a mount, the
keyrings, a BPF map, a perf event, userfaultfd, open_by_handle_at. Each gets EPERM; clone3 ENOSYS. On both
launchers: a forked worker inherits the fork server's filter, a spawned one installs its own.

Given ``neighbours``, it changes the limits, nice value, scheduling, affinity and I/O priority of the supervisor,
the fork server and another job's worker (and of their process groups): EPERM each, and read from outside nothing
changed; as root, where the kernel would let every one through, and with the workers' own uid (``WORKER_USER``),
which the fork server and every worker share. Its own calls (pid 0) still work; SysV IPC gets ENOSYS, a POSIX
shared memory object in /dev/shm EACCES (Landlock).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import psutil
import pytest

from tests.conftest import TEST_REGISTRY, Server, gone_for_good, ours, sse_events, start_body, start_server
from tests.helpers.attacks import observe
from tests.system.security import test_worker_user as worker_user
from worker.seccomp import native_x86_64

ids, runtime = worker_user.ids, worker_user.runtime  # its fixtures: the workers' user, an interpreter it can run
pytestmark = pytest.mark.skipif(not native_x86_64(), reason="the deny-list's numbers are x86_64's; elsewhere clone3")

HANG_GUARD = 300  # seconds: a blocking start whose worker may import CrewAI cold, on a loaded machine


@pytest.mark.parametrize("launcher", ["forkserver", "spawn"])
def test_a_job_is_refused_what_a_crew_never_needs(tmp_path: Path, launcher: str) -> None:
    server = start_server(tmp_path / "state", env={"AIP_CREWAI_LAUNCHER": launcher})
    try:
        with server.client() as client:
            body = start_body("demo-slow", "victim", input={"seconds": 600})
            with client.stream("POST", "/jobs/stream", json=body, headers={"Idempotency-Key": "victim"}) as stream:
                started = next(sse_events(stream))
            assert started["event"] == "started", started
            victim = ours(server, started["data"]["pid"])  # hanging up never cancels the job
            body = start_body("prober", "attacker", input={"attack": victim.pid})
            # A hang guard, not a speed check: on spawn the attacker's worker imports CrewAI cold, which took over a
            # minute at load 9 (the suite beside other work), so the guard sits where the suite's others do.
            answer = client.post("/jobs", json=body, headers={"Idempotency-Key": "attacker"}, timeout=HANG_GUARD)
            assert answer.status_code == 200, answer.text
            found = json.loads(answer.json()["raw"])
            assert victim.is_running() and client.get("/jobs/victim").json()["status"] == "running"
            cancel = client.post("/jobs/victim/cancel", json={"crew_id": "demo-slow", "action_id": "victim"})
            assert cancel.json()["status"] == "cancelled", cancel.text
    finally:
        server.stop()
    assert found["filter"] == {"Seccomp": "2", "NoNewPrivs": "1"}, found
    expected = {name: "ENOSYS" if name == "clone3" else "EPERM" for name in found["attacks"]}
    assert found["attacks"] == expected
    assert gone_for_good(victim)


def _started(client: object, body: dict[str, object], key: str) -> int:
    with client.stream("POST", "/jobs/stream", json=body, headers={"Idempotency-Key": key}) as stream:  # type: ignore[attr-defined]
        started = next(sse_events(stream))
    assert started["event"] == "started", started
    return int(started["data"]["pid"])


def _neighbours_of_a_job(server: Server) -> tuple[dict[str, int], dict[str, object]]:
    """Start a job that runs on; then the prober, given the supervisor, the fork server and that job's worker. What
    it found, and how each target was before it and after it, read from outside."""
    forkserver = server.forkserver()
    with server.client() as client:
        victim = ours(server, _started(client, start_body("demo-slow", "victim", input={"seconds": 600}), "victim"))
        targets = {"supervisor": server.pid, "victim": victim.pid}
        targets |= {"forkserver": forkserver.pid} if forkserver is not None else {}
        before = {name: observe(pid) for name, pid in targets.items()}
        body = start_body("prober", "attacker", input={"neighbours": targets})
        answer = client.post("/jobs", json=body, headers={"Idempotency-Key": "attacker"}, timeout=HANG_GUARD)
        assert answer.status_code == 200, answer.text
        after = {name: observe(pid) for name, pid in targets.items()}
        assert client.get("/jobs/victim").json()["status"] == "running"
        cancel = client.post("/jobs/victim/cancel", json={"crew_id": "demo-slow", "action_id": "victim"})
        assert cancel.json()["status"] == "cancelled", cancel.text
    assert after == before
    assert gone_for_good(victim)
    return targets, json.loads(answer.json()["raw"])


def _refused_to_change_others_and_not_itself(found: dict[str, object], readable: set[str]) -> None:
    """Every change on another process EPERM; reading its limits allowed where the kernel allows it (``readable``);
    its own calls as the C library and Python make them (pid 0) allowed, psutil's, which name its pid, not."""
    others = found["others"]
    assert isinstance(others, dict)
    for name, outcomes in others.items():
        expected = dict.fromkeys(outcomes, "EPERM") | {"prlimit_read": "ok" if name in readable else "EPERM"}
        assert outcomes == expected, name
    itself = found["itself"]
    assert itself == {**dict.fromkeys(itself, "ok"), "psutil_nice": "AccessDenied"}  # type: ignore[arg-type]
    assert found["sysv"] == dict.fromkeys(("shmget", "msgget", "semget"), "ENOSYS")
    assert found["posix_shm"] == "EACCES"


@pytest.mark.parametrize("launcher", ["forkserver", "spawn"])
def test_a_job_cannot_change_another_process_limits_or_priorities(tmp_path: Path, launcher: str) -> None:
    server = start_server(tmp_path / "state", env={"AIP_CREWAI_LAUNCHER": launcher})
    try:
        targets, found = _neighbours_of_a_job(server)
    finally:
        server.stop()
    assert ("forkserver" in targets) == (launcher == "forkserver")
    _refused_to_change_others_and_not_itself(found, readable=set(targets))


@worker_user.root_only
@pytest.mark.parametrize("launcher", ["forkserver", "spawn"])
def test_with_the_workers_own_uid_too(
    base: Path, ids: tuple[int, int], runtime: tuple[str, list[str]], launcher: str
) -> None:
    """The fork server and every worker share that uid: only the filter stands between them. The supervisor is
    root's: the kernel refuses it to the workers already (reading its limits too)."""
    python, packages = runtime
    env = {
        "AIP_CREWAI_REGISTRY": TEST_REGISTRY,
        "AIP_CREWAI_LAUNCHER": launcher,
        "AIP_CREWAI_WORKER_USER": worker_user.USER,
    }
    server = start_server(base / "state", env=env, python=python, path=packages)
    try:
        targets, found = _neighbours_of_a_job(server)
    finally:
        server.stop()
    _refused_to_change_others_and_not_itself(found, readable=set(targets) - {"supervisor"})


@worker_user.root_only
@pytest.mark.parametrize("launcher", ["forkserver", "spawn"])
def test_as_the_container_runs_it_one_uid_for_the_supervisor_and_its_workers(
    base: Path, ids: tuple[int, int], runtime: tuple[str, list[str]], launcher: str
) -> None:
    """The container's layout: the supervisor, the fork server and every worker share one uid, with no capability
    (here ``nobody``, started by root): the kernel lets each change the others' limits and priorities, so only the
    filter stands between a job and the supervisor itself."""
    python, packages = runtime
    home = base / "home"
    home.mkdir(mode=0o700)
    os.chown(home, *ids)
    env = {"AIP_CREWAI_LAUNCHER": launcher, "HOME": str(home)}
    server = start_server(home / "state", env=env, python=python, path=packages, user=ids)
    try:
        assert psutil.Process(server.pid).uids().real == ids[0]
        targets, found = _neighbours_of_a_job(server)
    finally:
        server.stop()
    assert ("forkserver" in targets) == (launcher == "forkserver")
    _refused_to_change_others_and_not_itself(found, readable=set(targets))
