"""Prometheus metrics: one registry per supervisor, so nothing leaks between instances (or tests).

``/metrics`` sits behind the same bearer check as every other route; scrape it with the token (an observer's will do).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from protocol import Operation
from supervisor.enums import EventName, Role
from supervisor.scopes import needs

PREFIX = "crew_supervisor"
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
# Fine enough for a median of steps a few milliseconds long: 0.25 ms to ~50 s, each bucket 1.25x the one below.
STEP_BUCKETS = tuple(round(0.00025 * 1.25**i, 6) for i in range(56))
JOB_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)  # a job's timeout is 1 h at most


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.admitted = Counter(f"{PREFIX}_jobs_admitted", "Jobs admitted (durable).", ["operation"], registry=r)
        self.finished = Counter(
            f"{PREFIX}_jobs_finished", "Jobs that reached their terminal event.", ["operation", "outcome"], registry=r
        )
        self.crew_finished, self.crew_job_seconds = _by_crew(r)
        self.worker_starts = Counter(f"{PREFIX}_worker_starts", "Workers launched.", ["launcher"], registry=r)
        self.kills = Counter(f"{PREFIX}_kills", "Workers killed by the supervisor.", ["reason"], registry=r)
        self.llm_tokens = Counter(
            f"{PREFIX}_llm_tokens", "LLM tokens jobs spent, as CrewAI counts them.", ["crew", "kind"], registry=r
        )
        self.llm_calls = Counter(
            f"{PREFIX}_llm_calls", "LLM calls jobs made (provider requests).", ["crew"], registry=r
        )
        self.effects = Counter(
            f"{PREFIX}_effects",
            "Tool and LLM calls jobs made, by how each ended.",
            ["crew", "kind", "status"],
            registry=r,
        )
        self.start_latency = Histogram(
            f"{PREFIX}_start_seconds", "Admission to the started event.", buckets=LATENCY_BUCKETS, registry=r
        )
        self.cancel_latency = Histogram(
            f"{PREFIX}_cancel_seconds",
            "Cancel request to a confirmed terminal event.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.job_steps = Histogram(
            f"{PREFIX}_job_step_seconds",
            "Each step of a job's time, from admission to its terminal event committed.",
            ["step"],
            buckets=STEP_BUCKETS,
            registry=r,
        )
        self.commit_latency = Histogram(
            f"{PREFIX}_journal_commit_seconds", "Durable journal commits.", buckets=LATENCY_BUCKETS, registry=r
        )
        self.loop_lag = Histogram(
            f"{PREFIX}_event_loop_lag_seconds",
            "How late the housekeeping tick fires: the supervisor's own responsiveness.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.running = Gauge(f"{PREFIX}_jobs_running", "Jobs with a worker launching or running.", registry=r)
        self.queued = Gauge(f"{PREFIX}_jobs_queued", "Admitted jobs waiting for a worker slot.", registry=r)
        self.journal_bytes = Gauge(f"{PREFIX}_journal_bytes", "Journal size on disk, WAL included.", registry=r)
        self.forkserver_restarts = Gauge(f"{PREFIX}_forkserver_restarts", "Fork server restarts.", registry=r)
        self.idle_workers = Gauge(
            f"{PREFIX}_forkserver_idle_workers", "Workers forked ahead of demand, waiting for a job.", registry=r
        )

    def observe_with(
        self,
        running: Callable[[], float],
        queued: Callable[[], float],
        queued_by_crew: Callable[[], Mapping[str, int]],
        journal_bytes: Callable[[], float],
        restarts: Callable[[], float],
        idle_workers: Callable[[], float],
    ) -> None:
        """Gauges read at scrape time, so they cannot drift from the truth."""
        self.running.set_function(running)
        self.queued.set_function(queued)
        self.registry.register(_QueuedByCrew(queued_by_crew))
        self.journal_bytes.set_function(journal_bytes)
        self.forkserver_restarts.set_function(restarts)
        self.idle_workers.set_function(idle_workers)

    def job_finished(
        self, crew: str, operation: Operation, outcome: EventName, evidence: Mapping[str, Any], seconds: float
    ) -> None:
        """A job's terminal event committed, ``seconds`` after its admission; ``evidence``: a failed or cancelled
        job's (a kill's says its signal). A kill is counted by its failure's reason (ours: a bounded vocabulary), a
        cancel's as ``cancelled``: its ``reason`` is what the canceller said, free text no label may hold."""
        self.finished.labels(operation, outcome).inc()
        self.crew_finished.labels(crew, operation, outcome).inc()
        self.crew_job_seconds.labels(crew, outcome).observe(seconds)
        if "signal" in evidence:  # the supervisor killed the worker: say why
            self.kills.labels(outcome if outcome == EventName.CANCELLED else evidence.get("reason") or outcome).inc()

    def job_step(self, step: str, seconds: float) -> None:
        self.job_steps.labels(step).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _by_crew(registry: CollectorRegistry) -> tuple[Counter, Histogram]:
    """Each crew's finished jobs and their durations. The crew label takes only the crews this supervisor serves
    (admission refuses any other before any metric is touched): the series are bounded by the registry of crews,
    not by what clients send."""
    finished = Counter(
        f"{PREFIX}_crew_jobs_finished",
        "Jobs of each crew that reached their terminal event.",
        ["crew", "operation", "outcome"],
        registry=registry,
    )
    seconds = Histogram(
        f"{PREFIX}_crew_job_seconds",
        "Each crew's jobs, from admission to their terminal event.",
        ["crew", "outcome"],
        buckets=JOB_BUCKETS,
        registry=registry,
    )
    return finished, seconds


class _QueuedByCrew(Collector):
    """Queued jobs by crew, read at scrape time: one series per crew served (the registry's, so bounded), 0 for
    one with none waiting."""

    def __init__(self, queued: Callable[[], Mapping[str, int]]) -> None:
        self.queued = queued

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            f"{PREFIX}_crew_jobs_queued", "Admitted jobs of each crew waiting for a worker slot.", labels=["crew"]
        )
        for crew, count in sorted(self.queued().items()):
            family.add_metric([crew], count)
        yield family


router = APIRouter()


@router.get("/metrics", response_class=PlainTextResponse)
@needs(Role.OBSERVER)
async def scrape(request: Request) -> Response:
    metrics: Metrics = request.app.state.metrics
    return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)
