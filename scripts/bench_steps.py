"""Where a job's time goes: the supervisor's own histogram of each step of a job (``/metrics``,
``crew_supervisor_job_step_seconds{step}``) read before and after a batch, so the batch's steps alone are counted."""

from __future__ import annotations

import dataclasses
import math

from bench_harness import BenchError
from prometheus_client.parser import text_string_to_metric_families

from supervisor.testing import Server

METRIC = "crew_supervisor_job_step_seconds"
# In the order a job takes them: admitted (durable) -> a slot -> Start sent -> Started -> its terminal frame ->
# its worker's exit seen -> its remains checked and removed -> its terminal event committed.
STEPS = ("queue", "launch", "worker_start", "job", "exit", "cleanup", "journal")


@dataclasses.dataclass(frozen=True)
class Histogram:
    """One step's cumulative bucket counts (upper bound -> count), observations and their sum (seconds)."""

    buckets: dict[float, float]
    count: float
    total: float

    def less(self, earlier: Histogram) -> Histogram:
        buckets = {bound: count - earlier.buckets.get(bound, 0.0) for bound, count in self.buckets.items()}
        return Histogram(buckets, self.count - earlier.count, self.total - earlier.total)

    def median(self) -> float:
        """As Prometheus's histogram_quantile: linear within the bucket that holds the middle observation."""
        middle, lower, below = self.count / 2, 0.0, 0.0
        for bound, count in sorted(self.buckets.items()):
            if count >= middle and math.isfinite(bound):
                return lower + (bound - lower) * (middle - below) / max(count - below, 1e-12)
            lower, below = bound, count
        raise BenchError(f"{METRIC}: the median lies above the last bucket")


def read_steps(sup: Server) -> dict[str, Histogram]:
    """Every step's histogram as ``sup``'s ``/metrics`` says it now (a step never observed is empty)."""
    with sup.client() as client:
        response = client.get("/metrics")
    response.raise_for_status()
    found: dict[str, Histogram] = {step: Histogram({}, 0.0, 0.0) for step in STEPS}
    for family in text_string_to_metric_families(response.text):
        if family.name != METRIC:
            continue
        for sample in family.samples:
            step = found.get(sample.labels.get("step", ""))
            if step is None:
                continue
            if sample.name.endswith("_bucket"):
                step.buckets[float(sample.labels["le"])] = sample.value
            elif sample.name.endswith("_count"):
                found[sample.labels["step"]] = dataclasses.replace(step, count=sample.value)
            elif sample.name.endswith("_sum"):
                found[sample.labels["step"]] = dataclasses.replace(step, total=sample.value)
    return found


def batch_steps(before: dict[str, Histogram], after: dict[str, Histogram], jobs: int) -> dict[str, Histogram]:
    """Each step of the ``jobs`` a batch ran (each must have been observed once per job: else nothing is said)."""
    steps = {step: after[step].less(before[step]) for step in STEPS}
    wrong = {step: int(h.count) for step, h in steps.items() if h.count != jobs}
    if wrong:
        raise BenchError(f"{METRIC}: {jobs} jobs, but the steps counted {wrong}")
    return steps
