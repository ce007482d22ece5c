"""The measurements: each drives one supervisor and returns raw samples."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx
from bench_harness import (
    TERMINAL,
    BenchError,
    Stop,
    cancel,
    drain,
    key,
    memory,
    new_id,
    next_event,
    post_job,
    sse,
    start_body,
    wait_blocked,
)

from supervisor.testing import Server


def start_latency(client: httpx.Client, samples: int, warmup: int) -> list[float]:
    """POST /jobs/stream -> the started event, for the fast crew; each job is read to its end first."""
    latencies = []
    for i in range(warmup + samples):
        action = new_id("start")
        began = time.perf_counter()
        with client.stream("POST", "/jobs/stream", json=start_body("fast", action), headers=key(action)) as response:
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
        body = start_body("demo-slow", action, {"seconds": 600})
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
            answered = post_job(client, start_body("replayable", new_id("answer"), {"mode": "answer"}))
            task_ids = answered["replay_task_ids"]
            if len(task_ids) != 2:
                raise BenchError(f"replayable run gave replay_task_ids {task_ids}")
        replay = {"task_id": task_ids[1], "inputs": {"mode": "block"}}
        body = start_body("replayable", new_id("replay"), replay, "replay")
        stop = cancel_blocked(client, markers, "replayable", body)
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
        stop = cancel_blocked(client, markers, "stubborn", start_body("stubborn", new_id("stubborn")))
        if stop is None:
            raise BenchError("a stubborn job ended on its own")
        latencies.append(stop)
    return latencies


def api_throughput(sup: Server, jobs: int, concurrency: int) -> float:
    """fast jobs per second through blocking POST /jobs, ``concurrency`` clients at once."""
    errors: list[BaseException] = []
    barrier = threading.Barrier(concurrency + 1)

    def client_loop(count: int) -> None:
        with sup.client() as client:
            barrier.wait()
            try:
                for _ in range(count):
                    post_job(client, start_body("fast", new_id("tput")))
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
    body = start_body("flood", action, {"chunks": chunks})
    with client.stream("POST", "/jobs/stream", json=body, headers=key(action)) as response:
        for frame in sse(response):
            now, name = time.perf_counter(), frame.event
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
        post_job(client, start_body("fast", action))
        elapsed = time.perf_counter() - began
        archived = client.delete(f"/jobs/{action}", headers={"X-AIP-Archive-Confirmation": action})
        if archived.status_code != 200:
            raise BenchError(f"archive of {action} answered {archived.status_code}")
        if i >= warmup:
            latencies.append(elapsed)
    return latencies
