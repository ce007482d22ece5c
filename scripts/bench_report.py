"""The report: percentiles, targets, the table and the latency plot."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

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
