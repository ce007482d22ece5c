"""Cancelling many jobs at once, by crew, phase or operation: each one's worker and tree killed, each with its proof;
the others untouched; a dry run touches none; a request that names no jobs is refused."""

from __future__ import annotations

import orjson
import psutil

from tests.conftest import Server, gone, sse_events, start_body, wait_until
from tests.supervisor.console.test_cli import cli


def start_running(server: Server, crew: str, action: str) -> int:
    """Start a ticking job, wait until it runs, hang up (it goes on); its worker's pid."""
    body = start_body(crew, action, input={"seconds": 60})
    with (
        server.client() as client,
        client.stream("POST", "/jobs/stream", json=body, headers={"Idempotency-Key": action}) as response,
    ):
        return int(next(sse_events(response))["data"]["pid"])


def test_a_crew_s_running_jobs_are_cancelled_at_once_with_each_one_s_proof(server: Server) -> None:
    pids = {action: start_running(server, "demo-slow", action) for action in ("bulk-1", "bulk-2", "bulk-3")}
    bystander = start_running(server, "talker", "bulk-bystander")
    with server.client() as client:
        looked = client.post("/jobs/cancel", json={"crew_id": "demo-slow", "phase": "running", "dry_run": True})
        assert looked.status_code == 200, looked.text
        named = looked.json()
        assert named["dry_run"] is True and named["more"] == 0
        assert sorted(job["action_id"] for job in named["jobs"]) == sorted(pids)
        assert all(job["status"] == "running" and job["phase_before"] == "running" for job in named["jobs"])
        assert all(psutil.pid_exists(pid) for pid in pids.values())  # a dry run touches none

    done = cli(server, "cancel", "--crew", "demo-slow", "--status", "running", "--reason", "all of them")
    assert done.returncode == 0, done.stderr
    assert "cancelled 3 jobs" in done.stdout, done.stdout
    for action, pid in pids.items():
        assert f"{action} cancelled (stop confirmed: True, pid {pid}, SIGKILL" in done.stdout, done.stdout
        assert gone(pid)
    with server.client() as client:
        for action in pids:
            record = client.get(f"/jobs/{action}").json()
            assert record["status"] == "cancelled" and record["terminal"]["reason"] == "all of them"
        assert client.get("/jobs/bulk-bystander").json()["status"] == "running" and psutil.pid_exists(bystander)

        as_json = cli(server, "cancel", "--crew", "talker", "--json")
        assert as_json.returncode == 0, as_json.stderr
        (stopped,) = orjson.loads(as_json.stdout)["jobs"]
        assert stopped["action_id"] == "bulk-bystander" and stopped["terminal"]["stop_confirmed"] is True
        assert wait_until(lambda: gone(bystander))


def test_a_bulk_cancel_must_name_its_jobs_and_takes_no_unknown_field(server: Server) -> None:
    with server.client() as client:
        for body, says in (
            ({}, "name the jobs"),
            ({"reason": "everything?"}, "name the jobs"),
            ({"phase": "settling"}, "phase"),
            ({"crew_id": "demo", "status": "running"}, "status"),
            ({"crew_id": ""}, "crew_id"),
            ({"crew_id": "x" * 257}, "crew_id"),
            ({"phase": "completed"}, "phase"),
            ({"operation": "fly"}, "operation"),
            ({"crew_id": "demo", "dry_run": "yes"}, "dry_run"),  # JSON booleans only: a typo stops nothing
            ({"all": 1}, "all"),
            ({"crew_id": "demo", "reason": "r" * 2049}, "reason"),
            (["demo"], "body"),
        ):
            refused = client.post("/jobs/cancel", json=body)
            assert refused.status_code == 422 and says in refused.text, (body, refused.text)
        for raw in (b"", b"{", b'{"crew_id": NaN}'):
            refused = client.post("/jobs/cancel", content=raw, headers={"Content-Type": "application/json"})
            assert refused.status_code == 422, (raw, refused.text)
        none = client.post("/jobs/cancel", json={"crew_id": "no-such-crew"})
        assert none.status_code == 200 and none.json() == {"dry_run": False, "jobs": [], "more": 0}
    for args, says in (
        (("cancel",), "name the job (its id) or the jobs"),
        (("cancel", "some-id", "--crew", "demo"), "not both"),
    ):
        refused = cli(server, *args)
        assert refused.returncode == 1 and says in refused.stderr, refused.stderr
