"""The HTTP contract against a real supervisor, real workers and real CrewAI (offline)."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import Server, gone, gone_for_good, ours, sse_events, start_body, wait_until

pytestmark = pytest.mark.usefixtures("launcher")

KEY = {"Idempotency-Key": "key-1"}
SSE = {"Accept": "text/event-stream"}


def stream_job(client: httpx.Client, body: dict[str, Any], key: str = "key-1") -> list[dict[str, Any]]:
    with client.stream("POST", "/jobs/stream", json=body, headers={"Idempotency-Key": key}) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        return list(sse_events(response))


def assert_contiguous(events: list[dict[str, Any]], start: int = 0) -> None:
    assert [e["sequence"] for e in events] == list(range(start, start + len(events)))
    assert [e["event"] for e in events].count(events[-1]["event"]) == 1
    assert events[-1]["event"] in ("completed", "failed", "cancelled")


def started_pid(client: httpx.Client, action: str) -> int:
    def first_event() -> bool:
        response = client.get(f"/jobs/{action}/events")  # 404 until the admission lands
        return response.status_code == 200 and response.json()["events"] != []

    assert wait_until(first_event, timeout=60)
    first = client.get(f"/jobs/{action}/events").json()["events"][0]
    assert first["event"] == "started"
    return int(first["data"]["pid"])


ROUTES = [
    ("GET", "/health"),
    ("POST", "/jobs"),
    ("POST", "/jobs/stream"),
    ("GET", "/jobs/x"),
    ("GET", "/jobs/x/events"),
    ("POST", "/jobs/x/cancel"),
    ("DELETE", "/jobs/x"),
    ("POST", "/runs"),
    ("POST", "/runs/stream"),
    ("GET", "/runs/x"),
    ("POST", "/runs/x/cancel"),
    ("GET", "/metrics"),
    ("GET", "/no-such-route"),
]


@pytest.mark.parametrize(("method", "path"), ROUTES)
def test_every_route_requires_the_bearer_token(server: Server, method: str, path: str) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"bearer {server.token}"}):
        response = httpx.request(method, server.url + path, headers=headers, json={})
        assert response.status_code == 401
        assert response.headers["www-authenticate"] == "Bearer"


def test_health_lists_crews_and_policy(server: Server) -> None:
    with server.client() as client:
        health = client.get("/health").json()
    assert health["status"] == "ready" and health["durable_journal"] is True
    assert {"demo", "demo-slow", "stubborn"} <= set(health["crews"]) and health["crews"] == sorted(health["crews"])
    # The reference's keys first, with its types; its lists sorted, as it sorts them.
    reference = {
        "status": str,
        "crews": list,
        "active_runs": int,
        "retained_runs": int,
        "max_retained_runs": int,
        "durable_journal": bool,
        "stream_checkpoint_events": int,
        "operations": list,
        "training_directory": bool,
    }
    assert list(health)[: len(reference)] == list(reference)
    assert all(type(health[key]) is kind for key, kind in reference.items())
    assert health["operations"] == ["cancel", "events", "run", "status"]
    budget = health["llm_budget"]  # none set here; the crews of tests/crews that ask for one, their own
    assert (budget["max_tokens"], budget["max_llm_calls"]) == (0, 0)
    assert budget["crews"]["llm-loop-calls"] == {"max_tokens": 0, "max_llm_calls": 5} and "demo" not in budget["crews"]
    warmed = health["forkserver"]["warmed"]  # the suite's fork servers warm their offline crews alone (SETTINGS)
    assert warmed["paths"] == [] and warmed["not_warmed"] == {"providers": "AIP_CREWAI_WARMUP=offline"}


def test_metrics_parse_and_move_as_jobs_run(server: Server) -> None:
    def sample(text: str, name: str, **labels: str) -> float:
        for family in text_string_to_metric_families(text):
            for metric in family.samples:
                if metric.name == name and all(metric.labels.get(k) == v for k, v in labels.items()):
                    return metric.value
        return 0.0

    lag = "crew_supervisor_event_loop_lag_seconds_count"
    with server.client() as client:
        before = client.get("/metrics")
        assert before.headers["content-type"].startswith("text/plain")
        client.post("/jobs", json=start_body("demo", "metrics-1"), headers=KEY)
        after = client.get("/metrics").text
        # A launch wakes housekeeping, whose ticks (LIMIT_SAMPLE_MS apart) each observe the loop's lag: the first
        # may come after a fast job's answer, so it is waited for.
        assert wait_until(lambda: sample(client.get("/metrics").text, lag) > sample(before.text, lag), timeout=30)
    for name, labels in [
        ("crew_supervisor_jobs_admitted_total", {"operation": "run"}),
        ("crew_supervisor_jobs_finished_total", {"operation": "run", "outcome": "completed"}),
        ("crew_supervisor_start_seconds_count", {}),
    ]:
        assert sample(after, name, **labels) == sample(before.text, name, **labels) + 1, name
    assert sample(after, "crew_supervisor_journal_bytes") > 0


def test_logs_are_json_lines_without_inputs(server: Server) -> None:
    with server.client() as client:
        body = start_body("demo", "logs-1", input={"topic": "s3cret-input-value"})
        assert client.post("/jobs", json=body, headers=KEY).status_code == 200
    assert wait_until(lambda: '"logs-1"' in server.log.read_text())
    text = server.log.read_text()
    records = [orjson.loads(line) for line in text.splitlines() if line.startswith("{")]
    finished = [r for r in records if r.get("action_id") == "logs-1"]
    assert finished and finished[-1]["event"] == "job finished" and finished[-1]["outcome"] == "completed"
    assert finished[-1]["crew_id"] == "demo" and finished[-1]["duration_ms"] > 0
    assert "s3cret-input-value" not in text and server.token not in text


def test_demo_blocking_run_is_deterministic(server: Server) -> None:
    with server.client() as client:
        first = client.post("/jobs", json=start_body("demo", "det-1", input={"topic": "x"}), headers=KEY)
        second = client.post("/runs", json=start_body("demo", "det-2", input={"topic": "x"}), headers=KEY)
    assert first.status_code == second.status_code == 200
    assert first.json()["raw"] == second.json()["raw"]
    assert first.json()["raw"].startswith("Writer reports finding")
    assert set(first.json()) >= {"raw", "json_dict", "pydantic", "tasks_output", "token_usage"}


def test_stream_then_replay_and_tail(server: Server) -> None:
    with server.client() as client:
        events = stream_job(client, start_body("demo", "stream-1"))
        assert events[0]["event"] == "started" and events[-1]["event"] == "completed"
        assert all(e["event"] == "chunk" and e["data"]["channel"] == "llm" for e in events[1:-1])
        assert len(events) > 3
        assert_contiguous(events)
        # The completed event's data is the output itself, as the reference writes it; the exit status is
        # the record's.
        assert events[-1]["data"]["raw"].startswith("Writer reports finding")
        assert "exit_status" not in events[-1]["data"] and "status" not in events[-1]["data"]
        assert events[0]["data"] == {"status": "running", "operation": "run", "pid": events[0]["data"]["pid"]}

        # An exact repeat is the same job: the same events, no second worker.
        assert stream_job(client, start_body("demo", "stream-1")) == events

        tail = client.get("/jobs/stream-1/events", params={"cursor": 3}).json()
        assert tail["events"] == events[3:] and tail["next_cursor"] == len(events) and tail["cursor"] == 3
        assert client.get("/jobs/stream-1/events", params={"cursor": len(events)}).json()["events"] == []
        for cursor in (-1, len(events) + 1):
            assert client.get("/jobs/stream-1/events", params={"cursor": cursor}).status_code == 416

        with client.stream("GET", "/jobs/stream-1/events", headers={**SSE, "Last-Event-ID": "4"}) as response:
            assert list(sse_events(response)) == events[5:]
        with client.stream("GET", "/jobs/stream-1/events", params={"cursor": 2}, headers=SSE) as response:
            assert list(sse_events(response)) == events[2:]

        record = client.get("/jobs/stream-1").json()
        assert record["status"] == "completed" and record["event_count"] == len(events)
        assert record["output"] == events[-1]["data"] == record["terminal"] and record["exit_status"] == 0
        assert client.get("/runs/stream-1").json() == record


def test_exact_repeat_and_conflicting_reuse(server: Server) -> None:
    body = start_body("demo", "repeat-1", input={"n": 1})
    with server.client() as client:
        first = client.post("/jobs", json=body, headers=KEY)
        count = client.get("/jobs/repeat-1").json()["event_count"]
        again = client.post("/jobs", json=body, headers=KEY)
        assert again.json() == first.json()
        assert client.get("/jobs/repeat-1").json()["event_count"] == count
        events = client.get("/jobs/repeat-1/events").json()["events"]
        assert [e["event"] for e in events].count("started") == 1
        for changed, key in (
            ({**body, "input": {"n": 2}}, KEY),
            ({**body, "timeout_ms": 5}, KEY),
            (body, {"Idempotency-Key": "key-2"}),
        ):
            assert client.post("/jobs", json=changed, headers=key).status_code == 409


def test_admission_rejections_in_order(server: Server) -> None:
    big = {"blob": "x" * (1024 * 1024)}
    cases: list[tuple[str, dict[str, Any], dict[str, str], int]] = [
        ("/jobs", start_body("demo", "r-413", input=big), KEY, 413),
        ("/jobs", start_body("nope", "r-413b", input=big, operation="replay"), {}, 413),
        ("/runs", start_body("demo", "r-400", operation="batch_run"), {}, 400),
        ("/jobs", start_body("demo", "r-403", operation="batch_run"), {}, 403),
        ("/jobs", start_body("demo", "r-428"), {}, 428),
        ("/jobs", start_body("demo", "r-428b"), {"Idempotency-Key": ""}, 428),
        ("/jobs", start_body("demo", "r-400k"), {"Idempotency-Key": "k" * 513}, 400),
        ("/jobs", start_body("demo", "r-400c"), {"Idempotency-Key": "a\tb"}, 400),
        ("/jobs", start_body("demo", "r-422", input={f"p{i}": i for i in range(513)}), KEY, 422),
        ("/jobs", start_body("nope", "r-404"), KEY, 404),
        ("/jobs", {**start_body("demo", "r-422u"), "extra": 1}, KEY, 422),
        ("/jobs", start_body("demo", "r-422t", timeout_ms=True), KEY, 422),
        ("/jobs", start_body("demo", "r-422z", timeout_ms=0), KEY, 422),
        ("/jobs", start_body("demo", "r-422m", timeout_ms=3_600_001), KEY, 422),
        ("/jobs", start_body("demo", "x" * 257), KEY, 422),
        ("/jobs", start_body("demo", "r-422o", operation="fly"), KEY, 422),
    ]
    with server.client() as client:
        for path, body, headers, status in cases:
            response = client.post(path, json=body, headers=headers)
            assert response.status_code == status, (body.get("action_id"), response.text)
            assert "detail" in response.json()
        assert (
            client.post("/jobs", content=b"{not json", headers={**KEY, "content-type": "application/json"}).status_code
            == 422
        )
        assert client.post("/jobs", json=start_body("demo", "r-256-" + "x" * 250), headers=KEY).status_code == 200
        for action in ("r-413", "r-403", "r-428", "r-404"):
            assert client.get(f"/jobs/{action}").status_code == 404  # nothing stored
        assert client.get("/jobs/bad%01id").status_code == 422
        assert client.get("/jobs/" + "x" * 257).status_code == 422
        assert client.get("/jobs/nobody").status_code == 404


@pytest.mark.both_launchers
def test_cancel_mid_stream_kills_the_worker_and_proves_it(server: Server) -> None:
    body = start_body("demo-slow", "cancel-1", input={"seconds": 600})
    seen: list[dict[str, Any]] = []
    two_chunks, failing = threading.Event(), threading.Event()

    def follow() -> None:
        with server.client() as client, client.stream("POST", "/jobs/stream", json=body, headers=KEY) as response:
            for event in sse_events(response):
                seen.append(event)
                if sum(e["event"] == "chunk" for e in seen) >= 2:
                    two_chunks.set()
                if failing.is_set():  # the job streams for 600 s: a failed test stops following it
                    return

    # A cancel that kills nothing answers late or never: 30 s, then the test fails saying so.
    with ThreadPoolExecutor(1) as pool, server.client(timeout=30) as client:
        try:
            follower = pool.submit(follow)
            assert wait_until(lambda: two_chunks.is_set() or follower.done(), timeout=90), "no two chunks in 90 s"
            assert two_chunks.is_set(), f"the stream ended first: {follower.exception()!r}, {seen[-3:]}"
            pid = started_pid(client, "cancel-1")
            worker = ours(server, pid)
            # What ps aux shows of it: its job, not the command line it was forked or spawned with.
            assert (
                " ".join(worker.cmdline()).strip() == "crew-worker demo-slow cancel-1"
                and worker.name() == "crew-worker"
            )
            cancel = {"crew_id": "demo-slow", "action_id": "cancel-1", "reason": "operator stop"}
            response = client.post("/jobs/cancel-1/cancel", json=cancel)
            follower.result(30)
        except BaseException:
            failing.set()
            raise
        record = response.json()
        assert response.status_code == 200 and record["status"] == "cancelled"
        proof = record["terminal"]
        assert proof["stop_confirmed"] is True and proof["pid"] == pid and proof["reason"] == "operator stop"
        assert proof["signal"] == "SIGKILL" and proof["exit_status"] == -9 and proof["elapsed_ms"] >= 0
        assert gone_for_good(worker)
        assert seen[-1] == {"event": "cancelled", "sequence": len(seen) - 1, "data": proof}
        assert_contiguous(seen)
        assert client.get("/jobs/cancel-1").json() == record
        assert client.post("/runs/cancel-1/cancel", json=cancel).json() == record  # terminal: unchanged
        assert client.post("/jobs/cancel-1/cancel", json={**cancel, "action_id": "other"}).status_code == 400
        assert client.post("/jobs/cancel-1/cancel", json={**cancel, "crew_id": "demo"}).status_code == 404
        assert client.post("/jobs/none/cancel", json={**cancel, "action_id": "none"}).status_code == 404
        assert client.post("/jobs/cancel-1/cancel", json={**cancel, "reason": "r" * 2049}).status_code == 422


@pytest.mark.both_launchers
def test_cancel_over_http_kills_a_child_and_a_grandchild_that_left_the_group(server: Server) -> None:
    """The crew's worker starts a child in its group, whose own child calls setsid: both are alive and the
    supervisor's before the cancel, and gone after it, which answers within 30 s or fails (never a hang)."""
    body = start_body("tree", "tree-1")
    with ThreadPoolExecutor(1) as pool, server.client(timeout=30) as client:
        follower = pool.submit(stream_job, client, body, "tree")
        worker = ours(server, started_pid(client, "tree-1"))

        def said() -> list[str]:
            text = client.get("/jobs/tree-1/output").json()["stdout"]["text"]
            return next((line.split()[1:] for line in text.splitlines() if line.startswith("tree ")), [])

        assert wait_until(lambda: len(said()) == 2, timeout=60), "the crew's child never said its pids"
        child, grandchild = (ours(server, int(pid)) for pid in said())
        assert child.ppid() == worker.pid and grandchild.ppid() == child.pid
        assert wait_until(lambda: os.getsid(grandchild.pid) == grandchild.pid, timeout=30)  # it left the group
        assert os.getpgid(grandchild.pid) != worker.pid
        record = client.post("/jobs/tree-1/cancel", json={**body, "reason": "tree"}).json()
        events = follower.result(30)
    proof = record["terminal"]
    assert record["status"] == "cancelled" and events[-1]["event"] == "cancelled"
    assert proof["stop_confirmed"] is True and proof["descendants_killed"] >= 1
    assert all(gone_for_good(process) for process in (worker, child, grandchild))


@pytest.mark.both_launchers
def test_blocking_results_cancelled_failed_and_wait_expired(server: Server) -> None:
    with ThreadPoolExecutor(2) as pool, server.client() as client:
        blocked = pool.submit(client.post, "/jobs", json=start_body("demo-slow", "block-1"), headers=KEY)
        started_pid(client, "block-1")
        client.post("/jobs/block-1/cancel", json={"crew_id": "demo-slow", "action_id": "block-1"})
        cancelled = blocked.result(30)
        assert cancelled.status_code == 409 and cancelled.json()["status"] == "cancelled"

        failed = client.post("/jobs", json=start_body("boom", "block-2"), headers=KEY)
        assert failed.status_code == 502
        terminal = failed.json()["terminal"]
        # The reference's keys and meanings: the exception's class; uncertain, since the crew had begun.
        assert terminal["error_type"] == "RuntimeError" and terminal["reason"] == "operation_failed"
        assert terminal["uncertain_outcome"] is True
        assert "secret" not in failed.text
        assert "secret" not in client.get("/jobs/block-2/events").text

        factory = client.post("/jobs", json=start_body("broken-factory", "block-3"), headers=KEY)
        assert factory.status_code == 502
        events = client.get("/jobs/block-3/events").json()["events"]
        assert [e["event"] for e in events] == ["failed"]  # no `started` before a factory failure

        # Its own timeout is the answer: the wait lasts until the kill is confirmed, then says the job failed.
        expired = client.post("/jobs", json=start_body("demo-slow", "block-4", timeout_ms=1500), headers=KEY)
        assert expired.status_code == 502 and expired.json()["status"] == "failed", expired.text
        assert expired.json() == {"detail": "run failed", **client.get("/jobs/block-4").json()}
        terminal = expired.json()["terminal"]
        assert terminal["error_type"] == "TimeoutError" and terminal["reason"] == "timeout"
        assert terminal["uncertain_outcome"] is True
        assert terminal["stop_confirmed"] is True and gone(terminal["pid"])


@pytest.mark.both_launchers
def test_timeout_mid_stream_kills_the_worker(server: Server, launcher: str) -> None:
    # A cold (spawned) worker imports CrewAI before `started`: seconds, and on a loaded machine more than any
    # timeout this test could afford. Its timeout may then come while it imports: the same kill, before
    # `started`. A forked worker is warm: its `started` comes first, whatever the load.
    with server.client() as client:
        events = stream_job(client, start_body("stubborn", "timeout-1", timeout_ms=5000))
    assert_contiguous(events)
    names = [event["event"] for event in events]
    assert names[0] == "started" or (launcher == "spawn" and names == ["failed"]), names
    last = events[-1]["data"]
    assert events[-1]["event"] == "failed" and last["error_type"] == "TimeoutError" and last["reason"] == "timeout"
    assert last["uncertain_outcome"] is True and last["stop_confirmed"] is True and gone(last["pid"])
    assert names == ["failed"] or last["pid"] == events[0]["data"]["pid"]


def test_stream_heartbeats_while_idle(server: Server) -> None:
    with (
        server.client() as client,
        client.stream(
            "POST",
            "/jobs/stream",
            json=start_body("stubborn", "beat-1"),
            headers=KEY,  # blocks, silent
        ) as response,
    ):
        lines = response.iter_lines()
        seen = []
        for line in lines:
            seen.append(line)
            if line == ": keep-alive" and "event: started" in seen:
                break
        client.post("/jobs/beat-1/cancel", json={"crew_id": "stubborn", "action_id": "beat-1"})
        seen.extend(lines)
    idle = seen[seen.index("event: started") : seen.index("event: cancelled")]
    assert ": keep-alive" in idle  # a silent, running job still keeps its stream alive


def test_a_client_disconnect_never_cancels_the_job(server: Server) -> None:
    with server.client() as client:
        with client.stream("POST", "/jobs/stream", json=start_body("demo", "gone-1"), headers=KEY) as response:
            for line in response.iter_lines():
                if line == "event: started":
                    break  # hang up mid-stream
        assert wait_until(lambda: client.get("/jobs/gone-1").json()["status"] != "running", timeout=60)
        assert client.get("/jobs/gone-1").json()["status"] == "completed"


def test_archive(server: Server) -> None:
    with ThreadPoolExecutor(1) as pool, server.client() as client:
        running = pool.submit(client.post, "/jobs", json=start_body("demo-slow", "arch-1"), headers=KEY)
        started_pid(client, "arch-1")
        confirm = {"X-AIP-Archive-Confirmation": "arch-1"}
        assert client.delete("/jobs/arch-1").status_code == 428
        assert client.delete("/jobs/arch-1", headers={"X-AIP-Archive-Confirmation": "other"}).status_code == 428
        assert client.delete("/jobs/arch-1", headers=confirm).status_code == 409
        assert client.delete("/jobs/ghost", headers={"X-AIP-Archive-Confirmation": "ghost"}).status_code == 404
        client.post("/jobs/arch-1/cancel", json={"crew_id": "demo-slow", "action_id": "arch-1"})
        running.result(30)
        assert client.delete("/jobs/arch-1", headers=confirm).json() == {"archived": True, "action_id": "arch-1"}
        assert client.get("/jobs/arch-1").status_code == 404
        assert client.get("/jobs/arch-1/events").status_code == 404
