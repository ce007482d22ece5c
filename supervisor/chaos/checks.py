"""The invariants read back after each restart, each broken one a line: every acknowledged admission is
there; nothing is `running` without a worker; a job the crash interrupted is `failed` and uncertain; no
worker from before the restart lives; every job's events are contiguous from 0 and end with exactly one
terminal event; no job started twice; every failure has a fault of ours to explain it, or is the crew's own; every
ended job's effect ledger holds no call still `running` (each one cut off is `uncertain`) and loses no entry; and
the journal passes SQLite's quick_check."""

from __future__ import annotations

import contextlib
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from protocol import BEFORE_CREW_REASONS, WORKER_REASONS, EffectStatus, Reason
from supervisor.chaos.faults import Record
from supervisor.enums import TERMINAL_EVENTS, EventName, Status

OUR_FAULTS = (Reason.SUPERVISOR_RESTARTED, Reason.SUPERVISOR_STOPPED)  # what a supervisor kill ends a job with
# A failure the crew decided (a reason its worker gives once the crew's code runs: it raised, its factory did,
# CrewAI's storage failed on the disk we filled) or caused (processes it left running, with STRAY_PROCESSES=fail): the
# crew's outcome, counted apart, never a violation of ours. A worker's reason found before the crew runs (its
# registry, its sandbox) is no crew's: it stays a violation.
CREWS_OWN = (WORKER_REASONS - BEFORE_CREW_REASONS) | {Reason.STRAY_PROCESSES}


@dataclass(frozen=True)
class Seen:
    """A process of the supervisor's tree as it was just before the kill: enough to say what it was."""

    pid: int
    started: float
    parent: int
    name: str
    command: str

    @classmethod
    def of(cls, process: psutil.Process) -> Seen:
        with process.oneshot():
            command = " ".join(process.cmdline())
            return cls(process.pid, process.create_time(), process.ppid(), process.name(), command[:160])


@dataclass
class Findings:
    violations: list[str] = field(default_factory=list)
    interrupted: set[str] = field(default_factory=set)
    orphans: set[str] = field(default_factory=set)
    crews_own: set[str] = field(default_factory=set)  # failed as their crew decided or caused (``CREWS_OWN``)
    left_running: set[str] = field(default_factory=set)  # their worker left processes running (killed, named)
    settled: set[str] = field(default_factory=set)  # terminal when last read: no later restart changes them
    resumed: dict[str, str] = field(default_factory=dict)  # effects jobs looked at: the job resuming each ("": none)

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
    if job["status"] == Status.RUNNING:
        problems.append(f"{action} is running after the restart, with no worker")
    if len(events) != job["event_count"]:
        problems.append(f"{action} counts {job['event_count']} events but {len(events)} read back")
    if [event["sequence"] for event in events] != list(range(len(events))):
        problems.append(f"{action} has non-contiguous sequences")
    if sum(name in TERMINAL_EVENTS for name in names) != 1 or not names or names[-1] not in TERMINAL_EVENTS:
        problems.append(f"{action} does not end with exactly one terminal event: {names[-3:]}")
    elif names[-1] != job["status"]:
        problems.append(f"{action} ends with {names[-1]} but its status is {job['status']}")
    if names.count(EventName.STARTED) > 1:
        problems.append(f"{action} started more than one worker")
    terminal = events[-1]["data"] if names and names[-1] == Status.FAILED else None
    if terminal is not None:
        if terminal.get("reason") == Reason.SUPERVISOR_RESTARTED and terminal.get("uncertain_outcome") is not True:
            problems.append(f"{action} was interrupted by a crash but is not marked uncertain")
        elif not explained(terminal, record):
            reason, message = terminal.get("reason"), str(terminal.get("message", ""))[:160]
            problems.append(f"{action} failed with no fault of ours to explain it: {reason}: {message!r}")
    return problems


def ledger_problems(action: str, ledger: dict[str, Any], own_tasks: int | None = None) -> list[str]:
    """What is wrong with an ended job's effect ledger: a call still ``running`` (the commit that ended the job, or
    fencing's, makes each ``uncertain``), or an entry lost: its calls and completed tasks share one count from 1, so
    every id up to its last call's is a call or one of its ``own_tasks`` (by default all it counts)."""
    effects = ledger["effects"]
    running = [entry for entry in effects if entry["status"] == EffectStatus.RUNNING][:1]  # one line says it
    problems = [f"{action}'s call {e['id']} ({e['name']}) still runs in its ended job's ledger" for e in running]
    ids = [entry["id"] for entry in effects]
    tasks = ledger["tasks_completed"] if own_tasks is None else own_tasks
    if ids != sorted(set(ids)) or (ids and (ids[0] < 1 or ids[-1] - len(ids) > tasks)):
        problems.append(f"{action}'s ledger lost entries: calls {ids[:20]} beside {tasks} completed task(s)")
    return problems


def explained(terminal: dict[str, Any], record: Record) -> bool:
    """A failure we caused (a supervisor kill, a worker we killed) or the crew's own (``CREWS_OWN``)."""
    return (
        terminal.get("reason") in OUR_FAULTS
        or terminal.get("pid") in record.killed_pids
        or terminal.get("reason") in CREWS_OWN
    )


def check_restart(
    client: httpx.Client,
    acked: dict[str, dict[str, Any]],
    before: list[Seen],
    journal: Path | None,
    record: Record,
    findings: Findings,
    everything: bool = False,
) -> None:
    """After a restart: the workers from before are gone, every acknowledged job not yet settled (all of
    them if ``everything``) reads back whole, the journal (if it is in sight) is intact."""
    for seen in before:
        with contextlib.suppress(psutil.NoSuchProcess):
            process = psutil.Process(seen.pid)
            if process.create_time() == seen.started and (status := process.status()) != psutil.STATUS_ZOMBIE:
                findings.add([survivor(seen, process, status, before, record)])
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
        if job["status"] != Status.RUNNING:
            findings.add(ledger_problems(action, client.get(f"/jobs/{action}/effects").json()))
        terminal = job.get("terminal") or {}
        if job["status"] == Status.FAILED and terminal.get("reason") in CREWS_OWN:
            findings.crews_own.add(action)
        if job.get("leftovers"):
            findings.left_running.add(action)
        if terminal.get("reason") == Reason.SUPERVISOR_RESTARTED:
            findings.interrupted.add(action)
            if terminal.get("orphan_killed"):
                findings.orphans.add(action)
        if job["status"] != Status.RUNNING:
            findings.settled.add(action)
    problem = integrity_problem(journal) if journal is not None else None
    if problem:
        findings.add([problem])


def survivor(seen: Seen, process: psutil.Process, status: str, before: list[Seen], record: Record) -> str:
    """The line for a process of the old tree alive after the restart: what it was and is, and the fault
    that last touched it or a process above it, so the next occurrence explains itself."""
    parents = {other.pid: other.parent for other in before}
    line, pid = [seen.pid], seen.parent
    while pid in parents:  # up to the supervisor, the one process of the tree that is no child
        line.append(pid)
        pid = parents[pid]
    line.append(pid)
    with record.lock:
        touched = next((f"{record.touched[p]} of {p}" for p in line if p in record.touched), "none")
    now: int | str = "unknown"
    with contextlib.suppress(psutil.Error):
        now = process.ppid()
    return (
        f"process {seen.pid} from before the restart is alive: {seen.name} ({seen.command}), "
        f"{status}, parent {seen.parent} then, {now} now; last fault on its tree: {touched}"
    )


def integrity_problem(journal: Path) -> str | None:
    db = sqlite3.connect(f"file:{journal}?mode=ro", uri=True)
    try:
        (result,) = db.execute("PRAGMA quick_check").fetchone()
    finally:
        db.close()
    return None if result == "ok" else f"journal quick_check: {result}"
