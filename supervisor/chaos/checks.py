"""The invariants read back after each restart, each broken one a line: every acknowledged admission is
there; nothing is `running` without a worker; a job the crash interrupted is `failed` and uncertain; no
worker from before the restart lives; every job's events are contiguous from 0 and end with exactly one
terminal event; no job started twice; every failure has a fault of ours to explain it; and the journal
passes SQLite's quick_check."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from supervisor.chaos.faults import Record

TERMINAL = ("completed", "failed", "cancelled")
OUR_FAULTS = ("supervisor_restarted", "supervisor_stopped")  # what a supervisor kill ends a job with
# CrewAI's own storage (SQLite under the state directory) failing on the full disk: the crew's outcome, true.
DISK_ERRORS = ("DatabaseOperationError",)


@dataclass
class Findings:
    violations: list[str] = field(default_factory=list)
    interrupted: set[str] = field(default_factory=set)
    orphans: set[str] = field(default_factory=set)
    settled: set[str] = field(default_factory=set)  # terminal when last read: no later restart changes them

    def add(self, problems: list[str]) -> None:
        """Each problem once: the last pass reads every job again."""
        self.violations += [problem for problem in problems if problem not in self.violations]


def all_events(client: httpx.Client, action: str, count: int) -> list[dict[str, Any]]:
    """A job's ``count`` events, page by page (a page is bounded in bytes); fewer if the journal has fewer."""
    events: list[dict[str, Any]] = []
    while len(events) < count:
        page = client.get(f"/jobs/{action}/events", params={"cursor": len(events)}).json()["events"]
        if not page:
            break
        events += page
    return events


def job_problems(action: str, job: dict[str, Any], events: list[dict[str, Any]], record: Record) -> list[str]:
    """What is wrong with one job read back after a restart."""
    problems = []
    names = [event["event"] for event in events]
    if job["status"] == "running":
        problems.append(f"{action} is running after the restart, with no worker")
    if len(events) != job["event_count"]:
        problems.append(f"{action} counts {job['event_count']} events but {len(events)} read back")
    if [event["sequence"] for event in events] != list(range(len(events))):
        problems.append(f"{action} has non-contiguous sequences")
    if sum(name in TERMINAL for name in names) != 1 or not names or names[-1] not in TERMINAL:
        problems.append(f"{action} does not end with exactly one terminal event: {names[-3:]}")
    elif names[-1] != job["status"]:
        problems.append(f"{action} ends with {names[-1]} but its status is {job['status']}")
    if names.count("started") > 1:
        problems.append(f"{action} started more than one worker")
    terminal = events[-1]["data"] if names and names[-1] == "failed" else None
    if terminal is not None:
        if terminal.get("reason") == "supervisor_restarted" and terminal.get("uncertain_outcome") is not True:
            problems.append(f"{action} was interrupted by a crash but is not marked uncertain")
        elif not explained(terminal, record):
            reason, message = terminal.get("reason"), str(terminal.get("message", ""))[:160]
            problems.append(f"{action} failed with no fault of ours to explain it: {reason}: {message!r}")
    return problems


def explained(terminal: dict[str, Any], record: Record) -> bool:
    """A failure we caused: a supervisor kill, a worker we killed, or a crew's storage on the disk we filled."""
    return (
        terminal.get("reason") in OUR_FAULTS
        or terminal.get("pid") in record.killed_pids
        or (bool(record.full) and terminal.get("error_type") in DISK_ERRORS)
    )


def check_restart(
    client: httpx.Client,
    acked: dict[str, dict[str, Any]],
    before: list[tuple[int, float]],
    journal: Path | None,
    record: Record,
    findings: Findings,
    everything: bool = False,
) -> None:
    """After a restart: the workers from before are gone, every acknowledged job not yet settled (all of
    them if ``everything``) reads back whole, the journal (if it is in sight) is intact."""
    for pid, started in before:
        try:
            process = psutil.Process(pid)
            if process.create_time() == started and process.status() != psutil.STATUS_ZOMBIE:
                findings.add([f"process {pid} from before the restart is alive"])
        except psutil.NoSuchProcess:
            pass
    for action in acked:
        if action in findings.settled and not everything:
            continue
        answer = client.get(f"/jobs/{action}")
        if answer.status_code != 200:
            findings.add([f"acknowledged job {action} is missing ({answer.status_code})"])
            continue
        job = answer.json()
        events = all_events(client, action, job["event_count"])
        findings.add(job_problems(action, job, events, record))
        terminal = job.get("terminal") or {}
        if terminal.get("reason") == "supervisor_restarted":
            findings.interrupted.add(action)
            if terminal.get("orphan_killed"):
                findings.orphans.add(action)
        if job["status"] != "running":
            findings.settled.add(action)
    problem = integrity_problem(journal) if journal is not None else None
    if problem:
        findings.add([problem])


def integrity_problem(journal: Path) -> str | None:
    db = sqlite3.connect(f"file:{journal}?mode=ro", uri=True)
    try:
        (result,) = db.execute("PRAGMA quick_check").fetchone()
    finally:
        db.close()
    return None if result == "ok" else f"journal quick_check: {result}"
