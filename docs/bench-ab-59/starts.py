"""Warm starts and blocking jobs, before and after, alternated sample by sample in one run (issue 59,
docs/benchmarks.md): ``scripts/bench_measure.py``'s own ``start_latency`` against two supervisors, each tree on its
own interpreter (worktrees of the two commits at /work/wt/before and /work/wt/int, each with its .venv).

usage: python docs/bench-ab-59/starts.py SAMPLES
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

sys.path.insert(0, "/work/wt/int/scripts")
from bench_measure import new_id, post_job, start_body, start_latency

from supervisor import testing


def server(tree: str, root: Path, markers: Path) -> testing.Server:
    """A supervisor of ``tree`` on the bench registry, started as the bench starts its own."""
    return testing.start(
        root / tree,
        "bench_crews:registry",
        env={
            "BENCH_MARKER_DIR": str(markers),
            "AIP_CREWAI_WORKER_WRITABLE": str(markers),
            "PYTHONPATH": f"/work/wt/{tree}:/work/wt/{tree}/scripts",
        },
        args=["--log-level", "warning"],
        log=root / f"{tree}.log",
        cwd=Path(f"/work/wt/{tree}"),
        python=f"/work/wt/{tree}/.venv/bin/python",
        allowed_operations="run,replay",
    )


def report(name: str, seconds: list[float]) -> None:
    ms = sorted(x * 1000 for x in seconds)
    p50, p90, p99 = statistics.median(ms), ms[int(0.9 * len(ms))], ms[int(0.99 * len(ms))]
    print(f"{name}: n={len(ms)} p50={p50:.2f} p90={p90:.2f} p99={p99:.2f} mean={statistics.fmean(ms):.2f} ms")


@contextlib.contextmanager
def clients() -> Iterator[tuple[httpx.Client, httpx.Client]]:
    """A client of each tree's supervisor (before's, after's), started side by side in a state of their own."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        markers = root / "markers"
        markers.mkdir()
        with (
            server("before", root, markers) as a,
            server("int", root, markers) as b,
            a.client() as before,
            b.client() as after,
        ):
            yield before, after


def main(samples: int) -> None:
    blocking: dict[str, list[float]] = {"before": [], "after": []}
    with clients() as (ca, cb):
        before, after = start_latency([ca, cb], samples, 10)
        for i in range(samples + 5):
            for name, client in (("before", ca), ("after", cb)):
                action = new_id("blk")
                began = time.perf_counter()
                post_job(client, start_body("fast", action))
                if i >= 5:
                    blocking[name].append(time.perf_counter() - began)
    report("start before", before)
    report("start after", after)
    for name, seconds in blocking.items():
        report(f"blocking {name}", seconds)


if __name__ == "__main__":
    main(int(sys.argv[1]))
