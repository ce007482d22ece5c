"""The measurements: each drives one supervisor and returns raw samples."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import resource
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psutil
from bench_harness import (
    TERMINAL,
    BenchError,
    MiB,
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

from supervisor.enums import EventName
from supervisor.testing import FORKED_WORKER, Server

Setup = Callable[[], contextlib.AbstractContextManager[Any]]
MEMORY_PERIOD = 0.5  # seconds between memory samples of a wave (each walks every process's smaps_rollup)


def start_latency(clients: list[httpx.Client], samples: int, warmup: int) -> list[list[float]]:
    """POST /jobs/stream -> the started event, for the fast crew, on each client's supervisor in turn (so that
    what the machine does meanwhile falls on each alike); each job is read to its end first. Per client."""
    latencies: list[list[float]] = [[] for _ in clients]
    for i in range(warmup + samples):
        for client, measured in zip(clients, latencies, strict=True):
            action = new_id("start")
            began = time.perf_counter()
            with client.stream("POST", "/jobs/stream", json=start_body("fast", action), headers=key(action)) as answer:
                events = sse(answer)
                next_event(events, EventName.STARTED)
                elapsed = time.perf_counter() - began
                if drain(events) != EventName.COMPLETED:
                    raise BenchError(f"fast job {action} did not complete")
            if i >= warmup:
                measured.append(elapsed)
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
            pid = next_event(events, EventName.STARTED)["pid"]
            starts.append(time.perf_counter() - began)
            next_event(events, EventName.CHUNK)
            next_event(events, EventName.CHUNK)  # mid-stream: the crew is running and ticking
            if i < measure_memory:
                memories.append(memory(pid))
            cancels.append(cancel(client, "demo-slow", action))
            if drain(events) != EventName.CANCELLED:
                raise BenchError(f"{action} did not end cancelled")
    return starts, cancels, memories


def cancel_blocked(client: httpx.Client, markers: Path, crew: str, body: dict[str, Any]) -> Stop | None:
    """Start ``body``, wait until its worker blocks, cancel; None if the job ended before blocking."""
    action = body["action_id"]
    with client.stream("POST", "/jobs/stream", json=body, headers=key(action)) as response:
        events = sse(response)
        pid = next_event(events, EventName.STARTED)["pid"]
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


@dataclasses.dataclass(frozen=True)
class JobRun:
    """Blocking fast jobs through the API: how many completed, in how long, and each one's latency."""

    completed: int
    seconds: float
    latencies: list[float]  # seconds, each POST /jobs as its client saw it
    outputs: list[dict[str, Any]]  # what each answered

    @property
    def per_second(self) -> float:
        return self.completed / self.seconds


def together(
    count: int,
    work: Callable[[int, Any], None],
    setup: Setup = contextlib.nullcontext,
    during: contextlib.AbstractContextManager[Any] | None = None,
) -> tuple[float, list[BaseException]]:
    """``work(index, setup())`` in ``count`` threads released at once (each ``setup`` made before, outside the
    clock): the seconds until the last one ended, ``during`` held meanwhile, and what each that failed raised."""
    errors: list[BaseException] = []
    barrier = threading.Barrier(count + 1)

    def run(index: int) -> None:
        with setup() as resource:
            barrier.wait()
            try:
                work(index, resource)
            except BaseException as exc:
                errors.append(exc)

    threads = [threading.Thread(target=run, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    with during or contextlib.nullcontext():
        barrier.wait(60)
        began = time.perf_counter()
        for thread in threads:
            thread.join(600)
        seconds = time.perf_counter() - began
    return seconds, errors


def api_throughput(sup: Server, jobs: int, concurrency: int, crew: str = "fast") -> JobRun:
    """``crew``'s jobs through blocking POST /jobs, ``concurrency`` clients at once; counts what completed."""
    latencies: list[float] = []  # list.append is atomic: the clients share it
    outputs: list[dict[str, Any]] = []
    shares = [jobs // concurrency + (1 if i < jobs % concurrency else 0) for i in range(concurrency)]

    def client_loop(index: int, client: httpx.Client) -> None:
        for _ in range(shares[index]):
            began = time.perf_counter()
            outputs.append(post_job(client, start_body(crew, new_id("tput"))))  # 200 only when completed
            latencies.append(time.perf_counter() - began)

    elapsed, errors = together(concurrency, client_loop, sup.client)
    if errors:
        raise BenchError(f"throughput at concurrency {concurrency}: {errors[0]}")
    return JobRun(len(latencies), elapsed, latencies, outputs)


def blocking_in_turn(clients: list[httpx.Client], crew: str, samples: int) -> list[list[tuple[str, float]]]:
    """``crew``'s jobs through blocking POST /jobs, one at a time, on each client's supervisor in turn (so that what
    the machine does meanwhile falls on each alike). Per client, each job's action id and latency in seconds."""
    measured: list[list[tuple[str, float]]] = [[] for _ in clients]
    for _ in range(samples):
        for client, jobs in zip(clients, measured, strict=True):
            action = new_id("turn")
            began = time.perf_counter()
            post_job(client, start_body(crew, action))  # 200 only when completed
            jobs.append((action, time.perf_counter() - began))
    return measured


def llm_builds(outputs: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """What building each job's LLM took in its worker, (wall, CPU) ms, as ``bench_crews.timed_llm`` said."""
    import bench_crews

    builds = []
    for output in outputs:
        said = bench_crews.BUILT.search(output["tasks_output"][0]["description"])
        if said is None:
            raise BenchError("an llm job did not say what building its LLM took")
        builds.append((float(said.group(1)), float(said.group(2))))
    return builds


def inprocess_llm_builds(count: int) -> list[tuple[float, float]]:
    """What building the same LLM takes in this process, (wall, CPU) ms each."""
    import bench_crews

    builds = []
    for _ in range(count):
        wall, cpu = time.perf_counter(), time.process_time()
        bench_crews.provider_llm()
        builds.append(((time.perf_counter() - wall) * 1000, (time.process_time() - cpu) * 1000))
    return builds


@dataclasses.dataclass(frozen=True)
class InProcess:
    """The same crews in this process, no supervisor: the ceiling the isolation is measured against."""

    kickoffs: list[float]  # seconds per fast job: build the crew, kick it off
    cpu_seconds: float  # this process's CPU across those kickoffs (CrewAI's threads included)
    minor_faults: int  # this process's minor page faults across them

    @property
    def per_second(self) -> float:
        return len(self.kickoffs) / sum(self.kickoffs)


def inprocess_kickoffs(jobs: int, warmup: int, crew: str = "fast") -> InProcess:
    """``crew`` kicked off in a plain loop in this process (a fresh crew per job, as a worker builds)."""
    import bench_crews  # crewai: imported at start, with telemetry off

    factory = bench_crews.registry[crew]
    for _ in range(warmup):
        factory().kickoff()
    kickoffs = []
    cpu, faults = time.process_time(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(jobs):
        began = time.perf_counter()
        factory().kickoff()
        kickoffs.append(time.perf_counter() - began)
    return InProcess(kickoffs, time.process_time() - cpu, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults)


@dataclasses.dataclass(frozen=True)
class Wave:
    """Many jobs started at once: how long until the last ended, and (if sampled) the memory it took at its
    peak. Sampling reads every process's smaps_rollup, ~2 ms each for a CrewAI process: measured apart."""

    jobs: int
    completed: int
    seconds: float
    peak_pss_mb: float  # the whole tree (supervisor, fork server, workers), or this process
    most_workers: int  # workers alive at once, at most (0 in-process)
    worker_pss_mb: float  # per worker, at the sample with the most workers (0 in-process)
    samples: int  # memory samples taken (0: not sampled)


def api_wave(sup: Server, crew: str, jobs: int, sampled: bool) -> Wave:
    """``jobs`` blocking POST /jobs of ``crew`` from as many clients at once (the supervisor's MAX_CONCURRENCY
    must admit them all), the tree's PSS sampled meanwhile if ``sampled``."""
    memory = TreeMemory(sup.pid, sampled=sampled)

    def job(index: int, client: httpx.Client) -> None:
        post_job(client, start_body(crew, new_id("wave")))

    seconds, failed = together(jobs, job, lambda: sup.client(timeout=600), memory)
    done = jobs - len(failed)
    return Wave(jobs, done, seconds, memory.peak_mb, memory.most_workers, memory.worker_mb, memory.samples)


def inprocess_wave(crew: str, jobs: int, sampled: bool) -> Wave:
    """What the reference sidecar does with ``jobs`` at once: a kickoff of ``crew`` per thread, in this process
    (its PSS sampled meanwhile if ``sampled``)."""
    import bench_crews

    factory = bench_crews.registry[crew]
    memory = TreeMemory(os.getpid(), tree=False, sampled=sampled)
    seconds, failed = together(jobs, lambda index, _: factory().kickoff(), during=memory)
    return Wave(jobs, jobs - len(failed), seconds, memory.peak_mb, 0, 0.0, memory.samples)


class TreeMemory:
    """A thread sampling the PSS of a process (and, with ``tree``, of its descendants) every
    ``MEMORY_PERIOD``: the peak, and the workers' share at the sample with the most workers. Without
    ``sampled`` it does nothing."""

    def __init__(self, pid: int, tree: bool = True, sampled: bool = True) -> None:
        self.root = psutil.Process(pid)
        self.tree = tree
        self.sampled = sampled
        self.peak_mb = 0.0
        self.most_workers = 0
        self.worker_mb = 0.0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tree-memory")

    def __enter__(self) -> TreeMemory:
        if self.sampled:
            self._sample()
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.sampled:
            self._stop.set()
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(MEMORY_PERIOD):
            self._sample()

    def _sample(self) -> None:
        processes = [self.root, *(self.root.children(recursive=True) if self.tree else [])]
        total, workers, worker_pss = 0.0, 0, 0.0
        for process in processes:
            try:
                pss = process.memory_full_info().pss / MiB
                forked = process.name() == FORKED_WORKER
            except psutil.Error:
                continue
            total += pss
            workers += forked
            worker_pss += pss if forked else 0.0
        self.samples += 1
        self.peak_mb = max(self.peak_mb, total)
        if workers > self.most_workers:
            self.most_workers, self.worker_mb = workers, worker_pss / workers


@dataclasses.dataclass(frozen=True)
class Stream:
    """One streamed job's chunks as they arrived: counted, never taken from the plan."""

    chunks: int
    rate: float  # chunks/s after the first read that held one, up to the read that held the last
    e2e_rate: float  # all events/s (started + chunks + terminal), from started to the terminal event


def stream_chunks(client: httpx.Client, crew: str, chunks: int) -> Stream:
    """Stream ``crew`` with input ``chunks`` through POST /jobs/stream and count its chunk events.

    A lean reader of the server's own framing (``event: <name>``, ``data``, ``id``, blank line; see
    supervisor.console.sse): it counts chunk events in each read with ``bytes.count`` and parses only the
    other frames, so the client costs about a microsecond per event and the supervisor is what is measured
    (the generic line parser costs ~40 µs per event, a ceiling near 25,000 events/s on its own).
    """
    action = new_id(crew)
    body = start_body(crew, action, {"chunks": chunks})
    received = 0
    first_read = 0  # chunks in the first read that held any: they arrived before the rate's clock starts
    first = last = began = 0.0
    pending = b""
    with client.stream("POST", "/jobs/stream", json=body, headers=key(action)) as response:
        if response.status_code != 200:
            response.read()
            raise BenchError(f"{crew} stream answered {response.status_code}: {response.text[:300]}")
        for data in response.iter_raw():
            now = time.perf_counter()
            pending += data
            end = pending.rfind(b"\n\n")
            if end < 0:
                continue
            whole, pending = pending[: end + 2], pending[end + 2 :]
            count = whole.count(b"event: chunk\n")
            if count:
                if not received:
                    first, first_read = now, count
                received += count
                last = now
            if whole.count(b"event: ") == count:
                continue
            for frame in whole.split(b"\n\n"):
                name = frame.partition(b"\n")[0].removeprefix(b"event: ").decode()
                if name == EventName.STARTED:
                    began = now
                elif name in TERMINAL:
                    if name != EventName.COMPLETED or received != chunks:
                        raise BenchError(f"{crew} ended {name} after {received} of {chunks} chunks")
                    if received == first_read or not began:
                        raise BenchError(f"{crew}: every chunk arrived in one read; ask for more chunks")
                    rate = (received - first_read) / (last - first)
                    return Stream(received, rate, (received + 2) / (now - began))
    raise BenchError(f"{crew} stream ended without a terminal event")


@dataclasses.dataclass(frozen=True)
class InProcessStream:
    chunks: int
    rate: float  # chunks/s from the first chunk to the last, as the caller iterating the stream saw them
    cpu_seconds: float  # this process's CPU across the kickoff (CrewAI's threads included)


def inprocess_stream(chunks: int) -> InProcessStream:
    """CrewAI's own streaming rate: the flood crew kicked off here with stream=True, its chunks iterated."""
    import bench_crews

    crew = bench_crews.flood()
    crew.stream = True
    received = 0
    first = last = 0.0
    cpu = time.process_time()
    for _ in crew.kickoff(inputs={"chunks": chunks}):
        last = time.perf_counter()
        first = first or last
        received += 1
    cpu = time.process_time() - cpu
    if received != chunks:
        raise BenchError(f"in-process flood gave {received} of {chunks} chunks")
    return InProcessStream(received, (received - 1) / (last - first), cpu)


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
