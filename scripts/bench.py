"""Benchmarks: start, cancel, throughput, events, journal cost and memory, warm and cold, in one run.

    scripts/bench [--quick] [--json bench.json] [--plot docs/bench-latency.png] [--keep]

Starts real supervisors on loopback (registry ``bench_crews:registry``, temporary state, fork server and
spawn launchers side by side), drives them over HTTP with httpx, prints a table and writes every figure to
JSON. Each supervisor is stopped with SIGTERM at the end, whatever happened. ``--quick`` takes few samples
(well under a minute); the full run takes a few minutes. Figures are measured, never asserted: the targets
are printed beside them.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import dataclasses
import datetime
import importlib.metadata
import math
import os
import platform
import secrets
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
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
from supervisor.schema import SCHEMA, SCHEMA_VERSION  # noqa: E402 - needs ROOT on the path

QUIET = {
    "CREWAI_DISABLE_TELEMETRY": "true",
    "OTEL_SDK_DISABLED": "true",
    "CREWAI_TRACING_ENABLED": "false",
    "CREWAI_DISABLE_VERSION_CHECK": "true",
}
TERMINAL = ("completed", "failed", "cancelled")
JOB_TIMEOUT_MS = 120_000  # a job the bench loses track of is still ended by its supervisor
READY_SECONDS = 240.0
MARKER_SECONDS = 20.0
MiB = 1024 * 1024
JOURNAL_SIZES = (0, 1000, 10_000)  # retained jobs


@dataclasses.dataclass(frozen=True)
class Plan:
    """Samples per measurement."""

    start_warm: int
    cold: int  # each ~5 s: start latency, worker memory and run-cancel latency of one cold job
    cancel_run: int
    cancel_replay: int
    cancel_stubborn: int
    jobs_c1: int
    jobs_c4: int
    inproc: int
    flood_chunks: int
    flood_runs: int
    journal: int
    warmup: int = 2
    overlap_cold: bool = False  # quick: the cold job runs beside the warm phases (both noisier, ~10 s saved)


QUICK = Plan(
    start_warm=10, cold=1, cancel_run=4, cancel_replay=3, cancel_stubborn=3, jobs_c1=4, jobs_c4=8, inproc=5,
    flood_chunks=2000, flood_runs=1, journal=3, warmup=1, overlap_cold=True,
)  # fmt: skip
FULL = Plan(
    start_warm=100, cold=5, cancel_run=30, cancel_replay=20, cancel_stubborn=20, jobs_c1=40, jobs_c4=80, inproc=30,
    flood_chunks=20_000, flood_runs=3, journal=30, warmup=3,
)  # fmt: skip

# Every figure the JSON holds, in table order; units in the names. Latency sample lists are in samples_ms.
FIGURES = [
    *(f"start_{kind}_p{q}_ms" for kind in ("warm", "cold") for q in (50, 90, 99)),
    "start_cold_over_warm",
    *(f"cancel_{kind}_p{q}_ms" for kind in ("run_warm", "run_cold", "replay_warm", "stubborn_warm") for q in (50, 99)),
    *(f"cancel_{kind}_kill_p50_ms" for kind in ("run_warm", "run_cold", "replay_warm", "stubborn_warm")),
    "jobs_per_s_c1",
    "jobs_per_s_c4",
    "jobs_per_s_inproc",
    "c4_over_inproc",
    "job_cpu_worker_ms",
    "job_cpu_supervisor_ms",
    "job_cpu_forkserver_ms",
    "flood_chunks",
    "flood_events_per_s",
    "flood_e2e_events_per_s",
    "flood_cpu_worker_us_per_event",
    "flood_cpu_supervisor_us_per_event",
    "flood_cpu_client_us_per_event",
    "journal_0_p50_ms",
    "journal_1000_p50_ms",
    "journal_10000_p50_ms",
    "journal_last_over_first",
    "supervisor_rss_mb",
    "forkserver_rss_mb",
    "forkserver_pss_mb",
    "worker_uss_warm_mb",
    "worker_pss_warm_mb",
    "worker_uss_cold_mb",
    "worker_pss_cold_mb",
]
# figure, comparison, limit: what the design asks for (docs/benchmarks.md says which were met)
TARGETS: list[tuple[str, str, float]] = [
    ("start_warm_p50_ms", "<=", 15),
    ("start_cold_over_warm", ">=", 300),
    ("cancel_run_warm_p99_ms", "<=", 50),
    ("cancel_run_cold_p99_ms", "<=", 50),
    ("cancel_replay_warm_p99_ms", "<=", 50),
    ("cancel_stubborn_warm_p99_ms", "<=", 50),
    ("worker_uss_warm_mb", "<=", 30),
    ("supervisor_rss_mb", "<=", 80),
    ("flood_events_per_s", ">=", 20_000),
    ("journal_last_over_first", "<=", 1.2),
    ("c4_over_inproc", ">=", 0.8),
]


class BenchError(Exception):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Supervisor:
    """``python -m supervisor serve`` on loopback with the bench registry and its own state directory."""

    def __init__(self, name: str, root: Path, launcher: str, markers: Path) -> None:
        self.name = name
        self.state = root / name
        self.port = free_port()
        self.token = secrets.token_urlsafe(16)
        self.log_path = root / f"{name}.log"
        env = {
            **os.environ,
            **QUIET,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(SCRIPTS), str(ROOT), os.environ.get("PYTHONPATH")])),
            "AIP_CREWAI_REGISTRY": "bench_crews:registry",
            "AIP_CREWAI_HOST": "127.0.0.1",
            "AIP_CREWAI_PORT": str(self.port),
            "AIP_CREWAI_BEARER_TOKEN": self.token,
            "AIP_CREWAI_STATE_FILE": str(self.state / "journal.db"),
            "AIP_CREWAI_LAUNCHER": launcher,
            "AIP_CREWAI_ALLOWED_OPERATIONS": "run,replay",
            "AIP_CREWAI_MAX_RETAINED_RUNS": "100000",  # the journal phase keeps 10,000 jobs
            "AIP_CREWAI_MAX_EVENTS_PER_RUN": "100000",  # the flood crew's chunks
            "BENCH_MARKER_DIR": str(markers),
        }
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "supervisor", "serve", "--log-level", "warning"],
                env=env,
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def client(self, timeout: float = 60) -> httpx.Client:
        # trust_env=False: loopback only, never through a proxy from the environment.
        headers = {"Authorization": f"Bearer {self.token}"}
        return httpx.Client(base_url=f"http://127.0.0.1:{self.port}", headers=headers, timeout=timeout, trust_env=False)

    def ready(self, client: httpx.Client) -> bool:
        if self.process.poll() is not None:
            raise BenchError(f"supervisor {self.name} exited at start:\n{self.log_tail()}")
        try:
            return client.get("/health").status_code == 200
        except httpx.TransportError:
            return False

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:] if self.log_path.exists() else ""

    def forkserver(self) -> psutil.Process:
        for child in psutil.Process(self.process.pid).children():
            with contextlib.suppress(psutil.Error):
                if "forkserver" in " ".join(child.cmdline()):
                    return child
        raise BenchError(f"supervisor {self.name} has no fork server child")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def wait_ready(supervisors: list[Supervisor]) -> None:
    deadline = time.monotonic() + READY_SECONDS
    pending = list(supervisors)
    clients = {s.name: s.client(timeout=2) for s in supervisors}
    try:
        while pending and time.monotonic() < deadline:
            pending = [s for s in pending if not s.ready(clients[s.name])]
            time.sleep(0.1)
    finally:
        for client in clients.values():
            client.close()
    if pending:
        raise BenchError(f"not ready within {READY_SECONDS:.0f} s: {', '.join(s.name for s in pending)}")


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
            job_rows.append((action, "fast", "run", secrets.token_hex(32), "completed", 4, orjson.dumps(output), now))
            chunk = {"content": "finding ", "chunk_type": "text", "channel": "llm"}
            for sequence, (name, data) in enumerate(
                [
                    ("started", {"status": "running", "pid": 1000 + i}),
                    ("chunk", chunk),
                    ("chunk", chunk),
                    ("completed", {"status": "completed", "exit_status": 0, "output": output}),
                ]
            ):
                event_rows.append((action, sequence, name, orjson.dumps(data)))
        with db:
            db.executemany(
                "INSERT INTO jobs (action_id, crew_id, operation, request_hash, status, event_count, output,"
                " admitted_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                job_rows,
            )
            db.executemany("INSERT INTO events (action_id, sequence, event, data) VALUES (?, ?, ?, ?)", event_rows)
    finally:
        db.close()


# HTTP helpers ------------------------------------------------------------------------------------


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def start(crew: str, action: str, input: dict[str, Any] | None = None, operation: str = "run") -> dict[str, Any]:
    return {
        "crew_id": crew,
        "action_id": action,
        "operation": operation,
        "input": input or {},
        "timeout_ms": JOB_TIMEOUT_MS,
    }


def key(action: str) -> dict[str, str]:
    return {"Idempotency-Key": action}


def sse(response: httpx.Response) -> Iterator[tuple[str, str]]:
    """(event name, raw data) per SSE event; data is decoded only where a caller needs it."""
    if response.status_code != 200:
        response.read()
        raise BenchError(f"stream answered {response.status_code}: {response.text[:300]}")
    name = ""
    for line in response.iter_lines():
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            yield name, line[6:]


def next_event(events: Iterator[tuple[str, str]], wanted: str) -> dict[str, Any]:
    name, data = next(events, ("end of stream", "{}"))
    if name != wanted:
        raise BenchError(f"expected a {wanted} event, got {name}: {data[:300]}")
    return dict(orjson.loads(data)["data"])


def drain(events: Iterator[tuple[str, str]]) -> str:
    """Read through the terminal event; its name."""
    for name, _ in events:
        if name in TERMINAL:
            return name
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
    if record.get("status") != "cancelled" or terminal.get("stop_confirmed") is not True:
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
            if client.get(f"/jobs/{action}").json()["status"] != "running":
                return False
        time.sleep(0.002)
    marker.unlink()
    return True


def memory(pid: int) -> dict[str, float]:
    info = psutil.Process(pid).memory_full_info()  # uss and pss walk /proc/<pid>/smaps
    return {"rss": info.rss / MiB, "uss": info.uss / MiB, "pss": info.pss / MiB}


# Measurements ------------------------------------------------------------------------------------


def start_latency(client: httpx.Client, samples: int, warmup: int) -> list[float]:
    """POST /jobs/stream -> the started event, for the fast crew; each job is read to its end first."""
    latencies = []
    for i in range(warmup + samples):
        action = new_id("start")
        began = time.perf_counter()
        with client.stream("POST", "/jobs/stream", json=start("fast", action), headers=key(action)) as response:
            events = sse(response)
            next_event(events, "started")
            elapsed = time.perf_counter() - began
            if drain(events) != "completed":
                raise BenchError(f"fast job {action} did not complete")
        if i >= warmup:
            latencies.append(elapsed)
    return latencies


def cancel_run(
    client: httpx.Client, samples: int, measure_memory: int
) -> tuple[list[float], list[Stop], list[dict[str, float]]]:
    """demo-slow streamed, cancelled after two ticks: (start latencies, cancel latencies, worker memory)."""
    starts: list[float] = []
    cancels: list[Stop] = []
    memories: list[dict[str, float]] = []
    for i in range(samples):
        action = new_id("slow")
        began = time.perf_counter()
        body = start("demo-slow", action, {"seconds": 600})
        with client.stream("POST", "/jobs/stream", json=body, headers=key(action)) as response:
            events = sse(response)
            pid = next_event(events, "started")["pid"]
            starts.append(time.perf_counter() - began)
            next_event(events, "chunk")
            next_event(events, "chunk")  # mid-stream: the crew is running and ticking
            if i < measure_memory:
                memories.append(memory(pid))
            cancels.append(cancel(client, "demo-slow", action))
            if drain(events) != "cancelled":
                raise BenchError(f"{action} did not end cancelled")
    return starts, cancels, memories


def cancel_blocked(client: httpx.Client, markers: Path, crew: str, body: dict[str, Any]) -> Stop | None:
    """Start ``body``, wait until its worker blocks, cancel; None if the job ended before blocking."""
    action = body["action_id"]
    with client.stream("POST", "/jobs/stream", json=body, headers=key(action)) as response:
        events = sse(response)
        pid = next_event(events, "started")["pid"]
        if not wait_blocked(client, markers, pid, action):
            return None
        stop = cancel(client, crew, action)
        drain(events)
    return stop


def cancel_replay(client: httpx.Client, markers: Path, samples: int) -> list[Stop]:
    """replay of the replayable crew's second task in block mode, cancelled while it blocks."""
    latencies: list[Stop] = []
    task_ids: list[str] = []
    for _ in range(samples * 2):  # bounded: a stale task id costs one fresh run, not a loop
        if len(latencies) == samples:
            break
        if not task_ids:
            task_ids = post_job(client, start("replayable", new_id("answer"), {"mode": "answer"}))["replay_task_ids"]
            if len(task_ids) != 2:
                raise BenchError(f"replayable run gave replay_task_ids {task_ids}")
        replay = {"task_id": task_ids[1], "inputs": {"mode": "block"}}
        stop = cancel_blocked(client, markers, "replayable", start("replayable", new_id("replay"), replay, "replay"))
        if stop is None:
            task_ids = []
        else:
            latencies.append(stop)
    if len(latencies) < samples:
        raise BenchError("replay jobs kept ending before they blocked")
    return latencies


def cancel_stubborn(client: httpx.Client, markers: Path, samples: int) -> list[Stop]:
    latencies = []
    for _ in range(samples):
        stop = cancel_blocked(client, markers, "stubborn", start("stubborn", new_id("stubborn")))
        if stop is None:
            raise BenchError("a stubborn job ended on its own")
        latencies.append(stop)
    return latencies


def api_throughput(sup: Supervisor, jobs: int, concurrency: int) -> float:
    """fast jobs per second through blocking POST /jobs, ``concurrency`` clients at once."""
    errors: list[BaseException] = []
    barrier = threading.Barrier(concurrency + 1)

    def client_loop(count: int) -> None:
        with sup.client() as client:
            barrier.wait()
            try:
                for _ in range(count):
                    post_job(client, start("fast", new_id("tput")))
            except BaseException as exc:
                errors.append(exc)

    shares = [jobs // concurrency + (1 if i < jobs % concurrency else 0) for i in range(concurrency)]
    threads = [threading.Thread(target=client_loop, args=(share,)) for share in shares]
    for thread in threads:
        thread.start()
    barrier.wait(30)
    began = time.perf_counter()
    for thread in threads:
        thread.join(600)
    elapsed = time.perf_counter() - began
    if errors:
        raise BenchError(f"throughput at concurrency {concurrency}: {errors[0]}")
    return jobs / elapsed


def inprocess_throughput(jobs: int, warmup: int) -> float:
    """The ceiling: the same crew kicked off in a plain loop in this process (a fresh crew per job, as a worker)."""
    import bench_crews  # crewai: imported at start, with telemetry off

    for _ in range(warmup):
        bench_crews.fast().kickoff()
    began = time.perf_counter()
    for _ in range(jobs):
        bench_crews.fast().kickoff()
    return jobs / (time.perf_counter() - began)


def flood(client: httpx.Client, chunks: int) -> tuple[float, float]:
    """(chunk events/s from the first chunk to the last, all events/s from started to terminal), client-side."""
    action = new_id("flood")
    received = 0
    first = last = began = 0.0
    body = start("flood", action, {"chunks": chunks})
    with client.stream("POST", "/jobs/stream", json=body, headers=key(action)) as response:
        for name, _ in sse(response):
            now = time.perf_counter()
            if name == "started":
                began = now
            elif name == "chunk":
                first = first or now
                last = now
                received += 1
            elif name in TERMINAL:
                if name != "completed" or received != chunks:
                    raise BenchError(f"flood ended {name} after {received} of {chunks} chunks")
                return (received - 1) / (last - first), (received + 2) / (now - began)
    raise BenchError("flood stream ended without a terminal event")


def journal_latency(client: httpx.Client, samples: int, warmup: int) -> list[float]:
    """Blocking fast jobs; each archived after, so the journal holds exactly what it held before."""
    latencies = []
    for i in range(warmup + samples):
        action = new_id("journal")
        began = time.perf_counter()
        post_job(client, start("fast", action))
        elapsed = time.perf_counter() - began
        archived = client.delete(f"/jobs/{action}", headers={"X-AIP-Archive-Confirmation": action})
        if archived.status_code != 200:
            raise BenchError(f"archive of {action} answered {archived.status_code}")
        if i >= warmup:
            latencies.append(elapsed)
    return latencies


# Reporting ---------------------------------------------------------------------------------------


def percentile(samples: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    ordered = sorted(samples)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def median_of(memories: list[dict[str, float]], field: str) -> float:
    return percentile([m[field] for m in memories], 50)


def verdicts(figures: dict[str, float]) -> list[dict[str, Any]]:
    return [
        {
            "figure": name,
            "target": f"{op} {limit:g}",
            "value": figures[name],
            "met": figures[name] <= limit if op == "<=" else figures[name] >= limit,
        }
        for name, op, limit in TARGETS
    ]


def table(figures: dict[str, float], results: list[dict[str, Any]], samples: dict[str, list[float]]) -> str:
    targets = {r["figure"]: r for r in results}
    lines = [f"{'figure':<32}{'value':>14}  {'target':<10} met  n"]
    for name, value in figures.items():
        verdict = targets.get(name)
        count = len(samples.get(name.rpartition("_p")[0], []))  # latency percentiles only
        lines.append(
            f"{name:<32}{value:>14,.2f}  {verdict['target'] if verdict else '':<10}"
            f" {('yes' if verdict['met'] else 'NO') if verdict else '':<4}{count or ''}"
        )
    return "\n".join(lines)


def plot(samples: dict[str, list[float]], path: Path) -> None:
    """ECDFs of start latency (log scale: warm is ms, cold is seconds) and of cancel latency, warm vs cold."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 5))
    cancels = ["cancel_run_warm", "cancel_run_cold", "cancel_replay_warm", "cancel_stubborn_warm"]
    panels = [
        (left, "start latency (POST /jobs/stream -> started)", ["start_warm", "start_cold"], 15),
        (right, "cancel latency (cancel request -> response)", cancels, 50),
    ]
    for axes, title, names, target in panels:
        for name in names:
            values = sorted(samples[name])
            fractions = [i / len(values) for i in range(len(values) + 1)]
            axes.step(
                [values[0], *values], fractions, where="post", marker="." if len(values) < 10 else None, label=name
            )
        axes.axvline(target, color="grey", linestyle="--", label=f"target {target} ms")
        axes.set_xscale("log")
        # Plain numbers, not 3x10^1; over more than a decade only 2 and 5 of each decade are labelled.
        low, high = axes.get_xlim()
        minor = "23456789" if high / low < 20 else "25"
        axes.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        axes.xaxis.set_minor_formatter(
            matplotlib.ticker.FuncFormatter(lambda v, _, m=minor: f"{v:g}" if f"{v:g}"[0] in m else "")
        )
        axes.set_xlabel("milliseconds (log scale)")
        axes.set_ylabel("fraction of samples at or below")
        axes.set_title(title)
        axes.grid(True, which="both", alpha=0.3)
        axes.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3)  # below: clear of the curves
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


# The run -----------------------------------------------------------------------------------------


class CpuMeter:
    """CPU seconds of the supervisor, its fork server, the workers (the fork server reaps them, so their
    time lands in its children's times by the time a job's terminal event is seen) and this client."""

    def __init__(self, sup: Supervisor) -> None:
        self.supervisor = psutil.Process(sup.process.pid)
        self.forkserver = sup.forkserver()

    def read(self) -> tuple[float, float, float, float]:
        own, server = self.supervisor.cpu_times(), self.forkserver.cpu_times()
        return (
            own.user + own.system,
            server.user + server.system,
            server.children_user + server.children_system,
            time.process_time(),
        )

    def per(self, before: tuple[float, ...], count: int, unit: float) -> tuple[float, ...]:
        return tuple((after - earlier) / count * unit for after, earlier in zip(self.read(), before, strict=True))


Figures = dict[str, float]
Samples = dict[str, list[float]]


def boot(plan: Plan, root: Path, markers: Path, supervisors: list[Supervisor]) -> list[Supervisor]:
    """Every supervisor at once (their CrewAI imports overlap), and crewai here for the in-process ceiling."""
    for size in JOURNAL_SIZES[1:]:
        populate(root / f"journal-{size}", size)
    for name, launcher in [("warm", "forkserver"), ("cold", "spawn")] + [
        (f"journal-{size}", "forkserver") for size in JOURNAL_SIZES[1:]
    ]:
        supervisors.append(Supervisor(name, root, launcher, markers))  # listed at once: stopped whatever happens
    say("importing crewai here too (the in-process ceiling) while the supervisors start")
    import bench_crews  # noqa: F401 - the import is the point: crewai, once, with telemetry off

    wait_ready(supervisors)
    return supervisors


def measure_journal(plan: Plan, supervisors: list[Supervisor], figures: Figures) -> None:
    say("journal cost: fast job latency with 0, 1,000 and 10,000 retained jobs")
    p50 = []
    for size, sup in zip(JOURNAL_SIZES, supervisors, strict=True):
        with sup.client() as client:
            if client.get("/health").json()["retained_runs"] != size:
                raise BenchError(f"{sup.name} does not hold {size} jobs")
            p50.append(percentile(journal_latency(client, plan.journal, plan.warmup), 50) * 1000)
            figures[f"journal_{size}_p50_ms"] = p50[-1]
        if size:
            sup.stop()  # a quieter machine for what follows
    figures["journal_last_over_first"] = p50[-1] / p50[0]


def measure_warm(plan: Plan, warm: Supervisor, markers: Path, figures: Figures, ms: Samples) -> None:
    meter = CpuMeter(warm)
    with warm.client() as client:
        say("start latency, warm")
        ms["start_warm"] = scaled(start_latency(client, plan.start_warm, plan.warmup))
        say("cancel latency: run (demo-slow mid-stream), replay (blocked), stubborn (ignores SIGTERM)")
        _, cancels, memories = cancel_run(client, plan.cancel_run, measure_memory=min(5, plan.cancel_run))
        stops(ms, "cancel_run_warm", cancels)
        stops(ms, "cancel_replay_warm", cancel_replay(client, markers, plan.cancel_replay))
        stops(ms, "cancel_stubborn_warm", cancel_stubborn(client, markers, plan.cancel_stubborn))
        figures["worker_uss_warm_mb"] = median_of(memories, "uss")
        figures["worker_pss_warm_mb"] = median_of(memories, "pss")
        say(f"event throughput: flood crew, {plan.flood_chunks:,} chunks")
        before = meter.read()
        rates = [flood(client, plan.flood_chunks) for _ in range(plan.flood_runs)]
        cpu = meter.per(before, plan.flood_chunks * plan.flood_runs, 1e6)
    figures["flood_chunks"] = plan.flood_chunks
    figures["flood_events_per_s"] = percentile([r[0] for r in rates], 50)
    figures["flood_e2e_events_per_s"] = percentile([r[1] for r in rates], 50)
    for name, value in zip(("supervisor", "forkserver", "worker", "client"), cpu, strict=True):
        if name != "forkserver":
            figures[f"flood_cpu_{name}_us_per_event"] = value

    say("throughput: fast jobs through the API at concurrency 1 and 4, then in a loop in this process")
    api_throughput(warm, plan.warmup, 1)
    before = meter.read()
    c1 = api_throughput(warm, plan.jobs_c1, 1)
    cpu = meter.per(before, plan.jobs_c1, 1e3)
    c4 = api_throughput(warm, plan.jobs_c4, 4)
    inproc = inprocess_throughput(plan.inproc, plan.warmup)
    figures |= {"jobs_per_s_c1": c1, "jobs_per_s_c4": c4, "jobs_per_s_inproc": inproc, "c4_over_inproc": c4 / inproc}
    for name, value in zip(("supervisor", "forkserver", "worker"), cpu, strict=False):
        figures[f"job_cpu_{name}_ms"] = value

    figures["supervisor_rss_mb"] = memory(warm.process.pid)["rss"]
    forkserver = memory(meter.forkserver.pid)
    figures["forkserver_rss_mb"], figures["forkserver_pss_mb"] = forkserver["rss"], forkserver["pss"]


def measure_cold(plan: Plan, cold: Supervisor, figures: Figures, ms: Samples) -> None:
    say(f"cold: {plan.cold} spawned job(s), about 5 s each")
    with cold.client() as client:
        starts, cancels, memories = cancel_run(client, plan.cold, measure_memory=plan.cold)
    ms["start_cold"] = scaled(starts)
    stops(ms, "cancel_run_cold", cancels)
    figures["worker_uss_cold_mb"] = median_of(memories, "uss")
    figures["worker_pss_cold_mb"] = median_of(memories, "pss")


def run(plan: Plan, root: Path, supervisors: list[Supervisor]) -> tuple[Figures, Samples]:
    markers = root / "markers"
    markers.mkdir()
    warm, cold, *filled = boot(plan, root, markers, supervisors)
    figures: Figures = {}
    ms: Samples = {}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        beside = pool.submit(measure_cold, plan, cold, figures, ms) if plan.overlap_cold else None
        measure_journal(plan, [warm, *filled], figures)
        measure_warm(plan, warm, markers, figures, ms)
        if beside is None:
            measure_cold(plan, cold, figures, ms)
        else:
            beside.result()
    latencies: Figures = {}
    for name, values in ms.items():
        for q in (50, 90, 99):
            latencies[f"{name}_p{q}_ms"] = percentile(values, q)
    latencies["start_cold_over_warm"] = latencies["start_cold_p50_ms"] / latencies["start_warm_p50_ms"]
    figures |= latencies
    missing = [name for name in FIGURES if not math.isfinite(figures.get(name, math.nan))]
    if missing:
        raise BenchError(f"figures not measured: {', '.join(missing)}")
    return {name: figures[name] for name in FIGURES}, ms


def scaled(seconds: list[float]) -> list[float]:
    return [s * 1000 for s in seconds]


def stops(ms: Samples, name: str, measured: list[Stop]) -> None:
    """Cancel latency as the client saw it, and the supervisor's share (kill, reap, confirm) as ``<name>_kill``."""
    ms[name] = scaled([http for http, _ in measured])
    ms[f"{name}_kill"] = [kill for _, kill in measured]


STARTED = time.monotonic()


def say(text: str) -> None:
    sys.stderr.write(f"bench: [{time.monotonic() - STARTED:5.1f} s] {text}\n")  # one write: two threads may say
    sys.stderr.flush()


def meta(plan: Plan, began: float, loadavg: tuple[float, ...]) -> dict[str, Any]:
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "quick": plan == QUICK,
        "plan": dataclasses.asdict(plan),
        "nproc": os.cpu_count(),
        "memory_gb": round(psutil.virtual_memory().total / 1024**3, 1),
        "python": platform.python_version(),
        "crewai": importlib.metadata.version("crewai"),
        "platform": platform.platform(),
        "commit": _git("describe", "--always", "--dirty"),
        "loadavg_at_start": loadavg,
        "loadavg_at_end": os.getloadavg(),
        "seconds": round(time.monotonic() - began, 1),
    }


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="few samples, small N: well under a minute")
    parser.add_argument("--json", type=Path, default=Path("bench.json"), help="figures (default: ./bench.json)")
    parser.add_argument("--plot", type=Path, default=None, help="PNG of the latency distributions (matplotlib)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary state directory")
    args = parser.parse_args()
    plan = QUICK if args.quick else FULL
    # SIGTERM ends the bench through the finally below, so its supervisors are stopped too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    began, loadavg = time.monotonic(), os.getloadavg()
    root = Path(tempfile.mkdtemp(prefix="crew-bench-"))
    # Before crewai is imported here: telemetry off, and its files under the temporary directory.
    os.environ.update(QUIET, HOME=str(root / "home"), CREWAI_STORAGE_DIR=str(root / "inproc-storage"))
    (root / "home").mkdir()
    supervisors: list[Supervisor] = []
    try:
        try:
            figures, samples = run(plan, root, supervisors)
        finally:
            for sup in supervisors:
                sup.stop()
        report(args, figures, samples, meta(plan, began, loadavg))  # before the cleanup: matplotlib caches in HOME
    except BenchError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 1
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    return 0


def report(args: argparse.Namespace, figures: Figures, samples: Samples, about: dict[str, Any]) -> None:
    results = verdicts(figures)
    document = {"meta": about, "figures": figures, "targets": results, "samples_ms": samples}
    args.json.write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2))
    print(table(figures, results, samples))
    print(f"\n{sum(r['met'] for r in results)} of {len(results)} targets met; figures in {args.json}")
    if args.plot is not None:
        plot(samples, args.plot)
        print(f"plot in {args.plot}")


if __name__ == "__main__":
    sys.exit(main())
