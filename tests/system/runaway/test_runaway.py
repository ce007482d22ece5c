"""Runaway work is stopped by per-job limits while the supervisor and other jobs carry on.

One supervisor with tight limits; each test runs a runaway crew beside a normal streaming job and
checks the runaway's terminal event, that every process it made is gone, and that the neighbour
completed. The limit crews live in ``tests/crews/hostile.py``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import (
    Server,
    gone,
    memory_stop_checked,
    release_once_sampled,
    run_with_neighbour,
    start_body,
    start_hostile_server,
    stop_server,
    wait_until,
)
from tests.crews.hostile import DAEMON_SEEN, FLOOD_BYTES
from tests.helpers.waiting import SLOWDOWN

KEY = {"Idempotency-Key": "runaway"}
MEMORY_MB = 400
CPU_SECONDS = round(2 * SLOWDOWN)  # an emulated guest's hogs burn more CPU before their cap: not this one first
DISK_MB = 64
OUTPUT_BYTES = 32 * 1024 * 1024
MiB = 1024 * 1024
PROCESSES = 32
OPEN_FILES = 256


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, evidence: Path) -> Iterator[Server]:
    running = start_hostile_server(
        tmp_path_factory.mktemp("state") / "s",
        evidence,
        WORKER_MAX_MEMORY_MB=str(MEMORY_MB),
        WORKER_MAX_CPU_SECONDS=str(CPU_SECONDS),
        WORKER_MAX_PROCESSES=str(PROCESSES),
        WORKER_MAX_OPEN_FILES=str(OPEN_FILES),
        WORKER_MAX_OUTPUT_BYTES=str(OUTPUT_BYTES),
        WORKER_MAX_DISK_MB=str(DISK_MB),
    )
    yield running
    stop_server(running)


def kills(server: Server) -> dict[str, float]:
    """``crew_supervisor_kills_total`` by reason, as the server's /metrics says now."""
    with server.client() as client:
        text = client.get("/metrics").text
    return {
        sample.labels["reason"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "crew_supervisor_kills_total"
    }


def run_beside_neighbour(server: Server, crew: str, action: str) -> dict[str, Any]:
    """Runs a runaway the supervisor must kill; checks the kill is proven, and counted once under its reason."""
    before = kills(server)
    terminal = run_with_neighbour(server, start_body(crew, action))
    assert terminal["stop_confirmed"] is True and gone(terminal["pid"])
    reason = terminal["reason"]
    assert wait_until(lambda: kills(server).get(reason, 0) > before.get(reason, 0), timeout=5), (reason, before)
    assert kills(server) == {**before, reason: before.get(reason, 0) + 1}
    return terminal


def pids_left_in(path: Path) -> list[int]:
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def assert_memory_stopped(server: Server, terminal: dict[str, Any]) -> str:
    with server.client() as client:
        return memory_stop_checked(client, terminal, MEMORY_MB)


def test_memory_hog_is_killed_with_the_peak_it_reached(server: Server) -> None:
    """The kernel's cap where a memory cgroup is writable (it is on this project's VM and in CI)."""
    assert_memory_stopped(server, run_beside_neighbour(server, "runaway-memory", "hog"))


def test_memory_hog_is_caught_by_sampling_without_cgroups(tmp_path: Path, evidence: Path) -> None:
    """The fallback, forced here with CGROUPS=off: what runs where no memory cgroup is writable."""
    sampled = start_hostile_server(tmp_path / "s", evidence, WORKER_MAX_MEMORY_MB=str(MEMORY_MB), CGROUPS="off")
    try:
        terminal = run_beside_neighbour(sampled, "runaway-memory", "hog-sampled")
        assert assert_memory_stopped(sampled, terminal) == "sampled"
        with sampled.client() as client:
            assert client.get("/health").json()["process_limit"] == "sampled"
    finally:
        sampled.stop()


def test_cpu_spinner_is_killed_after_its_cpu_seconds(server: Server) -> None:
    terminal = run_beside_neighbour(server, "runaway-cpu", "spinner")
    assert terminal["error_type"] == "cpu_limit_exceeded"
    assert CPU_SECONDS < terminal["cpu_seconds"] < CPU_SECONDS + 2 * SLOWDOWN
    with server.client() as client:  # where it spun, taken just before its kill, kept with its record
        kept = client.get("/jobs/spinner/stack").json()
    assert kept.get("before") == "limit", kept
    assert any("crews/hostile.py" in t["stack"] and ", in call\n" in t["stack"] for t in kept["threads"]), kept


def test_cpu_burnt_by_a_relay_of_processes_counts_against_the_job(server: Server) -> None:
    """Each burner ends, reaped by the supervisor, before the job's tree could count it: the job's cgroup still
    does (where there is one; else the samples remember what each burner they saw had used)."""
    terminal = run_beside_neighbour(server, "runaway-reforker", "relay")
    assert terminal["error_type"] == "cpu_limit_exceeded", terminal
    assert CPU_SECONDS < terminal["cpu_seconds"] < CPU_SECONDS + 2 * SLOWDOWN


@pytest.mark.parametrize("place", ["scratch", "home"])
def test_a_job_filling_its_places_is_stopped_at_its_disk_cap(server: Server, evidence: Path, place: str) -> None:
    """1 MiB files, as fast as it can, into its scratch directory (removed when the job ends) or its crew's HOME
    (kept: only what it grew by counts)."""
    terminal = run_beside_neighbour(server, "runaway-disk" if place == "scratch" else "runaway-disk-home", place)
    assert terminal["error_type"] == "disk_limit_exceeded", terminal
    assert terminal["limit_bytes"] == DISK_MB * MiB < terminal["disk_bytes"], terminal
    filled = Path((evidence / "disk.place").read_text())
    if place == "scratch":
        assert not filled.exists(), "a job's scratch directory outlived it"
    else:
        for file in filled.glob("fill-*"):  # the crew's HOME is kept: leave room for the next test
            file.unlink()


def test_event_flood_ends_at_the_event_limit(server: Server) -> None:
    terminal = run_beside_neighbour(server, "runaway-events", "events")
    assert terminal["error_type"] == "RegistryError" and terminal["reason"] == "event_limit_exceeded"


def test_fork_bomb_is_contained_and_every_process_killed(server: Server, evidence: Path) -> None:
    terminal = run_beside_neighbour(server, "runaway-forkbomb", "bomb")
    assert terminal["error_type"] == "process_limit_exceeded"
    with server.client() as client:
        assert client.get("/health").json()["process_limit"] in ("cgroup", "sampled")
    children = pids_left_in(evidence / "forkbomb.pids")
    assert 0 < len(children) < PROCESSES * 4  # the cap held (sampling alone may overshoot a little)
    assert terminal["descendants_killed"] >= len(children)
    assert wait_until(lambda: all(gone(pid) for pid in children), timeout=5)


@pytest.mark.parametrize("cap", ["memory", "forkbomb"])
def test_a_job_that_tries_to_leave_its_cgroups_first_still_meets_its_cap(
    server: Server, evidence: Path, cap: str
) -> None:
    """It writes its pid into every root cgroup's ``cgroup.procs`` (as uid 0 it owns them), refused, then runs away."""
    terminal = run_beside_neighbour(server, f"runaway-escape-{cap}", f"escape-{cap}")
    escaped = (evidence / f"escape-{cap}.result").read_text()
    assert escaped.startswith("denied:") and "EACCES" in escaped, escaped
    reason = {"memory": "memory_limit_exceeded", "forkbomb": "process_limit_exceeded"}[cap]
    assert terminal["error_type"] == reason, terminal
    if cap == "memory":
        assert_memory_stopped(server, terminal)


def test_a_descriptor_hoarder_hits_the_open_files_limit(server: Server, evidence: Path) -> None:
    terminal = run_with_neighbour(server, start_body("runaway-files", "files"))
    assert terminal["error_type"] == "OSError" and terminal["reason"] == "operation_failed"  # the job's own error
    hoarded = int((evidence / "files.count").read_text())
    assert 0 < hoarded < OPEN_FILES  # the kernel refused the descriptor past the limit


def test_a_process_left_behind_is_killed_and_named_and_the_answer_kept(server: Server, evidence: Path) -> None:
    """A daemon (setsid) still running when the worker has answered and exited: its job completes with its answer,
    the daemon is killed and named in the record. ``STRAY_PROCESSES=fail`` fails such a job instead:
    ``runaway-daemon`` in tests/system/hostile/test_hostile_workers.py."""
    seen = release_once_sampled(server, "daemon", 2, evidence / DAEMON_SEEN)  # the worker and its daemon
    with server.client() as client:
        answer = client.post("/jobs", json=start_body("runaway-daemon", "daemon"), headers=KEY)
        record = client.get("/jobs/daemon").json()
    seen.result()  # the crew went on because a sample had counted its daemon
    assert answer.status_code == 200 and answer.json()["raw"], answer.text
    (daemon,) = pids_left_in(evidence / "daemon.pids")
    leftovers = record["leftovers"]
    assert leftovers["stop_confirmed"] is True and leftovers["descendants_killed"] == 1, record
    (named,) = leftovers["processes"]
    assert named["pid"] == daemon and named["left"] == "own_session" and "os.setsid()" in named["command"], named
    assert gone(daemon)


def test_an_orphan_that_exits_is_reaped_not_left_a_zombie(server: Server, evidence: Path) -> None:
    with server.client() as client:
        answer = client.post("/jobs", json=start_body("runaway-orphan", "orphan"), headers=KEY)
    assert answer.status_code == 200, answer.text  # it left nothing running
    (orphan,) = pids_left_in(evidence / "orphan.pids")
    assert wait_until(lambda: gone(orphan), timeout=5)  # a zombie of the supervisor's until it reaps


def test_stdout_flood_completes_and_the_supervisor_stays_responsive(server: Server) -> None:
    done = threading.Event()

    def probe_health() -> tuple[list[int], float]:
        """Every /health status seen while the flood runs, and the slowest answer: handed back, not asserted
        here, so that a failure in this thread fails the test."""
        statuses, slowest = [], 0.0
        with server.client(timeout=30) as client:
            while not done.is_set():
                started = time.monotonic()
                statuses.append(client.get("/health").status_code)
                slowest = max(slowest, time.monotonic() - started)
                time.sleep(0.02)
        return statuses, slowest

    with ThreadPoolExecutor(1) as pool:
        prober = pool.submit(probe_health)
        try:
            with server.client() as client:
                answer = client.post("/jobs", json=start_body("runaway-stdout", "flood"), headers=KEY)
                assert answer.status_code == 200, answer.text
                output = client.get("/jobs/flood/output").json()
        finally:
            done.set()
        statuses, slowest = prober.result(60)
    assert statuses and set(statuses) == {200}
    # A stalled loop would hold /health for the whole flood (tens of seconds); 5 s holds at load 10 here.
    assert slowest < 5.0
    stdout, stderr = output["stdout"], output["stderr"]
    assert stdout["total_bytes"] > FLOOD_BYTES - 64 * 1024 and 60 * 1024 < len(stdout["text"]) <= 64 * 1024
    assert stdout["text"].rstrip().endswith("flood") and "flood done" in stderr["text"]


@pytest.mark.parametrize("writer", ["worker", "grandchild"])
def test_endless_output_is_stopped_at_the_output_limit(server: Server, writer: str) -> None:
    """Checked as it is read: no more than a read past the cap, whoever writes (the bound the docs promise is
    1 MiB or 10 % of the cap, whichever is larger)."""
    crew = "runaway-stdout-endless" if writer == "worker" else "runaway-stdout-grandchild"
    with server.client() as client:
        answer = client.post("/jobs", json=start_body(crew, f"endless-{writer}"), headers=KEY)
    assert answer.status_code == 502
    terminal = answer.json()["terminal"]
    assert terminal["error_type"] == "output_limit_exceeded" and terminal["limit_bytes"] == OUTPUT_BYTES
    assert OUTPUT_BYTES < terminal["output_bytes"] <= OUTPUT_BYTES + max(MiB, OUTPUT_BYTES // 10), terminal
    assert terminal["stop_confirmed"] is True and terminal["descendants_killed"] == (writer == "grandchild") * 2
