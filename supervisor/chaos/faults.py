"""The fault menu. Each fault returns whether it happened, confirmed: a kill counts once the signal was
delivered and the process is dead (gone, or a zombie awaiting its parent's reap), a freeze once the
process was seen stopped and then running again, a fill once the disk had no room left."""

from __future__ import annotations

import contextlib
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psutil

from supervisor.chaos.disk import SmallDisk
from supervisor.testing import Server

CONFIRM_SECONDS = 10.0
FREEZE_SECONDS = (0.2, 2.0)
FULL_SECONDS = (0.3, 1.5)


@dataclass
class Record:
    """What the faults did, for the checks and the report."""

    counts: dict[str, int] = field(default_factory=dict)
    killed_pids: set[int] = field(default_factory=set)  # workers we killed: their jobs may fail for it
    full: list[tuple[float, float | None]] = field(default_factory=list)  # monotonic windows of a full disk
    touched: dict[int, str] = field(default_factory=dict)  # pid -> the last fault aimed at it
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, fault: str) -> None:
        with self.lock:
            self.counts[fault] = self.counts.get(fault, 0) + 1

    def aim(self, fault: str, pid: int) -> None:
        with self.lock:
            self.touched[pid] = fault

    def disk_full_during(self, start: float, end: float) -> bool:
        """Whether the disk was (being) filled at any moment of ``start``..``end``."""
        with self.lock:
            return any(begun <= end and (ended is None or ended >= start) for begun, ended in self.full)


def dead(process: psutil.Process, timeout: float = CONFIRM_SECONDS) -> bool:
    """Whether ``process`` died within ``timeout``: gone, or a zombie (dead, not yet reaped)."""

    def gone_or_zombie() -> bool:
        try:
            zombie: bool = process.status() == psutil.STATUS_ZOMBIE  # psutil is untyped
        except psutil.NoSuchProcess:
            return True
        return zombie

    return _until(gone_or_zombie, timeout)


def kill(process: psutil.Process) -> bool:
    """SIGKILL ``process`` (psutil refuses if its pid now names another process) and confirm it died."""
    try:
        process.send_signal(signal.SIGKILL)
    except psutil.NoSuchProcess:
        return False
    return dead(process)


def kill_worker(sup: Server, rng: random.Random, record: Record) -> bool:
    workers = sup.forked_workers()
    if not workers:
        return False
    victim = rng.choice(workers)
    record.aim("worker kill", victim.pid)
    with record.lock:
        record.killed_pids.add(victim.pid)  # before the kill: its job may end before we confirm
    try:
        victim.send_signal(signal.SIGKILL)
    except psutil.NoSuchProcess:  # it ended on its own: its job's outcome is not ours to excuse
        with record.lock:
            record.killed_pids.discard(victim.pid)
        return False
    return dead(victim)


def kill_forkserver(sup: Server, rng: random.Random, record: Record) -> bool:
    forkserver = sup.forkserver()
    if forkserver is None:
        return False
    record.aim("fork server kill", forkserver.pid)
    return kill(forkserver)


def freeze(sup: Server, rng: random.Random, record: Record) -> bool:
    """SIGSTOP the supervisor, hold it, SIGCONT it: what it must survive is being frozen, say by a paused
    container or a stalled VM, and thawing to find its clients and workers moved on."""
    record.aim("freeze", sup.pid)
    try:
        process = psutil.Process(sup.pid)
        process.send_signal(signal.SIGSTOP)
    except psutil.NoSuchProcess:  # it died on its own: the kill that ends the iteration says so
        return False
    try:
        stopped = _until(lambda: process.status() == psutil.STATUS_STOPPED)
        time.sleep(rng.uniform(*FREEZE_SECONDS))  # the fault itself: how long it stays frozen
    finally:
        process.send_signal(signal.SIGCONT)
    return stopped and _until(lambda: process.status() != psutil.STATUS_STOPPED)


def fill_disk(disk: SmallDisk) -> Callable[[Server, random.Random, Record], bool]:
    def fault(sup: Server, rng: random.Random, record: Record) -> bool:
        with record.lock:
            record.full.append((time.monotonic(), None))
            index = len(record.full) - 1
        try:
            full = disk.fill()
            time.sleep(rng.uniform(*FULL_SECONDS))  # the fault itself: how long it stays full
        finally:
            disk.empty()
            with record.lock:
                record.full[index] = (record.full[index][0], time.monotonic())
        return full

    return fault


def _until(predicate: Callable[[], bool], timeout: float = CONFIRM_SECONDS) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(psutil.NoSuchProcess):
            if predicate():
                return True
        time.sleep(0.01)
    return False
