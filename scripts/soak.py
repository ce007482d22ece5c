"""Soak: short jobs, a thousand by default; the supervisor must end as it began.

    scripts/soak [--jobs 1000] [--warmup 5] [--every 100] [--slack 4] [--linearity 0.25] [--clients 1]
                 [--archive-after 0] [--flat 0.25] [--rate 0] [--keep]

Starts a fork-server supervisor (bench registry) on the default settings (``MAX_RETAINED_RUNS`` 2,000 among them:
not the bench's) and runs ``--warmup`` jobs of the ``fast`` crew first, so lazy imports, thread pools and caches
are in place before anything is counted. Then it takes a census of the supervisor (open file descriptors, threads,
live descendants: the fork server and any worker, and zombies, its RSS) and of the journal (bytes on disk with the
WAL, SQLite's own page count, which moves with the data rather than with checkpoints, and the records it holds),
runs ``--jobs`` blocking ``POST /jobs``, ``--clients`` at a time, taking the census every ``--every`` jobs (once
those in flight have ended), and a last one once the last worker is gone.

``--archive-after N`` sets ``ARCHIVE_AFTER_SECONDS`` to N (0: its default, 7 days, which no soak reaches): records
are archived N seconds after they end, so the journal holds about N seconds of jobs and stops growing.

Fails (exit 1) if a job does not complete (a start refused included), if there are fewer than three censuses
(before, between and after: nothing to judge), if fds, threads or live descendants end more than ``--slack`` above
where they began, or if any zombie is left. Without retention, also if the journal's bytes per job in the second
half differ from the first half's by more than ``--linearity`` (a fraction); with it, if the RSS or the journal's
bytes per record it holds end more than ``--flat`` (a fraction) above the first census after the warm-up (twice the
window, by when records are archived as fast as they come), and with ``--rate`` (jobs started per second, paced) its
bytes on disk too: the file holds the window's jobs, so it is flat only where the rate is. Prints the census table
and the verdicts.
"""

from __future__ import annotations

import dataclasses
import sqlite3
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil
from bench_harness import new_id, post_job, start_body
from load_common import Census, census, parse_plan, serving, verdict

PREFORK = 2  # idle workers forked ahead of demand, as a default deployment has
MIN_SAMPLES = 3  # before, between and after: journal growth is judged first half against second half
SETTLE_SECONDS = 30.0  # exits and the refill take milliseconds quiet; a bound that holds beside a burner
# The settings the bench harness changes for its own runs, put back to their defaults: the soak runs on these.
DEFAULTS = {
    "AIP_CREWAI_MAX_RETAINED_RUNS": "2000",
    "AIP_CREWAI_MAX_EVENTS_PER_RUN": "1000",
    "AIP_CREWAI_ALLOWED_OPERATIONS": "run",
}


@dataclasses.dataclass(frozen=True)
class Plan:
    jobs: int = 1000
    warmup: int = 5
    every: int = 100
    slack: int = 4  # fds, threads and descendants may end this far above their start
    linearity: float = 0.25  # bytes per job, second half over first half, may be off by this fraction
    clients: int = 1  # jobs in flight at once, each a blocking POST /jobs of its own
    archive_after: int = 0  # ARCHIVE_AFTER_SECONDS (0: its default, 7 days: nothing is archived during a soak)
    flat: float = 0.25  # with retention, RSS and journal bytes per record may end this fraction above the warm-up's
    rate: float = 0.0  # jobs started per second at most, paced (0: as fast as they complete)


@dataclasses.dataclass(frozen=True)
class Sample:
    jobs: int  # counted jobs completed when it was taken
    seconds: float
    census: Census
    disk_bytes: int  # journal.db + journal.db-wal
    sqlite_bytes: int  # (page_count - freelist_count) * page_size, as a reader sees it
    retained: int = 0  # records in the journal (/health's retained_runs)


@dataclasses.dataclass
class Result:
    samples: list[Sample] = dataclasses.field(default_factory=list)
    violations: list[str] = dataclasses.field(default_factory=list)
    bytes_per_job: tuple[float, float] = (0.0, 0.0)  # first half, second half
    warmed: int = 0  # warm-up jobs completed

    @property
    def before(self) -> Sample:
        return self.samples[0]

    @property
    def after(self) -> Sample:
        return self.samples[-1]


def journal_bytes(path: Path) -> tuple[int, int]:
    disk = sum(p.stat().st_size for p in (path, path.with_name(path.name + "-wal")) if p.exists())
    # A read-only connection of our own, closed at once: it sees the committed WAL without checkpointing it.
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        pages = db.execute("PRAGMA page_count").fetchone()[0] - db.execute("PRAGMA freelist_count").fetchone()[0]
        return disk, pages * db.execute("PRAGMA page_size").fetchone()[0]
    finally:
        db.close()


def settled(pid: int, expected_children: int) -> Census:
    """The census once the workers of finished jobs have exited and the idle pool is refilled (bounded): a
    leak persists, an exit does not. Fewer children is no leak either: the refill runs after each take,
    off the start's path, and beside a burner it was seen not to have forked yet."""
    deadline = time.monotonic() + SETTLE_SECONDS
    while True:
        now = census(pid)
        if (now.children == expected_children and not now.zombies) or time.monotonic() > deadline:
            return now
        time.sleep(0.05)


def soak(plan: Plan, keep: bool = False) -> Result:
    result = Result()
    settings = {**DEFAULTS, "AIP_CREWAI_PREFORK": str(PREFORK)}
    if plan.archive_after:
        settings["AIP_CREWAI_ARCHIVE_AFTER_SECONDS"] = str(plan.archive_after)
    with serving("crew-soak-", settings, keep=keep) as sup:
        clients = [sup.client() for _ in range(plan.clients)]
        pid, journal = sup.pid, sup.state / "journal.db"
        result.warmed = run_jobs(clients, plan.warmup, result, plan.rate)  # pools grow with jobs at once
        for client in clients:  # each client's connection open before the census counts descriptors
            client.get("/health")
        between_jobs = 1 + PREFORK  # the live descendants between jobs: the fork server and its idle workers
        began = time.monotonic()

        def sample(done: int) -> None:
            now = settled(pid, between_jobs)
            retained = clients[0].get("/health").json()["retained_runs"]
            result.samples.append(Sample(done, time.monotonic() - began, now, *journal_bytes(journal), retained))

        try:
            sample(0)
            done = 0
            while done < plan.jobs and not result.violations:
                done += run_jobs(clients, min(plan.every, plan.jobs - done), result, plan.rate)
                sample(done)
        finally:
            for client in clients:
                client.close()
    judge(plan, result)
    return result


def run_jobs(clients: list[httpx.Client], count: int, result: Result, rate: float = 0.0) -> int:
    """Up to ``count`` fast jobs, one in flight per client, the n-th started no sooner than n / ``rate`` seconds in
    (0: at once); how many completed with output (a failure stops the run)."""
    left = iter(range(count))
    taking = threading.Lock()
    began = time.monotonic()

    def one_client(client: httpx.Client) -> int:
        completed = 0
        while not result.violations:
            with taking:
                if (n := next(left, None)) is None:
                    return completed
            if rate:
                time.sleep(max(began + n / rate - time.monotonic(), 0.0))
            try:
                record = post_job(client, start_body("fast", new_id("soak")))
            except Exception as exc:  # any failure ends the soak: its figures would not mean much
                result.violations.append(f"a job failed to run: {type(exc).__name__}: {exc}")
                return completed
            if record.get("raw") is None:
                result.violations.append(f"a job completed without output: {str(record)[:200]}")
                return completed
            completed += 1
        return completed

    with ThreadPoolExecutor(len(clients)) as pool:
        return sum(pool.map(one_client, clients))


def judge(plan: Plan, result: Result) -> None:
    if len(result.samples) < MIN_SAMPLES:
        result.violations.append(
            f"only {len(result.samples)} census sample(s), {MIN_SAMPLES} needed (before, between and after):"
            " no leak or journal growth was judged"
        )
        return
    before, after = result.before.census, result.after.census
    for name in ("fds", "threads", "children"):
        grown = getattr(after, name) - getattr(before, name)
        if grown > plan.slack:
            result.violations.append(f"{name} grew by {grown} over {result.after.jobs} jobs (slack {plan.slack})")
    if after.zombies:
        result.violations.append(f"{after.zombies} zombie(s) left")
    if plan.archive_after:
        judge_flat(plan, result)
        return
    half = min(result.samples, key=lambda s: abs(s.jobs - result.after.jobs / 2))
    if not 0 < half.jobs < result.after.jobs:  # no census between: a failed job (a violation) cut the run short
        return
    first = (half.sqlite_bytes - result.before.sqlite_bytes) / half.jobs
    second = (result.after.sqlite_bytes - half.sqlite_bytes) / (result.after.jobs - half.jobs)
    result.bytes_per_job = (first, second)
    if first <= 0 or abs(second / first - 1) > plan.linearity:
        result.violations.append(f"journal growth is not linear: {first:.0f} then {second:.0f} bytes per job")


def warmed_up(plan: Plan, result: Result) -> Sample | None:
    """The first census twice the window into the run, by when records are archived as fast as they come."""
    return next((s for s in result.samples if s.seconds >= 2 * plan.archive_after and s.jobs), None)


def judge_flat(plan: Plan, result: Result) -> None:
    """With retention: from the warm-up on, the RSS, the journal's bytes per record it holds (its pages in use: the
    file itself keeps the most it ever held) and the file on disk stay within ``flat`` of where they were. Judge the
    file only at a steady rate (``--rate``): it holds the window's jobs, as many as the machine ran in it."""
    warm = warmed_up(plan, result)
    if warm is None or warm is result.after:
        result.violations.append("no census after the warm-up: run more jobs, or a shorter --archive-after")
        return
    after = result.after
    for name, before, now in (
        ("RSS", warm.census.rss_mb, after.census.rss_mb),
        (
            "journal bytes per record",
            warm.sqlite_bytes / max(warm.retained, 1),
            after.sqlite_bytes / max(after.retained, 1),
        ),
        ("journal on disk", warm.disk_bytes, after.disk_bytes),
    ):
        if now > before * (1 + plan.flat) and (plan.rate or name != "journal on disk"):
            result.violations.append(f"{name} grew after the warm-up: {before:,.1f} then {now:,.1f}")


def report(plan: Plan, result: Result) -> str:
    lines = [
        f"soak: {result.after.jobs} of {plan.jobs} fast jobs completed, {plan.clients} at a time,"
        f" after {result.warmed} of {plan.warmup} warm-up jobs",
        f"{'jobs':>6} {'s':>7} {'fds':>5} {'threads':>8} {'children':>9} {'zombies':>8} {'rss MiB':>8}"
        f" {'journal B':>11} {'sqlite B':>11} {'retained':>9}",
    ]
    for s in result.samples:
        c = s.census
        lines.append(
            f"{s.jobs:>6} {s.seconds:>7.1f} {c.fds:>5} {c.threads:>8} {c.children:>9} {c.zombies:>8}"
            f" {c.rss_mb:>8.1f} {s.disk_bytes:>11,} {s.sqlite_bytes:>11,} {s.retained:>9,}"
        )
    if len(result.samples) >= 2:
        b, a = result.before.census, result.after.census
        lines.append("\nbefore -> after")
        for name in ("fds", "threads", "children", "zombies"):
            lines.append(
                f"  {name:<9} {getattr(b, name):>5} -> {getattr(a, name):<5} ({getattr(a, name) - getattr(b, name):+d})"
            )
        lines.append(f"  rss MiB   {b.rss_mb:>5.1f} -> {a.rss_mb:.1f}")
        rate = result.after.jobs / result.after.seconds if result.after.seconds else 0.0
        if plan.archive_after and (warm := warmed_up(plan, result)) is not None:
            lines.append(
                f"  after the warm-up ({warm.jobs} jobs, {warm.seconds:.0f} s) -> the end: RSS {warm.census.rss_mb:.1f}"
                f" -> {a.rss_mb:.1f} MiB, journal on disk {warm.disk_bytes:,} -> {result.after.disk_bytes:,} B,"
                f" {warm.retained:,} -> {result.after.retained:,} records; {rate:.2f} jobs/s"
            )
            return "\n".join(lines + verdict("soak", result.violations))
        first, second = result.bytes_per_job
        lines.append(
            f"  journal   {first:,.0f} then {second:,.0f} bytes per job (first, second half); {rate:.2f} jobs/s"
        )
    return "\n".join(lines + verdict("soak", result.violations))


def main() -> int:
    plan, parser, keep = parse_plan(Plan, __doc__)
    if not 1 <= plan.every < plan.jobs or plan.warmup < 0:  # fewer than MIN_SAMPLES censuses judge nothing
        parser.error("--every must be at least 1 and below --jobs, --warmup at least 0")
    if plan.clients < 1 or plan.archive_after < 0:
        parser.error("--clients must be at least 1, --archive-after at least 0")
    try:
        result = soak(plan, keep)
    except psutil.Error as exc:
        print(f"soak: the supervisor went away: {exc}", file=sys.stderr)
        return 1
    print(report(plan, result))
    return 1 if result.violations else 0


if __name__ == "__main__":
    sys.exit(main())
