"""The state claimed at start: the journal's lock, and in its lock file a record of the supervisors that held the
state (pid, start time, the directories of their jobs' cgroups). A supervisor restarted after a crash reads who
held the state before it and kills what that dead supervisor's jobs left in their cgroups (``fencing``) before it
opens the journal, so that a journal that cannot be opened stops no such kill; the journal's own records kill
the rest.

Only a holder that is gone is read (no process has its pid now, or one that started at another time), and only
its job cgroups (``cgroups.jobs_under``). A job's cgroup lists every process of the job, even one that left its
group or session, and no pid is taken from anywhere else; a pid it listed is killed only once identified and
found still a member (``cgroups.holds``): a pid reused by a stranger is never signalled. A process that took a
gone holder's pid may be a supervisor of another state, which names its directory the same: its jobs' processes
started after it, so only those that started before it are the gone holder's. Whoever holds the lock is the
state's only one: the record keeps it, and of those before it only the gone ones whose cgroups still hold a
process (their kill failed: the next start tries again); a supervisor that stops leaves its own entry only if
its job cgroups still hold a process then.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path

import orjson
import psutil

from supervisor.journal.statefiles import lock
from supervisor.layout import lock_file
from supervisor.processes.cgroups import jobs_under, members_of

log = logging.getLogger("crew_supervisor.jobs")
MAX_RECORD_BYTES = 64 * 1024  # read of the lock file: a few holders' directories
MAX_HOLDERS = 8  # kept in the record: gone ones whose cgroups still hold a process, and us


@dataclasses.dataclass(frozen=True)
class Holder:
    """A supervisor that held the state: its pid, its start time, its directories of job cgroups."""

    pid: int
    started: float
    cgroups: tuple[str, ...]

    def pid_started(self) -> float | None:
        """When the process its pid names now started (None: no process has it); ``started`` while it runs."""
        try:
            started: float = psutil.Process(self.pid).create_time()  # psutil is untyped: its seconds since the epoch
        except psutil.NoSuchProcess:
            return None
        return started

    def jobs(self) -> list[Path]:
        """Its job cgroups, whether it runs or not."""
        return [job for base in self.cgroups for job in jobs_under(Path(base), self.pid)]

    def left(self) -> bool:
        """Whether it is gone and its job cgroups still hold a process."""
        return self.pid_started() != self.started and self.holds_processes()

    def holds_processes(self) -> bool:
        return any(members_of(job) for job in self.jobs())


class Claim:
    """The journal's lock, taken (``JournalLocked`` if another supervisor has it), with who held it before."""

    def __init__(self, journal: Path) -> None:
        self.fd = lock(lock_file(journal))
        try:
            self.before = _read(self.fd)
        except BaseException:
            os.close(self.fd)
            raise
        self._us: Holder | None = None

    def hold(self, cgroups: tuple[str, ...]) -> None:
        """Record us (before any job of ours starts) with the directories our job cgroups go in."""
        self._us = Holder(os.getpid(), psutil.Process().create_time(), cgroups)
        self._write()

    def release(self) -> None:
        """Every job of ours has ended: the record keeps only what could not be killed (ours too: a process left in
        our job cgroups, which the next start kills and fences with the jobs it is left of); the lock goes."""
        if self.fd < 0:
            return
        try:
            if self._us is not None and self._us.holds_processes():
                log.warning("a process is left in this supervisor's job cgroups: the next start on this state kills it")
            else:
                self._us = None
            self._write()
        except OSError as exc:
            log.warning("cannot update the record in the journal's lock file: %s", exc.strerror)
        finally:
            os.close(self.fd)
            self.fd = -1

    def _write(self) -> None:
        """Gone holders whose cgroups still hold a process (the kill failed: the next start tries again), then us."""
        holders = [holder for holder in self.before if holder.left()]
        holders = holders[-(MAX_HOLDERS - 1) :] + ([self._us] if self._us is not None else [])
        record = orjson.dumps([dataclasses.asdict(holder) for holder in holders])
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, record, 0)


def _read(fd: int) -> list[Holder]:
    """The record; an empty lock file (a journal of an earlier version, a clean close) or a malformed one has none."""
    raw = os.pread(fd, MAX_RECORD_BYTES, 0)
    if not raw:
        return []
    try:
        return [
            Holder(int(held["pid"]), float(held["started"]), tuple(str(path) for path in held["cgroups"]))
            for held in orjson.loads(raw)
        ]
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        log.warning("the record in the journal's lock file cannot be read: the journal's records alone are fenced")
        return []
