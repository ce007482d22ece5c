"""Benchmarks: start, cancel, throughput, events, journal cost and memory, warm and cold, offline crews and
crews on CrewAI's own LLM class, tracing off and on, in one run.

    scripts/bench [--quick] [--json bench.json] [--plot docs/bench-latency.png] [--keep]

Starts real supervisors on loopback (registry ``bench_crews:registry``, temporary state, fork server and
spawn launchers side by side) and a loopback OpenAI-compatible provider in a process of its own (for the
crews on CrewAI's own ``LLM``: the openai SDK over HTTP) and an OTLP/HTTP receiver in this process (for the
supervisor that traces), drives them over HTTP with httpx, runs the same crews in this process (the in-process
reference), prints a table and writes every figure to JSON. Each
supervisor and the provider are stopped at the end, whatever happened. ``--quick`` takes few samples; the
full run takes a few minutes. Figures are measured, never asserted: the targets are printed beside them.
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

import httpx
import orjson
import psutil
from bench_harness import (
    JOURNAL_SIZES,
    ROOT,
    BenchError,
    CpuMeter,
    memory,
    populate,
    start_provider,
    start_supervisor,
    wait_ready,
)
from bench_measure import (
    api_throughput,
    api_wave,
    blocking_in_turn,
    cancel_replay,
    cancel_run,
    cancel_stubborn,
    inprocess_kickoffs,
    inprocess_llm_builds,
    inprocess_stream,
    inprocess_wave,
    journal_latency,
    llm_builds,
    start_latency,
    stream_chunks,
)
from bench_report import figure_names, latency_figures, median_of, percentile, plot, table, verdicts
from bench_results import Results
from bench_steps import batch_steps, read_steps

from protocol import CREWAI_SWITCHES, QUIET_CREWAI
from supervisor.console.sse import StreamError
from supervisor.testing import Server
from tests.helpers.otlp_receiver import OtlpReceiver, ReceivedSpan
from worker import tether
from worker.provider import URL_ENV


@dataclasses.dataclass(frozen=True)
class Plan:
    """Samples per measurement (what was asked; the report counts what was measured)."""

    start_warm: int
    cold: int  # each ~5 s: start latency, worker memory and run-cancel latency of one cold job
    cancel_run: int
    cancel_replay: int
    cancel_stubborn: int
    jobs_c1: int
    jobs_c4: int
    inproc: int
    flood_chunks: int  # the CrewAI flood, through the API and in this process
    flood_runs: int
    relay_chunks: int  # the raw relay flood (chunk frames written straight to the event pipe)
    relay_runs: int
    journal: int
    llm_jobs: int  # a two-agent crew on CrewAI's own LLM, blocking, one at a time; as many kickoffs here
    wave: int  # jobs at once, each one 1.5 s provider call (bench_crews.slow_llm); as many threads here
    traced: int  # blocking jobs of each kind (offline, CrewAI's LLM) with tracing off, and as many on, in turn
    warmup: int = 2
    overlap_cold: bool = False  # quick: the cold job runs beside the warm phases (both noisier, ~10 s saved)


QUICK = Plan(
    start_warm=10, cold=1, cancel_run=4, cancel_replay=3, cancel_stubborn=3, jobs_c1=8, jobs_c4=8, inproc=8,
    flood_chunks=2000, flood_runs=1, relay_chunks=20_000, relay_runs=1, journal=3, llm_jobs=8, wave=16, traced=4,
    warmup=1, overlap_cold=True,
)  # fmt: skip
FULL = Plan(
    start_warm=100, cold=5, cancel_run=100, cancel_replay=100, cancel_stubborn=100, jobs_c1=40, jobs_c4=80,
    inproc=40, flood_chunks=20_000, flood_runs=3, relay_chunks=50_000, relay_runs=3, journal=30, llm_jobs=40,
    wave=64, traced=30, warmup=3,
)  # fmt: skip


JOB_CPU_PARTS = ("worker", "supervisor", "forkserver")
# The jobs timed with tracing off and on (the figures' prefix, the crew): the blocking ones measure_warm times.
TRACED_JOBS = (("job", "fast"), ("llm_job", "llm"))
SPANS_SECONDS = 30.0  # for the traced supervisor's last spans to arrive once it stopped (its close exports them)
ACTION = "crew_supervisor.action_id"  # on every span of a job's trace


def boot(plan: Plan, root: Path, markers: Path, otlp: str, supervisors: list[Server]) -> list[Server]:
    """Every supervisor at once (their CrewAI imports overlap), and crewai here for the in-process ceiling.
    ``wide`` admits the whole wave at once; ``traced`` exports each job's trace to ``otlp``."""
    for size in JOURNAL_SIZES[1:]:
        populate(root / f"journal-{size}", size)
    wide = {"AIP_CREWAI_MAX_CONCURRENCY": str(plan.wave)}
    traced = {"OTEL_EXPORTER_OTLP_ENDPOINT": otlp}
    for name, launcher, settings in (
        [
            ("warm", "forkserver", {}),
            ("cold", "spawn", {}),
            ("wide", "forkserver", wide),
            ("unboxed", "forkserver", {"AIP_CREWAI_WORKER_SANDBOX": "off"}),  # what the sandbox costs a start
            ("traced", "forkserver", traced),  # what tracing costs a job, beside warm (no endpoint)
        ]
        + [(f"journal-{size}", "forkserver", {}) for size in JOURNAL_SIZES[1:]]
    ):
        # Listed at once: stopped whatever happens.
        supervisors.append(start_supervisor(name, root, launcher, markers, settings))
    say("importing crewai here too (the in-process ceiling) while the supervisors start")
    # As a worker imports it: the OpenTelemetry SDK off too. Only now, every supervisor started: inherited, it would
    # turn the traced one's tracing off.
    os.environ.update(QUIET_CREWAI)
    import bench_crews  # noqa: F401 - the import is the point: crewai, once, with telemetry off

    wait_ready(supervisors)
    return supervisors


def measure_journal(plan: Plan, supervisors: list[Server], out: Results) -> None:
    say("journal cost: fast job latency with 0, 1,000 and 10,000 retained jobs")
    for size, sup in zip(JOURNAL_SIZES, supervisors, strict=True):
        with sup.client() as client:
            if client.get("/health").json()["retained_runs"] != size:
                raise BenchError(f"{sup.state.name} does not hold {size} jobs")
            out.latencies(f"journal_{size}", journal_latency(client, plan.journal, plan.warmup))
        if size:
            sup.stop()  # a quieter machine for what follows


def measure_floods(plan: Plan, client: httpx.Client, meter: CpuMeter, out: Results) -> None:
    """The raw relay flood (the supervisor's own ceiling), then the CrewAI flood; chunks as counted."""
    for prefix, crew, chunks, runs in (
        ("relay", "relay", plan.relay_chunks, plan.relay_runs),
        ("flood", "flood", plan.flood_chunks, plan.flood_runs),
    ):
        say(f"event throughput: {crew} crew, {runs} x {chunks:,} chunks")
        stream_chunks(client, crew, min(chunks, 1000))  # a first job of this crew in this fork server: not counted
        before = meter.read()
        streams = [stream_chunks(client, crew, chunks) for _ in range(runs)]
        received = sum(s.chunks for s in streams)
        cpu = meter.per(before, received, 1e6)
        out.put(f"{prefix}_chunks", received, len(streams))
        out.put(f"{prefix}_events_per_s", percentile([s.rate for s in streams], 50), received)
        out.put(f"{prefix}_e2e_events_per_s", percentile([s.e2e_rate for s in streams], 50), received)
        out.cpu(f"{prefix}_cpu", "us_per_event", cpu, received, ("supervisor", "worker", "client"))


def measure_warm(plan: Plan, warm: Server, unboxed: Server, markers: Path, out: Results) -> None:
    meter = CpuMeter(warm)
    with warm.client() as client:
        say("start latency, warm, each job in its sandbox and (in turn) without one")
        with unboxed.client() as bare:
            boxed, unsandboxed = start_latency([client, bare], plan.start_warm, plan.warmup)
        unboxed.stop()  # a quieter machine for what follows
        out.latencies("start_warm", boxed)
        out.latencies("start_unsandboxed", unsandboxed)
        say("cancel latency: run (demo-slow mid-stream), replay (blocked), stubborn (ignores SIGTERM)")
        _, cancels, memories = cancel_run(client, plan.cancel_run, measure_memory=min(5, plan.cancel_run))
        out.stops("cancel_run_warm", cancels)
        out.stops("cancel_replay_warm", cancel_replay(client, markers, plan.cancel_replay))
        out.stops("cancel_stubborn_warm", cancel_stubborn(client, markers, plan.cancel_stubborn))
        out.put("worker_uss_warm_mb", median_of(memories, "uss"), len(memories))
        out.put("worker_pss_warm_mb", median_of(memories, "pss"), len(memories))
        measure_floods(plan, client, meter, out)

    say(f"crews on CrewAI's own LLM: {plan.llm_jobs} blocking jobs of a two-agent crew over HTTP to the provider")
    api_throughput(warm, plan.warmup, 1, "llm")
    before, steps = meter.read(), read_steps(warm)
    llm = api_throughput(warm, plan.llm_jobs, 1, "llm")
    cpu = meter.per(before, llm.completed, 1e3)
    out.steps("llm_job", batch_steps(steps, read_steps(warm), llm.completed), llm.latencies)
    out.cpu("llm_job_cpu", "ms", cpu, llm.completed, JOB_CPU_PARTS)
    out.latencies("llm_job_blocking", llm.latencies)
    builds = llm_builds(llm.outputs)
    out.put("llm_build_worker_ms", percentile([wall for wall, _ in builds], 50), len(builds))
    out.put("llm_build_worker_cpu_ms", percentile([cpu for _, cpu in builds], 50), len(builds))

    say("throughput: fast jobs through the API at concurrency 1 and 4")
    api_throughput(warm, plan.warmup, 1)
    before, steps, faults = meter.read(), read_steps(warm), meter.worker_faults()
    c1 = api_throughput(warm, plan.jobs_c1, 1)
    out.cpu("job_cpu", "ms", meter.per(before, c1.completed, 1e3), c1.completed, JOB_CPU_PARTS)
    minor, system = (after - earlier for after, earlier in zip(meter.worker_faults(), faults, strict=True))
    out.put("job_faults_worker", minor / c1.completed, c1.completed)
    out.put("job_cpu_worker_system_ms", system / c1.completed * 1e3, c1.completed)
    out.steps("job", batch_steps(steps, read_steps(warm), c1.completed), c1.latencies)
    c4 = api_throughput(warm, plan.jobs_c4, 4)
    out.put("jobs_per_s_c1", c1.per_second, c1.completed)
    out.put("jobs_per_s_c4", c4.per_second, c4.completed)
    out.latencies("job_blocking", c1.latencies)

    out.put("supervisor_rss_mb", memory(warm.pid)["rss"], 1)
    forkserver = memory(meter.forkserver.pid)
    out.put("forkserver_rss_mb", forkserver["rss"], 1)
    out.put("forkserver_pss_mb", forkserver["pss"], 1)


def measure_tracing(plan: Plan, untraced: Server, traced: Server, receiver: OtlpReceiver, out: Results) -> None:
    """The same blocking jobs one at a time, in turn on a supervisor with no OTLP endpoint and on one exporting each
    job's trace to ``receiver``: latency and CPU per job of each; then the traced one stopped (its close exports
    what its batch still holds) and every traced job's spans counted as they arrived."""
    meters = (CpuMeter(untraced), CpuMeter(traced))
    traced_actions: dict[str, list[str]] = {}
    with untraced.client() as off, traced.client() as on:
        for prefix, crew in TRACED_JOBS:
            say(f"tracing off and on: {plan.traced} blocking {crew} jobs each, one at a time, in turn")
            blocking_in_turn([off, on], crew, plan.warmup)
            before = [meter.read() for meter in meters]
            measured = blocking_in_turn([off, on], crew, plan.traced)
            for side, meter, start, jobs in zip(("untraced", "traced"), meters, before, measured, strict=True):
                out.latencies(f"{prefix}_{side}", [seconds for _, seconds in jobs])
                cpu = meter.per(start, len(jobs), 1e3)
                out.cpu(f"{prefix}_{side}_cpu", "ms", cpu, len(jobs), ("supervisor", "worker"))
            traced_actions[prefix] = [action for action, _ in measured[1]]
    traced.stop()  # and a quieter machine for what follows
    for prefix, actions in traced_actions.items():
        spans = arrived(receiver, actions)
        out.put(f"{prefix}_traced_spans_per_job", len(spans) / len(actions), len(actions))


def arrived(receiver: OtlpReceiver, actions: list[str]) -> list[ReceivedSpan]:
    """The spans the receiver took of these jobs, once each job's root and its worker's kickoff are there (the
    worker's spans came through the supervisor); BenchError if they do not come."""
    wanted = set(actions)

    def every_trace(spans: list[ReceivedSpan]) -> bool:
        seen = {(span.attributes.get(ACTION), span.name) for span in spans}
        return all((action, name) in seen for action in wanted for name in ("job", "kickoff"))

    try:
        spans = receiver.wait_for(every_trace, SPANS_SECONDS)
    except AssertionError as exc:
        raise BenchError(f"tracing on, but not every traced job's spans arrived: {exc}") from None
    return [span for span in spans if span.attributes.get(ACTION) in wanted]


def measure_wave(plan: Plan, wide: Server, out: Results) -> None:
    say(f"{plan.wave} jobs at once, each one 1.5 s provider call, through the API (MAX_CONCURRENCY={plan.wave})")
    api_throughput(wide, plan.warmup, 1, "llm-slow")
    first = api_wave(wide, "llm-slow", plan.wave, sampled=False)  # the first burst finds everything cold
    say("the same wave twice more: timed, then its memory sampled")
    meter = CpuMeter(wide)
    before = meter.read()
    timed = api_wave(wide, "llm-slow", plan.wave, sampled=False)
    out.cpu("llm_wave_cpu", "ms", meter.per(before, timed.jobs, 1e3), timed.jobs, JOB_CPU_PARTS)  # each job ran
    sampled = api_wave(wide, "llm-slow", plan.wave, sampled=True)
    wide.stop()  # a quieter machine for what follows
    out.put("llm_wave_jobs", timed.jobs, timed.jobs)
    failed = sum(wave.jobs - wave.completed for wave in (first, timed, sampled))
    out.put("llm_wave_incomplete", failed, 3 * timed.jobs)
    out.put("llm_wave_first_seconds", first.seconds, first.completed)
    out.put("llm_wave_seconds", timed.seconds, timed.completed)
    out.put("llm_wave_peak_pss_mb", sampled.peak_pss_mb, sampled.samples)
    out.put("llm_wave_workers_max", sampled.most_workers, sampled.samples)
    out.put("llm_wave_worker_pss_mb", sampled.worker_pss_mb, sampled.most_workers)


def measure_inprocess(plan: Plan, out: Results) -> None:
    """The same crews in this process (nothing else of the bench running): the ceilings the API is held to."""
    say(f"in this process: {plan.inproc} fast kickoffs in a loop, then the flood crew streamed {plan.flood_runs} x")
    kickoffs = inprocess_kickoffs(plan.inproc, plan.warmup)
    out.latencies("inproc_kickoff", kickoffs.kickoffs)
    out.put("jobs_per_s_inproc", kickoffs.per_second, len(kickoffs.kickoffs))
    out.put("inproc_cpu_ms", kickoffs.cpu_seconds / len(kickoffs.kickoffs) * 1e3, len(kickoffs.kickoffs))
    out.put("inproc_faults", kickoffs.minor_faults / len(kickoffs.kickoffs), len(kickoffs.kickoffs))
    say(f"in this process: {plan.llm_jobs} kickoffs of the crew on CrewAI's own LLM, then {plan.wave} in threads")
    builds = inprocess_llm_builds(plan.llm_jobs)
    out.put("inproc_llm_build_ms", percentile([wall for wall, _ in builds], 50), len(builds))
    out.put("inproc_llm_build_cpu_ms", percentile([cpu for _, cpu in builds], 50), len(builds))
    llm = inprocess_kickoffs(plan.llm_jobs, plan.warmup, "llm")
    out.latencies("inproc_llm_kickoff", llm.kickoffs)
    out.put("inproc_llm_cpu_ms", llm.cpu_seconds / len(llm.kickoffs) * 1e3, len(llm.kickoffs))
    first = inprocess_wave("llm-slow", plan.wave, sampled=False)  # as through the API: the first is not counted
    cpu = time.process_time()
    timed = inprocess_wave("llm-slow", plan.wave, sampled=False)
    out.put("inproc_wave_cpu_ms", (time.process_time() - cpu) / timed.jobs * 1e3, timed.jobs)
    sampled = inprocess_wave("llm-slow", plan.wave, sampled=True)
    if any(wave.completed < wave.jobs for wave in (first, timed, sampled)):
        raise BenchError(f"in-process kickoffs of {plan.wave} at once failed: the wave's figures would mean nothing")
    out.put("inproc_wave_first_seconds", first.seconds, first.completed)
    out.put("inproc_wave_seconds", timed.seconds, timed.completed)
    out.put("inproc_wave_peak_pss_mb", sampled.peak_pss_mb, sampled.samples)
    inprocess_stream(min(plan.flood_chunks, 1000))  # as through the API: a first flood here is not counted
    streams = [inprocess_stream(plan.flood_chunks) for _ in range(plan.flood_runs)]
    received = sum(s.chunks for s in streams)
    out.put("inproc_stream_chunks", received, len(streams))
    out.put("inproc_stream_events_per_s", percentile([s.rate for s in streams], 50), received)
    out.put("inproc_stream_cpu_us_per_event", sum(s.cpu_seconds for s in streams) / received * 1e6, received)


def measure_cold(plan: Plan, cold: Server, out: Results) -> None:
    say(f"cold: {plan.cold} spawned job(s), about 5 s each")
    with cold.client() as client:
        starts, cancels, memories = cancel_run(client, plan.cold, measure_memory=plan.cold)
    out.latencies("start_cold", starts)
    out.stops("cancel_run_cold", cancels)
    out.put("worker_uss_cold_mb", median_of(memories, "uss"), len(memories))
    out.put("worker_pss_cold_mb", median_of(memories, "pss"), len(memories))


def run(plan: Plan, root: Path, receiver: OtlpReceiver, supervisors: list[Server]) -> Results:
    markers = root / "markers"
    markers.mkdir()
    warm, cold, wide, unboxed, traced, *filled = boot(plan, root, markers, receiver.endpoint, supervisors)
    out = Results()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        beside = pool.submit(measure_cold, plan, cold, out) if plan.overlap_cold else None
        measure_journal(plan, [warm, *filled], out)
        measure_warm(plan, warm, unboxed, markers, out)
        measure_tracing(plan, warm, traced, receiver, out)
        measure_wave(plan, wide, out)
        if beside is None:
            measure_cold(plan, cold, out)
        else:
            beside.result()
    measure_inprocess(plan, out)
    for name, values in out.samples.items():
        for figure, value in latency_figures(name, values).items():
            out.put(figure, value, len(values))
    out.median_ratio("start_cold_over_warm", "start_cold", "start_warm")
    out.median_difference("sandbox_start_cost_ms", "start_warm", "start_unsandboxed")
    out.median_ratio("job_blocking_over_inproc", "job_blocking", "inproc_kickoff")
    out.median_ratio("llm_job_blocking_over_inproc", "llm_job_blocking", "inproc_llm_kickoff")
    for prefix, _ in TRACED_JOBS:
        out.median_ratio(f"{prefix}_traced_over_untraced", f"{prefix}_traced", f"{prefix}_untraced")
    out.ratio("llm_job_cpu_worker_over_inproc", "llm_job_cpu_worker_ms", "inproc_llm_cpu_ms")
    out.ratio("llm_wave_over_inproc", "llm_wave_seconds", "inproc_wave_seconds")
    out.median_ratio("journal_last_over_first", f"journal_{JOURNAL_SIZES[-1]}", f"journal_{JOURNAL_SIZES[0]}")
    out.ratio("c4_over_inproc", "jobs_per_s_c4", "jobs_per_s_inproc")
    out.ratio("job_cpu_worker_over_inproc", "job_cpu_worker_ms", "inproc_cpu_ms")
    out.ratio("flood_over_inproc_stream", "flood_events_per_s", "inproc_stream_events_per_s")
    names = figure_names({name: len(values) for name, values in out.samples.items()})
    missing = [name for name in names if not math.isfinite(out.figures.get(name, math.nan))]
    if missing:
        raise BenchError(f"figures not measured: {', '.join(missing)}")
    out.figures = {name: out.figures[name] for name in names}
    out.counts = {name: out.counts[name] for name in names}
    return out


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
    # Tracing only where the bench turns it on: an OTLP endpoint in the caller's shell would trace every supervisor.
    for name in [name for name in os.environ if name.startswith("OTEL_")]:
        del os.environ[name]
    root = Path(tempfile.mkdtemp(prefix="crew-bench-"))
    provider, url = start_provider(root / "provider.log")
    # Before crewai is imported here (``boot``): CrewAI's switches off, and its files under the temporary directory.
    # The provider's URL reaches the supervisors' workers through their environment, as the in-process crews' through
    # this one.
    os.environ.update(CREWAI_SWITCHES, HOME=str(root / "home"), CREWAI_STORAGE_DIR=str(root / "inproc-storage"))
    os.environ[URL_ENV] = url
    tether.quiet_crewai_logs()  # as a worker does: the in-process crews pay no warning a call a worker does not
    (root / "home").mkdir()
    supervisors: list[Server] = []
    try:
        # Stopped after the supervisors: the traced one exports what it still holds as it stops.
        with OtlpReceiver() as receiver:
            try:
                results = run(plan, root, receiver, supervisors)
            finally:
                for sup in supervisors:
                    sup.stop()
                provider.terminate()
                provider.wait(30)
        report(args, results, meta(plan, began, loadavg))  # before the cleanup: matplotlib caches in HOME
    except (BenchError, StreamError) as exc:  # a stream that is not this server's events, too
        print(f"bench: {exc}", file=sys.stderr)
        return 1
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    return 0


def report(args: argparse.Namespace, results: Results, about: dict[str, Any]) -> None:
    sample_counts = {name: len(values) for name, values in results.samples.items()}
    checks = verdicts(results.figures, results.counts, sample_counts)
    document = {
        "meta": about,
        "figures": results.figures,
        "n": results.counts,
        "targets": checks,
        "samples_ms": results.samples,
    }
    args.json.write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2))
    print(table(results.figures, results.counts, checks))
    print(f"\n{sum(r['met'] for r in checks)} of {len(checks)} targets met; figures in {args.json}")
    if args.plot is not None:
        plot(results.samples, args.plot)
        print(f"plot in {args.plot}")


if __name__ == "__main__":
    sys.exit(main())
