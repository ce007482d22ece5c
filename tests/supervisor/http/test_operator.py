"""The operator API against a real supervisor (default fork server launcher): workers, job list, output."""

from __future__ import annotations

import functools
import time

import httpx
import orjson
import psutil

from tests.conftest import Server, gone, sse_events, start_body, wait_until

MB = 1024 * 1024


def start_and_detach(client: httpx.Client, body: dict[str, object], key: str = "key-1") -> int:
    """Start a streamed job, read its `started` event, hang up (the job goes on); return its pid."""
    with client.stream("POST", "/jobs/stream", json=body, headers={"Idempotency-Key": key}) as response:
        assert response.status_code == 200
        first = next(sse_events(response))
    assert first["event"] == "started"
    return int(first["data"]["pid"])


def test_worker_view_and_output_tail_during_and_after_a_job(server: Server) -> None:
    with server.client() as client:
        pid = start_and_detach(client, start_body("talker", "talk-1", input={"seconds": 60}))

        view = client.get("/workers").json()["workers"]
        (mine,) = [w for w in view if w["action_id"] == "talk-1"]
        assert mine["pid"] == pid and mine["crew_id"] == "talker" and mine["operation"] == "run"
        assert mine["phase"] == "running" and mine["processes"] >= 1
        assert 10 * MB < mine["rss_bytes"] < 2048 * MB
        assert mine["cpu_seconds"] >= 0 and mine["cpu_percent"] >= 0 and mine["age_seconds"] > 0
        assert mine["event_count"] >= 1 and mine["last_event_at"] is not None
        assert psutil.Process(pid).is_running()

        def said_hello() -> bool:
            output = client.get("/jobs/talk-1/output").json()
            return "hello on stdout" in output["stdout"]["text"] and "hello on stderr" in output["stderr"]["text"]

        assert wait_until(said_hello, timeout=10)
        (mine,) = [w for w in client.get("/workers").json()["workers"] if w["action_id"] == "talk-1"]
        assert mine["last_output"] == "talker: hello on stdout"  # stdout's last line, before stderr's
        assert 0 < mine["seconds_left"] <= 600 and mine["memory_limit_bytes"] == 2048 * MB
        # As the cap measures it: the kernel's charge, or PSS, which counts the fork server's pages by share.
        assert mine["memory_measure"] in ("cgroup", "pss") and 0 < mine["memory_bytes"] < 2048 * MB
        during = client.get("/jobs/talk-1/output").json()
        assert during["live"] is True and during["stdout"]["total_bytes"] >= len("talker: hello on stdout\n")

        client.post("/jobs/talk-1/cancel", json={"crew_id": "talker", "action_id": "talk-1", "reason": "test"})
        assert wait_until(lambda: gone(pid))
        assert all(w["action_id"] != "talk-1" for w in client.get("/workers").json()["workers"])
        after = client.get("/jobs/talk-1/output").json()
        assert after["live"] is False
        assert "hello on stdout" in after["stdout"]["text"] and "hello on stderr" in after["stderr"]["text"]
        assert after["stdout"]["total_bytes"] >= during["stdout"]["total_bytes"]

        # Archived: its captured output goes with it.
        client.delete("/jobs/talk-1", headers={"X-AIP-Archive-Confirmation": "talk-1"})
        assert client.get("/jobs/talk-1/output").status_code == 404


def test_output_of_a_completed_job_and_bad_ids(server: Server) -> None:
    with server.client() as client:
        assert client.post("/jobs", json=start_body("chatty", "chat-1"), headers={"Idempotency-Key": "k"}).is_success
        output = client.get("/jobs/chat-1/output").json()
        assert output["live"] is False and "panel panel" in output["stdout"]["text"]
        assert output["stdout"]["total_bytes"] > 5000 and output["stderr"]["total_bytes"] > 7000
        assert client.get("/jobs/nobody/output").status_code == 404
        assert client.get("/jobs/%20" + "x" * 300 + "/output").status_code == 422
        for path in ("/jobs", "/workers", "/jobs/chat-1/output"):
            assert httpx.get(server.url + path, headers={"Authorization": "Bearer wrong"}).status_code == 401


def test_job_list_filters_and_paging(server: Server) -> None:
    """Other tests of this module add talker and chatty jobs: filters keep to this test's crews."""
    with server.client() as client:
        for n in range(3):
            client.post("/jobs", json=start_body("demo", f"ok-{n}"), headers={"Idempotency-Key": "k"})
        for n in range(2):
            client.post("/jobs", json=start_body("broken-factory", f"bad-{n}"), headers={"Idempotency-Key": "k"})

        def listed(**params: object) -> list[str]:
            return [job["action_id"] for job in client.get("/jobs", params=params).json()["jobs"]]

        everything = client.get("/jobs", params={"limit": 500}).json()
        ids = [job["action_id"] for job in everything["jobs"]]
        assert ids[:5] == ["bad-1", "bad-0", "ok-2", "ok-1", "ok-0"] and everything["next_cursor"] is None
        assert [job["admitted_at"] for job in everything["jobs"]] == sorted(
            (job["admitted_at"] for job in everything["jobs"]), reverse=True
        )
        paged, cursor = [], None
        while True:
            page = client.get("/jobs", params={"limit": 2, **({"cursor": cursor} if cursor else {})}).json()
            assert len(page["jobs"]) <= 2
            paged += [job["action_id"] for job in page["jobs"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert paged == ids

        assert listed(crew_id="broken-factory", status="failed") == ["bad-1", "bad-0"]
        rows = {job["action_id"]: job for job in everything["jobs"]}
        why = ("crew_factory_failed", "ValueError", "the crew factory raised ValueError")
        assert (rows["bad-0"]["reason"], rows["bad-0"]["error_type"], rows["bad-0"]["message"]) == why
        assert (rows["ok-0"]["reason"], rows["ok-0"]["error_type"], rows["ok-0"]["message"]) == (None, None, None)
        assert listed(crew_id="demo", limit=2) == ["ok-2", "ok-1"]
        assert listed(crew_id="demo", status="completed") == ["ok-2", "ok-1", "ok-0"]
        assert listed(crew_id="demo", status="failed") == []
        assert listed(operation="run") == ids and listed(operation="batch_run") == []

        for bad in ({"limit": 0}, {"limit": 501}, {"limit": "many"}, {"status": "asleep"}, {"cursor": "nope"}):
            response = client.get("/jobs", params=bad)
            assert response.status_code == 422, bad
        assert "cursor" in client.get("/jobs", params={"cursor": "nope"}).json()["detail"]


def test_an_idle_supervisor_uses_no_cpu(server: Server) -> None:
    """Nothing ticks with nothing to do: no housekeeping without a live job, pending chunk or orphan, and
    no uvicorn poll (a signal wakes the loop; the Date header is stamped per response)."""
    with server.client() as client:
        response = client.post("/jobs", json=start_body("demo", "idle-1"), headers={"Idempotency-Key": "idle"})
        assert response.status_code == 200
        assert wait_until(lambda: client.get("/workers").json()["workers"] == [])
        assert response.headers["date"].endswith(" GMT")
    supervisor = psutil.Process(server.pid)
    seen = [supervisor.num_ctx_switches().voluntary]

    def settled() -> bool:
        """Housekeeping's last round has passed: no wake-up since the previous look, 0.5 s ago."""
        now = supervisor.num_ctx_switches().voluntary
        seen.append(now)
        return now == seen[-2]

    assert wait_until(settled, timeout=15, interval=0.5)
    cpu, switches, began = supervisor.cpu_times(), supervisor.num_ctx_switches().voluntary, time.monotonic()
    time.sleep(4)
    after, elapsed = supervisor.cpu_times(), time.monotonic() - began
    used = (after.user + after.system) - (cpu.user + cpu.system)
    woken = supervisor.num_ctx_switches().voluntary - switches
    # Before: ~1 % of a core and ~28 wake-ups a second. Generous bounds for a shared machine.
    assert used <= 0.02 * elapsed, f"{used * 1000:.0f} ms of CPU in {elapsed:.1f} s idle"
    assert woken <= 2 * elapsed, f"{woken} wake-ups in {elapsed:.1f} s idle"


def test_the_console_is_not_served_unless_turned_on(server: Server) -> None:
    """Off by default: /console is one more unknown path, behind the token like every other."""
    with server.client() as client:
        assert client.get("/console/").status_code == 404
    with server.client(token="wrong") as client:
        assert client.get("/console/").status_code == 401


def test_a_crews_exception_is_kept_whole_for_the_operator_and_generic_in_the_contract(server: Server) -> None:
    """The event says what the reference says; the job's stderr (its output route, ``show``, the console) and the
    supervisor's log hold the exception the crew raised, with its traceback, for the operator."""
    with server.client() as client:
        for crew, said, raised in (
            ("boom", "CrewAI operation failed", "RuntimeError: provider said: secret-token-123"),
            ("broken-factory", "the crew factory raised ValueError", "ValueError: factory cannot build this crew"),
        ):
            answer = client.post("/jobs", json=start_body(crew, f"why-{crew}"), headers={"Idempotency-Key": crew})
            assert answer.status_code == 502 and answer.json()["terminal"]["message"] == said, answer.text
            stderr = client.get(f"/jobs/why-{crew}/output").json()["stderr"]["text"]
            assert "Traceback (most recent call last):" in stderr and raised in stderr, stderr
            assert wait_until(functools.partial(logged_traceback, server, f"why-{crew}"))
            logged = str(logged_traceback(server, f"why-{crew}"))
            assert logged.startswith("Traceback (most recent call last):") and raised in logged, logged


def logged_traceback(server: Server, action_id: str) -> str | None:
    """The traceback the supervisor's log (JSON lines) gives for a job's crew, if it has logged it yet."""
    for line in server.log.read_text(errors="replace").splitlines():
        record = orjson.loads(line) if line.startswith("{") else {}
        if record.get("event") == "the crew raised" and record.get("action_id") == action_id:
            return str(record["traceback"])
    return None
