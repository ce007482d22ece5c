"""Soak: a thousand short jobs one after another; the supervisor must end as it began.

    scripts/soak [--jobs 1000] [--warmup 5] [--every 100] [--slack 4] [--linearity 0.25] [--keep]

Starts a fork-server supervisor (bench registry) and runs ``--warmup`` jobs of the ``fast`` crew first, so
lazy imports, thread pools and caches are in place before anything is counted. Then it takes a census of
the supervisor (open file descriptors, threads, live descendants: the fork server and any worker, and
zombies) and of the journal (bytes on disk with the WAL, and SQLite's own page count, which moves with
the data rather than with checkpoints), runs ``--jobs`` blocking ``POST /jobs`` one at a time, taking the
census every ``--every`` jobs, and a last one once the last worker is gone.

Fails (exit 1) if a job does not complete, if there are fewer than three censuses (before, between and
after: nothing to judge), if fds, threads or live descendants end more than ``--slack`` above where they
began, if any zombie is left, or if the journal's bytes per job in the second half differ from the first
half's by more than ``--linearity`` (a fraction). Prints the census table and the verdicts.
"""

from __future__ import annotations

import dataclasses
import sqlite3
import sys
import time
from pathlib import Path

import httpx
import psutil
from bench_harness import new_id, post_job, start_body
from load_common import Census, census, parse_plan, serving, verdict

PREFORK = 2  # idle workers forked ahead of demand, as a default deployment has
MIN_SAMPLES = 3  # before, between and after: journal growth is judged first half against second half
SETTLE_SECONDS = 30.0  # exits and the refill take milliseconds quiet; a bound that holds beside a burner


@dataclasses.dataclass(frozen=True)
class Plan:
    jobs: int = 1000
    warmup: int = 5
    every: int = 100
    slack: int = 4  # fds, threads and descendants may end this far above their start
    linearity: float = 0.25  # bytes per job, second half over first half, may be off by this fraction


@dataclasses.dataclass(frozen=True)
class Sample:
    jobs: int  # counted jobs completed when it was taken
    seconds: float
    census: Census
    disk_bytes: int  # journal.db + journal.db-wal
    sqlite_bytes: int  # page_count * page_size, as a reader sees it


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
    with serving("crew-soak-", {"AIP_CREWAI_PREFORK": str(PREFORK)}, keep=keep) as sup, sup.client() as client:
        pid, journal = sup.pid, sup.state / "journal.db"
        result.warmed = run_jobs(client, plan.warmup, result)
        between_jobs = 1 + PREFORK  # the live descendants between jobs: the fork server and its idle workers
        began = time.monotonic()

        def sample(done: int) -> None:
            now = settled(pid, between_jobs)
            result.samples.append(Sample(done, time.monotonic() - began, now, *journal_bytes(journal)))

        sample(0)
        done = 0
        while done < plan.jobs and not result.violations:
            done += run_jobs(client, min(plan.every, plan.jobs - done), result)
            sample(done)
    judge(plan, result)
    return result


def run_jobs(client: httpx.Client, count: int, result: Result) -> int:
    """Up to ``count`` fast jobs, one at a time; how many completed with output (a failure stops the run)."""
    for completed in range(count):
        try:
            record = post_job(client, start_body("fast", new_id("soak")))
        except Exception as exc:  # any failure ends the soak: its figures would not mean much
            result.violations.append(f"a job failed to run: {type(exc).__name__}: {exc}")
            return completed
        if record.get("raw") is None:
            result.violations.append(f"a job completed without output: {str(record)[:200]}")
            return completed
    return count


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
    half = min(result.samples, key=lambda s: abs(s.jobs - result.after.jobs / 2))
    if not 0 < half.jobs < result.after.jobs:  # no census between: a failed job (a violation) cut the run short
        return
    first = (half.sqlite_bytes - result.before.sqlite_bytes) / half.jobs
    second = (result.after.sqlite_bytes - half.sqlite_bytes) / (result.after.jobs - half.jobs)
    result.bytes_per_job = (first, second)
    if first <= 0 or abs(second / first - 1) > plan.linearity:
        result.violations.append(f"journal growth is not linear: {first:.0f} then {second:.0f} bytes per job")


def report(plan: Plan, result: Result) -> str:
    lines = [
        f"soak: {result.after.jobs} of {plan.jobs} sequential fast jobs completed,"
        f" after {result.warmed} of {plan.warmup} warm-up jobs",
        f"{'jobs':>6} {'s':>7} {'fds':>5} {'threads':>8} {'children':>9} {'zombies':>8} {'rss MiB':>8}"
        f" {'journal B':>11} {'sqlite B':>11}",
    ]
    for s in result.samples:
        c = s.census
        lines.append(
            f"{s.jobs:>6} {s.seconds:>7.1f} {c.fds:>5} {c.threads:>8} {c.children:>9} {c.zombies:>8}"
            f" {c.rss_mb:>8.1f} {s.disk_bytes:>11,} {s.sqlite_bytes:>11,}"
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
        first, second = result.bytes_per_job
        lines.append(
            f"  journal   {first:,.0f} then {second:,.0f} bytes per job (first, second half); {rate:.2f} jobs/s"
        )
    return "\n".join(lines + verdict("soak", result.violations))


def main() -> int:
    plan, parser, keep = parse_plan(Plan, __doc__)
    if not 1 <= plan.every < plan.jobs or plan.warmup < 0:  # fewer than MIN_SAMPLES censuses judge nothing
        parser.error("--every must be at least 1 and below --jobs, --warmup at least 0")
    try:
        result = soak(plan, keep)
    except psutil.Error as exc:
        print(f"soak: the supervisor went away: {exc}", file=sys.stderr)
        return 1
    print(report(plan, result))
    return 1 if result.violations else 0


if __name__ == "__main__":
    sys.exit(main())
