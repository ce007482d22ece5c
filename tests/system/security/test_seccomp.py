"""From inside a job, the calls a crew never needs are refused by the worker's seccomp filter.

The prober (``tests/crews/prober.py``, input ``attack``) attacks another job's worker, which shares its uid and is
dumpable while it runs, so that only the filter stands in the way: PTRACE_ATTACH, process_vm_readv and
pidfd_getfd on it; then the kernel: a user namespace (unshare, and clone with CLONE_NEWUSER), a mount, the
keyrings, a BPF map, a perf event, userfaultfd, open_by_handle_at. Each gets EPERM; clone3 ENOSYS. On both
launchers: a forked worker inherits the fork server's filter, a spawned one installs its own.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import gone_for_good, ours, sse_events, start_body, start_server
from worker.seccomp import native_x86_64

pytestmark = pytest.mark.skipif(not native_x86_64(), reason="the deny-list's numbers are x86_64's; elsewhere clone3")


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
            answer = client.post("/jobs", json=body, headers={"Idempotency-Key": "attacker"}, timeout=60)
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
