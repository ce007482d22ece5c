"""The fork server: warm workers, cold spawning when it refuses, its workers outliving its death, and its return."""

from __future__ import annotations

import hashlib
import json
import signal
import time
from pathlib import Path

import httpx
import psutil

from tests.conftest import Server, gone, gone_for_good, ours, sse_events, start_body, start_server, wait_until
from tests.helpers.otlp_receiver import OtlpReceiver

KEY = {"Idempotency-Key": "key-1"}


def fork_server_of(server: Server) -> psutil.Process:
    found = server.forkserver()
    assert found is not None
    return found


def alive_and_restarts(client: httpx.Client) -> tuple[bool, int]:
    health = client.get("/health").json()["forkserver"]
    assert health["refused"] is None
    return health["alive"], health["restarts"]


def test_a_fork_server_with_a_second_thread_refuses_and_jobs_still_run(tmp_path: Path) -> None:
    env = {"AIP_CREWAI_LAUNCHER": "forkserver", "AIP_CREWAI_REGISTRY": "tests.crews.threaded:registry"}
    server = start_server(tmp_path / "state", env=env)
    try:
        with server.client() as client:
            response = client.post("/jobs", json=start_body("demo", "threaded-1"), headers=KEY)
            assert response.status_code == 200  # spawned cold instead
            assert 'crew_supervisor_worker_starts_total{launcher="spawn"} 1.0' in client.get("/metrics").text
            # Warming finds the thread before any fork: the fork server refuses to start.
            assert "import-time thread" in client.get("/health").json()["forkserver"]["refused"]
    finally:
        server.stop()


def test_a_fork_server_that_cannot_warm_refuses_in_one_line(tmp_path: Path) -> None:
    """And does not come back; jobs then start cold (the test above runs one). A thread left running by the
    warm-up is refused too: the doctor's warm-up check shows it (tests/supervisor/doctor/test_doctor.py)."""
    env = {"AIP_CREWAI_LAUNCHER": "forkserver", "AIP_CREWAI_REGISTRY": "tests.crews.unwarmable:registry"}
    server = start_server(tmp_path / "state", env={**env, "UNWARMABLE": "renamed"})
    says = "its event bus has no _loop_thread"
    try:
        with server.client() as client:
            health = client.get("/health").json()["forkserver"]
            assert health["alive"] is False and says in health["refused"]
            assert server.forkserver() is None  # it left; no restart is attempted
        refusals = [line for line in server.log.read_text().splitlines() if "refused to start" in line]
        assert len(refusals) == 1 and says in refusals[0]
    finally:
        server.stop()


GARBLED = {"AIP_CREWAI_LAUNCHER": "forkserver", "AIP_CREWAI_REGISTRY": "tests.crews.garbled:registry"}
NO_REGISTRY = "no registry from the fork server: frame is not valid JSON"


def test_a_fork_server_that_breaks_at_start_refuses_the_start_in_one_line(tmp_path: Path) -> None:
    """Its first word is no frame (``tests/crews/garbled.py``): the supervisor says so in one line and exits, never a
    traceback (a ``Failed`` built without its reason raised ``TypeError`` here)."""
    garble = tmp_path / "garble"
    garble.touch()
    server = start_server(tmp_path / "state", env={**GARBLED, "GARBLE_FORKSERVER": str(garble)}, wait=False)
    assert wait_until(lambda: server.process.poll() is not None, timeout=120), "it served without a fork server"
    lines = server.log_tail().strip().splitlines()
    assert server.process.returncode == 1 and NO_REGISTRY in lines[-1], lines[-5:]
    assert not supervisor_tracebacks(lines)  # the fork server's own (its registry written to a closed socket) aside


def supervisor_tracebacks(lines: list[str]) -> list[str]:
    """The frames of a traceback of the supervisor's own code in its log."""
    return [line for line in lines if line.strip().startswith('File "') and "/supervisor/" in line]


def test_a_fork_server_that_breaks_at_a_restart_is_logged_and_jobs_start_cold(tmp_path: Path) -> None:
    """Its replacement's first word is no frame: the restart fails in one logged line, the supervisor serves on and
    a job starts cold and completes. That job's start asks for a replacement again, which fails alike: that line is
    the fork server's, not the job's, and carries no trace id though the job is traced (the restart ran in the
    context of the job that asked for it)."""
    garble = tmp_path / "garble"
    env = {**GARBLED, "GARBLE_FORKSERVER": str(garble), "AIP_CREWAI_PREFORK": "0"}  # no idle worker to take
    with OtlpReceiver() as receiver:
        traced = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint}
        server = start_server(tmp_path / "state", env={**env, **traced})
        try:
            with server.client(timeout=300) as client:  # a cold worker imports CrewAI before it starts
                first = fork_server_of(server)
                garble.touch()
                first.send_signal(signal.SIGKILL)
                assert gone_for_good(first)
                failed = "fork server did not restart: " + NO_REGISTRY
                assert wait_until(lambda: failed in server.log.read_text(), timeout=120), server.log_tail()
                response = client.post("/jobs", json=start_body("demo", "cold"), headers=KEY)
                assert response.status_code == 200, response.text
                assert client.get("/jobs/cold").json()["status"] == "completed"
                assert 'crew_supervisor_worker_starts_total{launcher="spawn"} 1.0' in client.get("/metrics").text
                assert client.get("/health").json()["forkserver"]["restarts"] == 0
                assert wait_until(lambda: server.log.read_text().count(failed) == 2, timeout=120), server.log_tail()
            assert not supervisor_tracebacks(server.log.read_text().splitlines())
        finally:
            server.stop()
    said = [json.loads(line) for line in server.log.read_text().splitlines() if line.startswith("{")]
    (finished,) = [line for line in said if line["event"] == "job finished"]
    assert finished["trace_id"]  # the job's own line: traced
    restarts = [line for line in said if line["event"].startswith("fork server did not restart")]
    assert len(restarts) == 2 and not any("trace_id" in line for line in restarts), restarts


def idle_workers(server: Server) -> list[psutil.Process]:
    """Forked workers (the supervisor's children): the idle ones, and those of jobs still running."""
    return server.forked_workers()


def test_jobs_take_workers_forked_ahead_of_demand_each_once_and_the_pool_refills(tmp_path: Path) -> None:
    server = start_server(tmp_path / "state", env={"AIP_CREWAI_LAUNCHER": "forkserver", "AIP_CREWAI_PREFORK": "2"})
    try:
        with server.client() as client:
            assert wait_until(lambda: client.get("/health").json()["forkserver"]["idle_workers"] == 2, timeout=30)
            assert "crew_supervisor_forkserver_idle_workers 2.0" in client.get("/metrics").text
            used: list[int] = []
            for n in range(4):
                waiting = {p.pid: p.create_time() for p in idle_workers(server)}
                admitted = time.time()
                response = client.post("/jobs", json=start_body("placer", f"pool-{n}"), headers=KEY)
                assert response.status_code == 200
                pid = client.get(f"/jobs/pool-{n}/events").json()["events"][0]["data"]["pid"]
                # The job's worker was forked before the job was admitted: it came from the pool.
                assert pid in waiting and waiting[pid] < admitted
                used.append(pid)
                # It ran in the job's own places, not the fork server's: its scratch dir, its crew's storage.
                place = client.get(f"/jobs/pool-{n}/output").json()["stdout"]["text"]
                assert f"cwd={server.state}/scratch/job-" in place
                assert "CREWAI_DISABLE_TELEMETRY=true" in place
                own = hashlib.sha256(b"placer").hexdigest()[:24]  # the crew's own places, not the fork server's
                assert f"HOME={server.state}/home/{own} " in place
                assert f"CREWAI_STORAGE_DIR={server.state}/storage/{own} " in place
                assert f"chroma={server.state}/storage/{own}" in place  # not the fork server's: each crew's own
                cwd = place.split("cwd=", 1)[1].split()[0]
                assert f"tempdir={cwd}/tmp " in place  # the job's own (CrewAI's locks are in the crew's storage)
                assert wait_until(lambda: client.get("/health").json()["forkserver"]["idle_workers"] == 2, timeout=30)
            assert len(set(used)) == len(used)  # every job had a process of its own
            assert all(gone(pid) for pid in used)
            assert not {p.pid for p in idle_workers(server)} & set(used)  # none went back to the pool
    finally:
        server.stop()


def test_a_worker_forked_on_demand_keeps_its_crews_knowledge_in_its_crews_storage(tmp_path: Path) -> None:
    """Forked for a job already waiting (no idle worker), a worker comes with the job's environment: what CrewAI
    computed from the fork server's when imported (ChromaDB's storage) still follows the job's places."""
    server = start_server(tmp_path / "state", env={"AIP_CREWAI_LAUNCHER": "forkserver", "AIP_CREWAI_PREFORK": "0"})
    try:
        with server.client() as client:
            assert client.post("/jobs", json=start_body("placer", "on-demand"), headers=KEY).status_code == 200
            place = client.get("/jobs/on-demand/output").json()["stdout"]["text"]
    finally:
        server.stop()
    own = hashlib.sha256(b"placer").hexdigest()[:24]
    assert f"chroma={server.state}/storage/{own}" in place, place


def pids_cgroup(pid: int) -> Path | None:
    """The directory of ``pid``'s cgroup in the v1 pids hierarchy, if this machine has one."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "pids" in controllers.split(","):
            return Path("/sys/fs/cgroup/pids") / path.lstrip("/")
    return None


def test_running_jobs_and_idle_workers_outlive_the_fork_server_which_comes_back(tmp_path: Path) -> None:
    """Each worker is the supervisor's own child (double fork): SIGKILL of the fork server takes none, a job
    asked for once no idle worker is left is spawned cold while a new one warms, and the new one forks the pool
    again."""
    server = start_server(tmp_path / "state", env={"AIP_CREWAI_LAUNCHER": "forkserver", "AIP_CREWAI_PREFORK": "2"})
    try:
        with server.client() as client:
            assert wait_until(lambda: client.get("/health").json()["forkserver"]["idle_workers"] == 2, timeout=30)
            assert alive_and_restarts(client) == (True, 0)
            first = fork_server_of(server)
            idle = idle_workers(server)
            assert len(idle) == 2 and all(p.ppid() == server.pid for p in idle)
            cgroups = []
            if client.get("/health").json()["process_limit"] == "cgroup":
                # Bounded while they wait (joining takes ~13 ms), so a start does not wait for it.
                cgroups = [pids_cgroup(p.pid) for p in idle]
                names = [c.name if c is not None else "" for c in cgroups]
                assert all(name.startswith(f"worker-{p.pid}-") for name, p in zip(names, idle, strict=True))
            body = start_body("demo-slow", "through", input={"seconds": 2})
            with client.stream("POST", "/jobs/stream", json=body, headers=KEY) as response:
                events = sse_events(response)
                running = next(e for e in events if e["event"] == "started")["data"]["pid"]
                # The worker it took is replaced in the pool by this fork server, before it dies.
                assert wait_until(lambda: client.get("/health").json()["forkserver"]["idle_workers"] == 2, 30)
                first = ours(server, first.pid)  # alive, and the supervisor's, before it is killed
                first.send_signal(signal.SIGKILL)
                assert gone_for_good(first)
                # Admitted while the fork server is dead: each started on an idle worker left, and done.
                for action_id in ("meanwhile", "meanwhile-2"):
                    assert client.post("/jobs", json=start_body("demo", action_id), headers=KEY).status_code == 200
                assert client.get("/health").json()["forkserver"]["idle_workers"] == 0
                # None left, and the replacement held before it can answer: the next job is spawned cold.
                assert wait_until(lambda: (found := server.forkserver()) is not None and found.pid != first.pid, 30)
                replacement = fork_server_of(server)
                replacement.send_signal(signal.SIGSTOP)
                try:
                    assert alive_and_restarts(client) == (False, 0)  # held while it warms, not once it was up
                    with (
                        server.client(timeout=300) as patient,  # a cold worker imports CrewAI before it starts
                        patient.stream("POST", "/jobs/stream", json=start_body("demo", "cold"), headers=KEY) as cold,
                    ):
                        assert next(sse_events(cold))["event"] == "started"
                    spawned = 'crew_supervisor_worker_starts_total{launcher="spawn"} 1.0'
                    assert spawned in client.get("/metrics").text
                finally:
                    replacement.send_signal(signal.SIGCONT)
                assert [e["event"] for e in events][-1] == "completed"
            job = client.get("/jobs/through").json()
            assert job["status"] == "completed" and job["exit_status"] == 0  # its real exit status, read by us
            assert gone(running) and client.get("/jobs/meanwhile").json()["exit_status"] == 0
            meanwhile_pid = client.get("/jobs/meanwhile/events").json()["events"][0]["data"]["pid"]
            assert meanwhile_pid in {p.pid for p in idle} - {running}
            assert wait_until(lambda: client.get("/jobs/cold").json()["status"] == "completed", timeout=60)
            assert gone(client.get("/jobs/cold/events").json()["events"][0]["data"]["pid"])
            assert wait_until(lambda: alive_and_restarts(client) == (True, 1), timeout=60)
            second = fork_server_of(server)
            assert second.pid == replacement.pid and gone(first.pid)
            assert wait_until(lambda: client.get("/health").json()["forkserver"]["idle_workers"] == 2, timeout=30)
            pool = idle_workers(server)
            assert any(p.create_time() >= second.create_time() for p in pool)  # forked by the new fork server
            # A job runs on the pool as before (on the oldest idle worker), and its worker is gone after it.
            assert client.post("/jobs", json=start_body("demo", "after"), headers=KEY).status_code == 200
            after = client.get("/jobs/after/events").json()["events"][0]["data"]["pid"]
            assert after in {p.pid for p in pool} and gone(after)
    finally:
        server.stop()
    # Stopped, the supervisor killed the idle workers and released their limits: their cgroups are gone.
    assert all(c is None or not c.exists() for c in cgroups)


def test_supervisor_death_takes_the_fork_server_its_idle_workers_and_the_running_job(tmp_path: Path) -> None:
    server = start_server(tmp_path / "state", env={"AIP_CREWAI_LAUNCHER": "forkserver", "AIP_CREWAI_PREFORK": "2"})
    with server.client() as client:
        assert wait_until(lambda: client.get("/health").json()["forkserver"]["idle_workers"] == 2, timeout=30)
        with client.stream(
            "POST", "/jobs/stream", json=start_body("demo-slow", "chain-1", input={"seconds": 60}), headers=KEY
        ) as response:
            events = sse_events(response)
            job = next(e for e in events if e["event"] == "started")["data"]["pid"]
            next(e for e in events if e["event"] == "chunk")  # running
            assert wait_until(lambda: client.get("/health").json()["forkserver"]["idle_workers"] == 2, timeout=30)
            tree = server.processes()
    assert job in {p.pid for p in tree} and len(tree) == 4  # the fork server, two idle workers, the job's worker
    server.kill()
    assert wait_until(lambda: all(gone(p.pid, p.create_time()) for p in tree), timeout=10)
