"""Shortened load and soak runs (scripts/load.py, scripts/soak.py) asserting their invariants.

The full runs (32 jobs x 200 followers, 1,000 jobs) are documented in docs/load-and-soak.md; these keep the
same checks at a size CI can afford. The checkers themselves are also tested, so a run that passes means
the invariants held, not that nothing was checked.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))  # scripts/ is not a package
import load
import soak
from load_common import Census


def test_load_every_follower_and_reader_gets_every_event_once_in_order() -> None:
    plan = load.Plan(jobs=8, followers=40, spread=1.5)
    result = load.load(plan)
    assert result.violations == []
    assert result.planned == result.completed == 8 and result.failed == 0
    figures = result.figures()
    assert all(math.isfinite(value) and value > 0 for value in figures.values()), figures
    assert len(result.latencies["follow"]) == 40 and len(result.latencies["start"]) == 8
    assert result.delivered >= result.events * (1 + 40 / 8 + 1)  # starter, followers, reader per job


def test_soak_of_200_jobs_leaks_nothing_and_grows_the_journal_linearly() -> None:
    result = soak.soak(soak.Plan(jobs=200, every=50))
    assert result.violations == [], soak.report(soak.Plan(jobs=200, every=50), result)
    assert [s.jobs for s in result.samples] == [0, 50, 100, 150, 200] and result.warmed == 5
    before, after = result.before.census, result.after.census
    assert after.zombies == 0 and after.children == before.children == 1 + soak.PREFORK  # fork server, idle pool
    assert after.fds - before.fds <= 4 and after.threads - before.threads <= 4
    assert all(rate > 0 for rate in result.bytes_per_job)


def _job(events: list[dict[str, Any]], followed: list[list[dict[str, Any]]]) -> load.Job:
    job = load.Job.__new__(load.Job)  # no event loop needed: only the received events matter here
    job.action, job.started, job.followed, job.read = "a", events, followed, [events]
    return job


def _events(*names: str) -> list[dict[str, Any]]:
    return [{"event": name, "sequence": i, "data": {}} for i, name in enumerate(names)]


@pytest.mark.parametrize(
    ("started", "followed", "wrong"),
    [
        (_events("started", "chunk", "completed"), _events("started", "chunk", "completed"), None),
        (_events("started", "chunk", "completed"), _events("started", "chunk", "chunk", "completed"), "a follower"),
        (_events("started", "chunk", "completed"), _events("started", "completed"), "a follower"),
        (_events("started", "completed", "chunk"), _events("started", "completed", "chunk"), "terminal events"),
        (_events("started", "failed"), _events("started", "failed"), "ended failed"),
    ],
)
def test_load_check_catches_a_broken_stream(
    started: list[dict[str, Any]], followed: list[dict[str, Any]], wrong: str | None
) -> None:
    result = load.Result()
    # The record as the server keeps it: a completed job's output is its completed event's data.
    record = {"status": started[-1]["event"], "event_count": len(started), "output": started[-1]["data"]}
    load.check(_job(started, [followed]), record, load.Plan(readers=1), result)
    if wrong is None:
        assert result.violations == []
    else:
        assert any(wrong in v for v in result.violations), result.violations


def _sample(jobs: int, fds: int, sqlite_bytes: int, zombies: int = 0) -> soak.Sample:
    return soak.Sample(jobs, float(jobs), Census(fds, 5, 1, zombies, 50.0), sqlite_bytes, sqlite_bytes)


def test_soak_judge_catches_a_leak_and_nonlinear_growth() -> None:
    plan = soak.Plan(jobs=200)
    steady = soak.Result(samples=[_sample(0, 20, 0), _sample(100, 21, 900_000), _sample(200, 22, 1_800_000)])
    soak.judge(plan, steady)
    assert steady.violations == []
    leaky = soak.Result(samples=[_sample(0, 20, 0), _sample(100, 120, 900_000), _sample(200, 220, 1_800_000, 1)])
    soak.judge(plan, leaky)
    assert any("fds grew by 200" in v for v in leaky.violations)
    assert any("zombie" in v for v in leaky.violations)
    bloating = soak.Result(samples=[_sample(0, 20, 0), _sample(100, 20, 900_000), _sample(200, 20, 3_000_000)])
    soak.judge(plan, bloating)
    assert any("not linear" in v for v in bloating.violations)


def test_load_counts_completed_jobs_from_the_answers_and_divides_by_them() -> None:
    answers = [_events("started", "completed"), _events("started", "failed"), [], _events("started", "completed")]
    assert [load.ended_completed(events) for events in answers] == [True, False, False, True]
    result = load.Result(planned=8, completed=6, events=60, delivered=120, seconds=4.0, job_seconds=2.0)
    assert result.failed == 2
    assert result.figures()["jobs_per_s"] == 3.0  # 6 completed in 2 s, not the 8 planned
    result.latencies["start"] = [0.001 * i for i in range(1, 9)]
    text = load.report(load.Plan(jobs=8), result)
    assert "jobs: 8 planned, 6 completed, 2 failed" in text and "3.00 completed jobs/s" in text
    # Eight start latencies are too few for a p99: the maximum, said as such; no requests, no figure.
    assert "POST /jobs/stream to headers   p50 of 8: 4.5 ms   max of 8: 8.0 ms" in text
    assert "SSE GET to headers             none measured" in text
    assert "p99" not in text


def test_soak_with_fewer_than_three_samples_fails_instead_of_judging_nothing() -> None:
    two = soak.Result(samples=[_sample(0, 20, 0), _sample(200, 20, 1_800_000)])
    soak.judge(soak.Plan(jobs=200, every=200), two)
    assert two.violations == [
        "only 2 census sample(s), 3 needed (before, between and after): no leak or journal growth was judged"
    ]
    assert soak.report(soak.Plan(jobs=200, every=200), two).endswith("soak: 1 violation(s)")


def test_soak_counts_the_jobs_that_completed_not_the_batch_it_asked_for() -> None:
    answers = iter([200, 200, 500])

    def answer(request: httpx.Request) -> httpx.Response:
        status = next(answers)
        return httpx.Response(status, json={"raw": "done"} if status == 200 else {"detail": "no"})

    result = soak.Result()
    with httpx.Client(transport=httpx.MockTransport(answer), base_url="http://soak") as client:
        assert soak.run_jobs([client], 5, result) == 2
    assert len(result.violations) == 1 and "answered 500" in result.violations[0]


def _at(seconds: int, rss_mb: float, disk_bytes: int, retained: int, per_record: int = 6000) -> soak.Sample:
    census = Census(20, 5, 1, 0, rss_mb)
    return soak.Sample(seconds * 10, float(seconds), census, disk_bytes, retained * per_record, retained)


def test_soak_judge_with_retention_wants_rss_and_journal_flat_after_the_warm_up() -> None:
    plan = soak.Plan(jobs=400, archive_after=10)
    # The file on disk follows the records a faster machine held: judged only at a paced rate.
    flat = soak.Result(samples=[_at(0, 60, 10**6, 5), _at(20, 64, 5 * 10**6, 500), _at(40, 66, 9 * 10**6, 900)])
    soak.judge(plan, flat)
    assert flat.violations == []  # growth before the warm-up (twice the window) is not judged
    soak.judge(soak.Plan(jobs=400, archive_after=10, rate=8), flat)
    assert [v.split(":")[0] for v in flat.violations] == ["journal on disk grew after the warm-up"]
    growing = soak.Result(
        samples=[_at(0, 60, 10**6, 5), _at(20, 64, 5 * 10**6, 500), _at(40, 90, 5 * 10**6, 500, 9000)]
    )
    soak.judge(plan, growing)
    assert [v.split(":")[0] for v in growing.violations] == [
        "RSS grew after the warm-up",
        "journal bytes per record grew after the warm-up",
    ]
    short = soak.Result(samples=[_at(0, 60, 10**6, 5), _at(10, 60, 10**6, 5), _at(20, 60, 10**6, 5)])
    soak.judge(plan, short)
    assert short.violations == ["no census after the warm-up: run more jobs, or a shorter --archive-after"]
