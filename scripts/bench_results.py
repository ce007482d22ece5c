"""The figures of one bench run: each with its n, and the latency samples they were read from."""

from __future__ import annotations

from bench_harness import Stop
from bench_report import Count, quantile
from bench_steps import Histogram


class Results:
    """Every figure with its n (samples, jobs or events it was measured from; a ratio has both sides'),
    and the latency samples in milliseconds. Two threads may add at once (quick mode's cold phase)."""

    def __init__(self) -> None:
        self.figures: dict[str, float] = {}
        self.counts: dict[str, Count] = {}
        self.samples: dict[str, list[float]] = {}

    def put(self, name: str, value: float, n: Count) -> None:
        self.figures[name], self.counts[name] = value, n

    def ratio(self, name: str, top: str, bottom: str) -> None:
        n = [*_flat(self.counts[top]), *_flat(self.counts[bottom])]
        self.put(name, self.figures[top] / self.figures[bottom], n)

    def median_ratio(self, name: str, top: str, bottom: str) -> None:
        """Of two latency samples' medians (whatever name their p50 rows carry: a max of one sample too)."""
        tops, bottoms = self.samples[top], self.samples[bottom]
        self.put(name, quantile(tops, 50) / quantile(bottoms, 50), [len(tops), len(bottoms)])

    def median_difference(self, name: str, top: str, bottom: str) -> None:
        tops, bottoms = self.samples[top], self.samples[bottom]
        self.put(name, quantile(tops, 50) - quantile(bottoms, 50), [len(tops), len(bottoms)])

    def latencies(self, name: str, seconds: list[float]) -> None:
        self.samples[name] = [s * 1000 for s in seconds]

    def stops(self, name: str, measured: list[Stop]) -> None:
        """Cancel latency as the client saw it, and the supervisor's share (kill, reap, confirm) as ``<name>_kill``."""
        self.latencies(name, [http for http, _ in measured])
        self.samples[f"{name}_kill"] = [kill for _, kill in measured]

    def cpu(self, prefix: str, suffix: str, cpu: dict[str, float], n: int, parts: tuple[str, ...]) -> None:
        for part in parts:
            self.put(f"{prefix}_{part}_{suffix}", cpu[part], n)

    def steps(self, prefix: str, steps: dict[str, Histogram], latencies: list[float]) -> None:
        """Each step's median and mean, as the supervisor timed them, and what the client waited beyond them (by
        means): the request in, admission and its commit, the answer out."""
        jobs = len(latencies)
        for step, histogram in steps.items():
            self.put(f"{prefix}_step_{step}_p50_ms", histogram.median() * 1e3, jobs)
            self.put(f"{prefix}_step_{step}_mean_ms", histogram.total / jobs * 1e3, jobs)
        beyond = sum(latencies) - sum(histogram.total for histogram in steps.values())
        self.put(f"{prefix}_step_admission_http_mean_ms", beyond / jobs * 1e3, jobs)


def _flat(n: Count) -> list[int]:
    return n if isinstance(n, list) else [n]
