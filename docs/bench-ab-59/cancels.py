"""Warm cancels of a streamed ``run``, before and after, alternated sample by sample in one run (issue 59,
docs/benchmarks.md): ``scripts/bench_measure.py``'s own ``cancel_run``, one sample at a time on each of the two
supervisors that ``starts.py`` starts.

usage: python docs/bench-ab-59/cancels.py SAMPLES
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, "/work/wt/int/scripts")
from bench_measure import cancel_run
from starts import clients

WARMUP = 3


def main(samples: int) -> None:
    taken: dict[str, list[float]] = {"before": [], "after": []}
    with clients() as (ca, cb):
        for i in range(samples + WARMUP):
            for name, client in (("before", ca), ("after", cb)):
                _, stops, _ = cancel_run(client, 1, 0)
                if i >= WARMUP:
                    taken[name].append(stops[0][0])
    for name, seconds in taken.items():
        ms = sorted(x * 1000 for x in seconds)
        p50, p90 = statistics.median(ms), ms[int(0.9 * len(ms))]
        print(f"cancel {name}: n={len(ms)} p50={p50:.2f} p90={p90:.2f} mean={statistics.fmean(ms):.2f} ms")


if __name__ == "__main__":
    main(int(sys.argv[1]))
