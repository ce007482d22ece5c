"""Load: N concurrent jobs, M SSE followers spread over them, and JSON event reads beside; every stream checked.

    scripts/load [--jobs 32] [--followers 200] [--readers 1] [--seconds 2] [--chunks 200] [--keep]

Starts a fork-server supervisor (bench registry, MAX_CONCURRENCY = jobs) and starts every job at once with
``POST /jobs/stream``: even jobs are ``demo-slow`` (a tick every 100 ms for ``--seconds``), odd ones ``flood``
(``--chunks`` chunks back to back). Each follower opens ``GET /jobs/{id}/events`` as SSE from cursor 0 at a
random moment in the first ``--spread`` seconds (before the first event, mid-stream or after the end), and
each job has ``--readers`` clients paging ``GET /jobs/{id}/events?cursor=`` as JSON until the terminal event.

Invariants, exit 1 if any fails: every job completes; its events are sequences 0..n-1 with exactly one
terminal event, last; every follower and every JSON reader got exactly the starter's events (same order,
same data, none twice, nothing after the terminal one); ``GET /jobs/{id}`` agrees on status and count.
Prints how many jobs were planned, completed and failed, completed jobs/s, events/s, p50 and p99 request
latency per kind with its n (the maximum instead of a p99 below 100 samples), and the supervisor's peak
RSS (sampled).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import random
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
from bench_harness import TERMINAL, key, new_id, start_body
from bench_report import quantile_text
from load_common import PeakRss, parse_plan, serving, verdict

from supervisor.console import sse
from supervisor.enums import EventName, Status
from supervisor.testing import Server

Event = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Plan:
    jobs: int = 32
    followers: int = 200  # in total, job i % jobs for follower i
    readers: int = 1  # JSON readers per job
    seconds: float = 2.0  # demo-slow's ticking
    chunks: int = 200  # flood's chunks
    spread: float = 3.0  # followers attach within this many seconds of their job's admission
    poll: float = 0.05  # a JSON reader's pause when it found nothing new
    seed: int = 0


@dataclasses.dataclass
class Result:
    planned: int = 0  # jobs the run set out to start
    completed: int = 0  # of them, those whose starter's stream ended with a completed event
    events: int = 0  # distinct events (the jobs' event counts summed)
    delivered: int = 0  # events received by every stream and reader together
    seconds: float = 0.0  # the whole run, the last follower included
    job_seconds: float = 0.0  # from the first start to the last terminal event a starter saw
    peak_rss_mb: float = 0.0
    latencies: dict[str, list[float]] = dataclasses.field(
        default_factory=lambda: {"start": [], "follow": [], "read": [], "lag": []}
    )
    violations: list[str] = dataclasses.field(default_factory=list)

    @property
    def failed(self) -> int:
        """Jobs that did not complete: ended failed or cancelled, or no terminal event reached their starter."""
        return self.planned - self.completed

    def figures(self) -> dict[str, float]:
        """The totals and rates; the latencies are printed by report() with their n (quantile_text)."""
        return {
            "events": self.events,
            "delivered": self.delivered,
            "seconds": self.seconds,
            "job_seconds": self.job_seconds,
            "jobs_per_s": per_second(self.completed, self.job_seconds),
            "events_per_s": per_second(self.events, self.job_seconds),
            "delivered_per_s": per_second(self.delivered, self.seconds),
            "peak_rss_mb": self.peak_rss_mb,
        }


QUANTILES = (50, 99)  # of each kind of request latency


def per_second(count: int, seconds: float) -> float:
    """NaN when nothing was timed (no starter saw its stream end): the report still prints what failed."""
    return count / seconds if seconds > 0 else math.nan


def ended_completed(events: list[Event]) -> bool:
    """The starter's answer: its stream's last event is ``completed`` (check() says what else is wrong)."""
    return bool(events) and events[-1]["event"] == EventName.COMPLETED


async def sse_events(response: httpx.Response) -> AsyncIterator[Event]:
    if response.status_code != 200:
        await response.aread()
        raise RuntimeError(f"stream answered {response.status_code}: {response.text[:300]}")
    async for frame in sse.aframes(sse.alines(response.aiter_bytes())):
        yield frame.json()


async def read_stream(response: httpx.Response) -> list[Event]:
    """Every event up to the end of the stream: anything after the terminal event is kept, to be caught."""
    return [event async for event in sse_events(response)]


class Job:
    """One job and everything its clients received."""

    def __init__(self, index: int, plan: Plan) -> None:
        self.action = new_id(f"load{index}")
        self.crew = "demo-slow" if index % 2 == 0 else "flood"
        self.input = {"seconds": plan.seconds} if self.crew == "demo-slow" else {"chunks": plan.chunks}
        self.admitted = asyncio.Event()
        self.started: list[Event] = []
        self.followed: list[list[Event]] = []
        self.read: list[list[Event]] = []
        self.ended = 0.0  # perf_counter when its starter saw the end of its stream


async def run_starter(client: httpx.AsyncClient, job: Job, result: Result) -> None:
    body = start_body(job.crew, job.action, job.input)
    began = time.perf_counter()
    try:
        async with client.stream("POST", "/jobs/stream", json=body, headers=key(job.action)) as response:
            result.latencies["start"].append(time.perf_counter() - began)
            job.admitted.set()
            job.started = await read_stream(response)
            job.ended = time.perf_counter()
    finally:
        job.admitted.set()  # a failed start must not leave its followers waiting forever


async def run_follower(client: httpx.AsyncClient, job: Job, delay: float, result: Result) -> None:
    await job.admitted.wait()
    await asyncio.sleep(delay)
    headers = {"Accept": "text/event-stream"}
    began = time.perf_counter()
    async with client.stream("GET", f"/jobs/{job.action}/events", params={"cursor": 0}, headers=headers) as response:
        result.latencies["follow"].append(time.perf_counter() - began)
        job.followed.append(await read_stream(response))


async def watch_lag(done: asyncio.Event, result: Result) -> None:
    """This client's own event-loop lag: large request latencies with a small lag are the server's."""
    while not done.is_set():
        began = time.perf_counter()
        await asyncio.sleep(0.01)
        result.latencies["lag"].append(time.perf_counter() - began - 0.01)


async def run_reader(client: httpx.AsyncClient, job: Job, plan: Plan, result: Result) -> None:
    await job.admitted.wait()
    events: list[Event] = []
    cursor = 0
    while not events or events[-1]["event"] not in TERMINAL:
        began = time.perf_counter()
        response = await client.get(f"/jobs/{job.action}/events", params={"cursor": cursor})
        result.latencies["read"].append(time.perf_counter() - began)
        if response.status_code != 200:
            raise RuntimeError(f"events of {job.action} answered {response.status_code}: {response.text[:300]}")
        page = response.json()
        if page["cursor"] != cursor or page["next_cursor"] != cursor + len(page["events"]):
            raise RuntimeError(
                f"events of {job.action}: cursor {cursor} answered {page['cursor']}..{page['next_cursor']}"
            )
        events.extend(page["events"])
        cursor = page["next_cursor"]
        if not page["events"]:
            await asyncio.sleep(plan.poll)
    job.read.append(events)


def check(job: Job, record: dict[str, Any], plan: Plan, result: Result) -> None:
    """Appends a violation for every invariant this job breaks."""
    wrong = result.violations.append
    events = job.started
    sequences = [e["sequence"] for e in events]
    if sequences != list(range(len(events))):
        wrong(f"{job.action}: sequences are not 0..n-1: {sequences[:20]}")
    terminals = [i for i, e in enumerate(events) if e["event"] in TERMINAL]
    if terminals != [len(events) - 1]:
        wrong(f"{job.action}: terminal events at {terminals} of {len(events)}")
    elif events[-1]["event"] != EventName.COMPLETED:
        wrong(f"{job.action}: ended {events[-1]['event']}: {events[-1]['data']}")
    elif events[-1]["data"] != record.get("output"):  # the client takes that data as the output
        wrong(f"{job.action}: the completed event's data is not the record's output")
    if record.get("status") != Status.COMPLETED or record.get("event_count") != len(events):
        wrong(f"{job.action}: record says {record.get('status')}/{record.get('event_count')}, stream saw {len(events)}")
    for kind, copies, expected in (("follower", job.followed, None), ("reader", job.read, plan.readers)):
        if expected is not None and len(copies) != expected:
            wrong(f"{job.action}: {len(copies)} {kind}s finished, {expected} expected")
        for copy in copies:
            if copy != events:
                first = next((i for i, (a, b) in enumerate(zip(copy, events, strict=False)) if a != b), None)
                wrong(f"{job.action}: a {kind} got {len(copy)} events, not the {len(events)} ({first=})")
    result.delivered += len(events) + sum(map(len, job.followed)) + sum(map(len, job.read))
    result.events += len(events)


def client_for(sup: Server) -> httpx.AsyncClient:
    # Pooled connections expire before uvicorn's 5 s keep-alive does: reusing one it is closing is a ReadError.
    limits = httpx.Limits(max_connections=None, keepalive_expiry=1.0)
    return sup.async_client(limits=limits, timeout=httpx.Timeout(120, connect=30))


async def drive(sup: Server, plan: Plan) -> Result:
    rng = random.Random(plan.seed)
    jobs = [Job(i, plan) for i in range(plan.jobs)]
    result = Result(planned=len(jobs))
    async with contextlib.AsyncExitStack() as stack:
        # A client per job: one pool shared by hundreds of streams made the client, not the server, the
        # bottleneck (seconds to read headers that curl got in 0.3 s beside it).
        clients = [await stack.enter_async_context(client_for(sup)) for _ in jobs]
        tasks = [run_starter(clients[i], job, result) for i, job in enumerate(jobs)]
        tasks += [
            run_follower(clients[i % plan.jobs], jobs[i % plan.jobs], rng.uniform(0, plan.spread), result)
            for i in range(plan.followers)
        ]
        tasks += [run_reader(clients[i], job, plan, result) for i, job in enumerate(jobs) for _ in range(plan.readers)]
        with PeakRss(sup.pid) as rss:
            done = asyncio.Event()
            lag = asyncio.create_task(watch_lag(done, result))
            began = time.perf_counter()
            outcomes = await asyncio.gather(*tasks, return_exceptions=True)
            result.seconds = time.perf_counter() - began
            done.set()
            await lag
        # A starter whose client failed never saw its end (ended 0): only the ends that were seen count.
        result.job_seconds = max((job.ended for job in jobs if job.ended), default=began) - began
        result.completed = sum(ended_completed(job.started) for job in jobs)
        result.peak_rss_mb = rss.peak_mb
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                result.violations.append(f"a client failed: {type(outcome).__name__}: {outcome}")
        for client, job in zip(clients, jobs, strict=True):
            check(job, (await client.get(f"/jobs/{job.action}")).json(), plan, result)
    expected = plan.followers
    if sum(len(job.followed) for job in jobs) != expected:
        result.violations.append(f"{sum(len(job.followed) for job in jobs)} followers finished, {expected} expected")
    return result


def load(plan: Plan, keep: bool = False) -> Result:
    """One load run against a fresh supervisor; the caller decides what the violations mean."""
    settings = {"AIP_CREWAI_MAX_CONCURRENCY": str(max(plan.jobs, 4))}
    with serving("crew-load-", settings, keep) as sup:
        return asyncio.run(drive(sup, plan))


def report(plan: Plan, result: Result) -> str:
    f = result.figures()
    lines = [
        f"load: {plan.jobs} jobs, {plan.followers} SSE followers, {plan.readers} JSON reader(s) per job",
        f"  jobs: {result.planned} planned, {result.completed} completed, {result.failed} failed",
        f"  {f['job_seconds']:.2f} s first start to last end: {f['jobs_per_s']:.2f} completed jobs/s,"
        f" {f['events_per_s']:.0f} events/s produced ({result.events} events)",
        f"  clients: {f['seconds']:.2f} s to the last follower: {f['delivered_per_s']:.0f} events/s delivered"
        f" ({result.delivered} events to starters, followers and readers)",
    ]
    for kind, what in (
        ("start", "POST /jobs/stream to headers"),
        ("follow", "SSE GET to headers"),
        ("read", "JSON read"),
        ("lag", "load client's event-loop lag"),
    ):
        ms = [seconds * 1000 for seconds in result.latencies[kind]]
        quantiles = "   ".join(quantile_text(ms, q) for q in QUANTILES) if ms else "none measured"
        lines.append(f"  {what:<30} {quantiles}")
    lines.append(f"  supervisor peak RSS {f['peak_rss_mb']:.1f} MiB")
    return "\n".join(lines + verdict("load", result.violations, shown=50))


def main() -> int:
    plan, parser, keep = parse_plan(Plan, __doc__)
    if plan.jobs < 1 or plan.followers < 0 or plan.readers < 0:
        parser.error("--jobs must be at least 1; --followers and --readers at least 0")
    result = load(plan, keep)
    print(report(plan, result))
    return 1 if result.violations else 0


if __name__ == "__main__":
    sys.exit(main())
