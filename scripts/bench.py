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
import dataclasses
import datetime
import importlib.metadata
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
import psutil
from bench_harness import (
    JOURNAL_SIZES,
    ROOT,
    BenchError,
    CpuMeter,
    Stop,
    memory,
    populate,
    start_supervisor,
    wait_ready,
)
from bench_measure import (
    api_throughput,
    cancel_replay,
    cancel_run,
    cancel_stubborn,
    flood,
    inprocess_throughput,
    journal_latency,
    start_latency,
)
from bench_report import FIGURES, median_of, percentile, plot, table, verdicts

from protocol import QUIET_CREWAI
from supervisor.testing import Server


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


Figures = dict[str, float]
Samples = dict[str, list[float]]


def boot(plan: Plan, root: Path, markers: Path, supervisors: list[Server]) -> list[Server]:
    """Every supervisor at once (their CrewAI imports overlap), and crewai here for the in-process ceiling."""
    for size in JOURNAL_SIZES[1:]:
        populate(root / f"journal-{size}", size)
    for name, launcher in [("warm", "forkserver"), ("cold", "spawn")] + [
        (f"journal-{size}", "forkserver") for size in JOURNAL_SIZES[1:]
    ]:
        supervisors.append(start_supervisor(name, root, launcher, markers))  # listed at once: stopped whatever happens
    say("importing crewai here too (the in-process ceiling) while the supervisors start")
    import bench_crews  # noqa: F401 - the import is the point: crewai, once, with telemetry off

    wait_ready(supervisors)
    return supervisors


def measure_journal(plan: Plan, supervisors: list[Server], figures: Figures) -> None:
    say("journal cost: fast job latency with 0, 1,000 and 10,000 retained jobs")
    p50 = []
    for size, sup in zip(JOURNAL_SIZES, supervisors, strict=True):
        with sup.client() as client:
            if client.get("/health").json()["retained_runs"] != size:
                raise BenchError(f"{sup.state.name} does not hold {size} jobs")
            p50.append(percentile(journal_latency(client, plan.journal, plan.warmup), 50) * 1000)
            figures[f"journal_{size}_p50_ms"] = p50[-1]
        if size:
            sup.stop()  # a quieter machine for what follows
    figures["journal_last_over_first"] = p50[-1] / p50[0]


def measure_warm(plan: Plan, warm: Server, markers: Path, figures: Figures, ms: Samples) -> None:
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

    figures["supervisor_rss_mb"] = memory(warm.pid)["rss"]
    forkserver = memory(meter.forkserver.pid)
    figures["forkserver_rss_mb"], figures["forkserver_pss_mb"] = forkserver["rss"], forkserver["pss"]


def measure_cold(plan: Plan, cold: Server, figures: Figures, ms: Samples) -> None:
    say(f"cold: {plan.cold} spawned job(s), about 5 s each")
    with cold.client() as client:
        starts, cancels, memories = cancel_run(client, plan.cold, measure_memory=plan.cold)
    ms["start_cold"] = scaled(starts)
    stops(ms, "cancel_run_cold", cancels)
    figures["worker_uss_cold_mb"] = median_of(memories, "uss")
    figures["worker_pss_cold_mb"] = median_of(memories, "pss")


def run(plan: Plan, root: Path, supervisors: list[Server]) -> tuple[Figures, Samples]:
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
    os.environ.update(QUIET_CREWAI, HOME=str(root / "home"), CREWAI_STORAGE_DIR=str(root / "inproc-storage"))
    (root / "home").mkdir()
    supervisors: list[Server] = []
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
