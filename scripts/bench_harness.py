"""Real supervisors on loopback and the HTTP calls that drive them: for scripts/bench, scripts/load, scripts/soak."""

from __future__ import annotations

import os
import secrets
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import psutil

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"
sys.path[:0] = [str(ROOT), str(SCRIPTS)]
from protocol import Operation  # noqa: E402
from supervisor import testing  # noqa: E402
from supervisor.console.sse import Frame, frames, lines  # noqa: E402
from supervisor.enums import TERMINAL_EVENTS, EventName, Status  # noqa: E402
from supervisor.journal.schema import SCHEMA, SCHEMA_VERSION  # noqa: E402
from supervisor.testing import Server  # noqa: E402

TERMINAL = TERMINAL_EVENTS
JOB_TIMEOUT_MS = 120_000  # a job the bench loses track of is still ended by its supervisor
READY_SECONDS = 240.0
MARKER_SECONDS = 20.0
MiB = 1024 * 1024
JOURNAL_SIZES = (0, 1000, 10_000)  # retained jobs


class BenchError(Exception):
    pass


def start_provider(log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """The loopback OpenAI-compatible provider in a process of its own (its CPU is neither the sidecar's nor
    the in-process crews'), and its URL."""
    with open(log, "wb") as errors:
        process = subprocess.Popen(
            [sys.executable, "-m", "worker.provider"], stdout=subprocess.PIPE, stderr=errors, cwd=ROOT
        )
    assert process.stdout is not None
    url = process.stdout.readline().decode().strip()
    if not url.startswith("http://"):
        process.kill()
        raise BenchError(f"the provider did not start: {log.read_text()[-500:]}")
    return process, url


def start_supervisor(
    name: str, root: Path, launcher: str, markers: Path, settings: dict[str, str] | None = None
) -> Server:
    """A supervisor on the bench registry, its state in ``root / name``, its log in ``root / f"{name}.log"``;
    not waited for (start several, then ``wait_ready``). ``settings`` (environment variables: ``AIP_CREWAI_*``,
    ``OTEL_*``) override the bench's defaults, e.g. a wider MAX_CONCURRENCY."""
    return testing.start(
        root / name,
        "bench_crews:registry",
        # The bench's crews leave their markers there, from their sandbox.
        env={"BENCH_MARKER_DIR": str(markers), "AIP_CREWAI_WORKER_WRITABLE": str(markers), **(settings or {})},
        path=[SCRIPTS],
        args=["--log-level", "warning"],
        log=root / f"{name}.log",
        cwd=ROOT,
        wait=False,
        launcher=launcher,
        allowed_operations="run,replay",
        max_retained_runs=100_000,  # the journal phase keeps 10,000 jobs
        max_events_per_run=100_000,  # the flood crew's chunks
    )


def wait_ready(supervisors: list[Server]) -> None:
    """All of them within READY_SECONDS: they start at once, so their CrewAI imports overlap."""
    deadline = time.monotonic() + READY_SECONDS
    for sup in supervisors:
        try:
            sup.wait_ready(max(deadline - time.monotonic(), 0.0))
        except testing.StartError as exc:
            raise BenchError(f"supervisor {sup.state.name}: {exc}") from None


def populate(state: Path, jobs: int) -> None:
    """A journal holding ``jobs`` completed jobs (four events each), written before its supervisor starts."""
    state.mkdir(mode=0o700)
    path = state / "journal.db"
    os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))  # the supervisor refuses wider modes
    output = {
        "raw": "Bencher reports finding 0123456789ab.",
        "json_dict": None,
        "pydantic": None,
        "tasks_output": [{"description": "Answer briefly.", "raw": "Bencher reports finding 0123456789ab."}],
        "token_usage": {"total_tokens": 120, "prompt_tokens": 110, "completion_tokens": 10},
        "replay_task_ids": [str(uuid.uuid4())],
    }
    db = sqlite3.connect(path)
    try:
        db.executescript(f"{SCHEMA} PRAGMA user_version = {SCHEMA_VERSION};")
        now = time.time()
        job_rows, event_rows = [], []
        for i in range(jobs):
            action = f"retained-{i:06d}"
            digest = secrets.token_hex(32)
            job_rows.append((action, "fast", Operation.RUN, digest, Status.COMPLETED, 4, orjson.dumps(output), now, 0))
            chunk = {"content": "finding ", "chunk_type": "text", "channel": "llm"}
            for sequence, (name, data) in enumerate(
                [
                    (EventName.STARTED, {"status": Status.RUNNING, "operation": Operation.RUN, "pid": 1000 + i}),
                    (EventName.CHUNK, chunk),
                    (EventName.CHUNK, chunk),
                    (EventName.COMPLETED, output),
                ]
            ):
                event_rows.append((action, sequence, name, orjson.dumps(data)))
        with db:
            db.executemany(
                "INSERT INTO jobs (action_id, crew_id, operation, request_hash, status, event_count, output,"
                " admitted_at, exit_status) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                job_rows,
            )
            db.executemany("INSERT INTO events (action_id, sequence, event, data) VALUES (?, ?, ?, ?)", event_rows)
    finally:
        db.close()


# HTTP helpers ------------------------------------------------------------------------------------


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def start_body(crew: str, action: str, input: dict[str, Any] | None = None, operation: str = "run") -> dict[str, Any]:
    return {
        "crew_id": crew,
        "action_id": action,
        "operation": operation,
        "input": input or {},
        "timeout_ms": JOB_TIMEOUT_MS,
    }


def key(action: str) -> dict[str, str]:
    return {"Idempotency-Key": action}


def sse(response: httpx.Response) -> Iterator[Frame]:
    """The stream's frames, undecoded: a caller decodes only what it needs."""
    if response.status_code != 200:
        response.read()
        raise BenchError(f"stream answered {response.status_code}: {response.text[:300]}")
    return frames(lines(response.iter_bytes()))


def next_event(events: Iterator[Frame], wanted: str) -> dict[str, Any]:
    frame = next(events, Frame("end of stream", "{}", None))
    if frame.event != wanted:
        raise BenchError(f"expected a {wanted} event, got {frame.event}: {frame.data[:300]}")
    return dict(frame.json()["data"])


def drain(events: Iterator[Frame]) -> str:
    """Read through the terminal event; its name."""
    for frame in events:
        if frame.event in TERMINAL:
            return frame.event
    raise BenchError("stream ended without a terminal event")


def post_job(client: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    response = client.post("/jobs", json=body, headers=key(body["action_id"]))
    if response.status_code != 200:
        raise BenchError(f"{body['crew_id']} job answered {response.status_code}: {response.text[:300]}")
    return dict(response.json())


Stop = tuple[float, float]  # (seconds from cancel request to response, the supervisor's kill-to-confirm ms)


def cancel(client: httpx.Client, crew: str, action: str) -> Stop:
    """Cancel over HTTP; the response must prove the worker is gone (stop_confirmed)."""
    began = time.perf_counter()
    response = client.post(f"/jobs/{action}/cancel", json={"crew_id": crew, "action_id": action, "reason": "bench"})
    elapsed = time.perf_counter() - began
    record = response.json() if response.status_code == 200 else {}
    terminal = record.get("terminal") or {}
    if record.get("status") != Status.CANCELLED or terminal.get("stop_confirmed") is not True:
        raise BenchError(f"cancel of {action} did not confirm the stop: {response.status_code} {response.text[:300]}")
    return elapsed, float(terminal["elapsed_ms"])


def wait_blocked(client: httpx.Client, markers: Path, pid: int, action: str) -> bool:
    """True once the worker says it is blocked (bench_crews.block); False if its job ended first. Bounded."""
    marker = markers / str(pid)
    deadline = time.monotonic() + MARKER_SECONDS
    looked = time.monotonic()
    while not marker.exists():
        now = time.monotonic()
        if now > deadline:
            raise BenchError(f"worker {pid} did not block within {MARKER_SECONDS:.0f} s")
        if now - looked > 0.1:  # a replay of a stale task id fails at once: do not wait for nothing
            looked = now
            if client.get(f"/jobs/{action}").json()["status"] != Status.RUNNING:
                return False
        time.sleep(0.002)
    marker.unlink()
    return True


def memory(pid: int) -> dict[str, float]:
    info = psutil.Process(pid).memory_full_info()  # uss and pss walk /proc/<pid>/smaps
    return {"rss": info.rss / MiB, "uss": info.uss / MiB, "pss": info.pss / MiB}


class CpuMeter:
    """CPU seconds of the supervisor, its fork server, the workers and this client.

    A worker's time lands in its reaper's children's times once it is reaped, which happens before its
    job's terminal event is recorded (the exit status is part of the proof). The reaper is the supervisor
    (the fork server clones each worker as its child); the fork server's children's times count its probe
    and, where it forks through them, its middle processes (the fork server itself is never reaped during a run).
    """

    def __init__(self, sup: Server) -> None:
        forkserver = sup.forkserver()
        if forkserver is None:
            raise BenchError(f"supervisor {sup.state.name} has no fork server child")
        self.supervisor = psutil.Process(sup.pid)
        self.forkserver = forkserver

    def read(self) -> tuple[float, float, float, float]:
        own, server = self.supervisor.cpu_times(), self.forkserver.cpu_times()
        return (
            own.user + own.system,
            server.user + server.system + server.children_user + server.children_system,  # any middle processes
            own.children_user + own.children_system,
            time.process_time(),
        )

    def worker_faults(self) -> tuple[int, float]:
        """The reaped workers' minor page faults (each a page copied on write, or one mapped on first touch) and
        their system CPU seconds so far: where a forked child's copy-on-write and its exit's teardown are paid."""
        stat = Path(f"/proc/{self.supervisor.pid}/stat").read_bytes()
        children_minor_faults = int(stat[stat.rindex(b")") + 2 :].split()[8])  # cminflt, field 11 of proc(5)
        return children_minor_faults, self.supervisor.cpu_times().children_system

    def per(self, before: tuple[float, ...], count: int, unit: float) -> dict[str, float]:
        """CPU per item of each part (supervisor, forkserver, worker, client), in ``unit`` per second."""
        spent = (after - earlier for after, earlier in zip(self.read(), before, strict=True))
        return {name: cpu / count * unit for name, cpu in zip(CPU_PARTS, spent, strict=True)}


CPU_PARTS = ("supervisor", "forkserver", "worker", "client")
