"""Per-job limits, enforced from the supervisor's side so a job cannot opt out.

A pids and a memory cgroup (where they can be made) are joined from here before a worker is given its job. The
rlimits (open files, address space, file size, and a CPU backstop from the job's start: ``rlimits``) are the
supervisor's values, which each worker process sets on itself before any crew code runs: the kernel lets a
process lower its own, but lets ``prlimit`` reach another only with its uid or CAP_SYS_RESOURCE, which a root
supervisor with WORKER_USER may lack (Docker's default set does). Hard and soft alike, so no job raises them back.
A sampler measures every worker's whole tree each period and names the limit a job broke.

Each worker's processes are its ``Containment`` (``containment.py``, the worker's ``containment``): its cgroups,
the samples and every descendant they saw. The limits give it its cgroups in ``apply`` and remove them in
``release``; whoever kills the worker has it kill everything else of the job.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import Callable
from typing import Any

from protocol import Reason
from supervisor.config import Settings
from supervisor.processes.cgroups import CPU, MEMORY, PIDS, Cgroups
from supervisor.processes.containment import Boundary, ProcessTable
from supervisor.processes.held import MAX_DESCRIPTORS
from supervisor.processes.places import MAX_NEW_ENTRIES, Places, Reading
from supervisor.processes.process import WorkerProcess

MiB = 1024 * 1024
# RLIMIT_CPU is per process and counts from its start; it backs up the sampler, which should act first.
CPU_BACKSTOP_SECONDS = 5


@dataclasses.dataclass(frozen=True)
class Breach:
    error_type: Reason
    message: str
    proof: dict[str, Any]


class Limits:
    def __init__(self, settings: Settings) -> None:
        self.memory_bytes = settings.worker_max_memory_mb * MiB
        self.cpu_seconds = settings.worker_max_cpu_seconds
        self.processes = settings.worker_max_processes
        self.output_bytes = settings.worker_max_output_bytes
        self.disk_bytes = settings.worker_max_disk_mb * MiB
        self.crew_disk_bytes = settings.crew_max_disk_mb * MiB
        self.period = settings.limit_sample_ms / 1000
        # A pids cgroup always: capped or not, it is what holds every process of a job.
        wanted = [PIDS, *(name for name, cap in ((MEMORY, self.memory_bytes), (CPU, self.cpu_seconds)) if cap)]
        self.cgroups = Cgroups.find(wanted) if settings.cgroups == "auto" else None
        self.contained = False  # the workers deny themselves cgroup writes (their registry says): none leaves its own
        self._applied: set[WorkerProcess] = set()
        self._watched: dict[WorkerProcess, tuple[Callable[[Breach], None], Callable[[Boundary], None]]] = {}

    def health(self) -> dict[str, object]:
        """Which kind of limit holds each cap: the kernel's (a cgroup per job) or our sampling."""
        kernel = self.cgroups.names if self.cgroups is not None else set()
        return {
            "process_limit": "cgroup" if PIDS in kernel and self.processes else "sampled" if self.processes else "off",
            "memory_limit": "cgroup" if MEMORY in kernel else "sampled" if self.memory_bytes else "off",
            "cpu_limit": "cgroup" if CPU in kernel else "sampled" if self.cpu_seconds else "off",
            "containment": self.containment(),
        }

    def containment(self) -> str:
        """What holds every process of a job: its cgroup, which it cannot leave; else its group and the samples."""
        if self.cgroups is None or PIDS not in self.cgroups.names:
            return "group and samples"
        return "cgroup" if self.contained else "cgroup, leavable: the workers cannot deny themselves cgroup writes"

    def cgroup_bases(self) -> tuple[str, ...]:
        """Where this supervisor's job cgroups go (none without cgroups)."""
        return self.cgroups.bases() if self.cgroups is not None else ()

    def remove_stale(self) -> None:
        """Remove the empty cgroups dead supervisors left (once the journal is fenced)."""
        if self.cgroups is not None:
            self.cgroups.remove_stale()

    async def apply(self, worker: WorkerProcess) -> None:
        """Bound a worker that has not yet been given its job; once (a pre-forked one is bounded while idle)."""
        if worker in self._applied:
            return
        cgroup = None
        if self.cgroups is not None:
            # Off the loop: moving a process between cgroups waits on the kernel (~15 ms measured).
            name = f"{worker.pid}-{worker.create_time:.2f}"  # a pid is reused; with its start time it is not
            cgroup = await asyncio.to_thread(self.cgroups.join, name, worker.pid, self.processes, self.memory_bytes)
        worker.containment.cgroup = cgroup
        self._applied.add(worker)

    def begin(self, worker: WorkerProcess) -> None:
        """The job starts now: CPU counts from here (not a cold start's imports); the worker set its kernel backstop
        as it started it (``rlimits``)."""
        tree = worker.containment
        tree.cpu_baseline = tree.job_cpu_seconds(tree.cpu_seconds())

    def release(self, worker: WorkerProcess) -> None:
        """The worker is gone: forget its tree and remove its cgroup."""
        if worker in self._applied and worker.containment.cgroup is not None:
            worker.containment.cgroup.remove()
        self._applied.discard(worker)

    def stop(self) -> None:
        """Remove this supervisor's cgroups (each job's is removed at ``release``)."""
        if self.cgroups is not None:
            self.cgroups.remove()

    def check(self, worker: WorkerProcess, table: ProcessTable | None = None) -> Breach | None:
        """Sample the worker's tree now; the first limit it breaks, if any."""
        tree = worker.containment
        usage = tree.sample(table)
        if usage is None:
            return None
        refused = tree.cgroup.refused_forks() if tree.cgroup is not None else 0
        if self.processes and (refused or usage.threads > self.processes):
            return Breach(
                Reason.PROCESS_LIMIT_EXCEEDED,
                f"the job tried to run more than {self.processes} processes and threads",
                {"processes": usage.processes, "threads": usage.threads, "forks_refused": refused},
            )
        oom = self.oom_breach(worker)
        if oom is not None:  # the kernel killed one of its processes at the cap: the job goes whole
            return oom
        # RSS counts pages shared with the fork server once per process; PSS, the measure, never exceeds it.
        capped = tree.cgroup is not None and tree.cgroup.caps_memory
        if self.memory_bytes and not capped and usage.rss_bytes > self.memory_bytes:
            memory = tree.proportional_memory(table)
            if memory > self.memory_bytes:
                return Breach(
                    Reason.MEMORY_LIMIT_EXCEEDED,
                    f"the job's memory reached {memory // MiB} MiB, over {self.memory_bytes // MiB} MiB",
                    {
                        "memory_bytes": memory,
                        "peak_rss_bytes": tree.peak_rss,
                        "limit_bytes": self.memory_bytes,
                        "enforced_by": "sampling",
                    },
                )
        # Its descriptors once it has started: a worker is not dumpable (closed to a non-root supervisor) until then.
        processes = tree.members if tree.cpu_baseline is not None else ()
        reading = tree.places.poll(processes) if self.measures_disk and tree.places is not None else None
        if reading is not None and (breach := self.disk_breach(reading)) is not None:
            return breach
        used = usage.cpu_seconds - (tree.cpu_baseline or 0.0)
        if self.cpu_seconds and tree.cpu_baseline is not None and used > self.cpu_seconds:
            return Breach(
                Reason.CPU_LIMIT_EXCEEDED,
                f"the job used {_ms_up(used):g} CPU seconds, over {self.cpu_seconds}",
                {"cpu_seconds": _ms_up(used), "limit_seconds": self.cpu_seconds},
            )
        return None

    @property
    def measures_disk(self) -> bool:
        """Whether a job's disk is measured: a cap on it, or on its crew's places."""
        return bool(self.disk_bytes or self.crew_disk_bytes)

    def disk_breach(self, reading: Reading, after_exit: bool = False) -> Breach | None:
        """The disk cap ``reading`` passes, if any: the job's (what it wrote to its places and holds with no name),
        else its crew's (its HOME and storage, whole), charged to a job only if they grew while it ran: one that
        wrote nothing there is not failed for what another job did. ``after_exit``: the final accounting, its
        processes gone. A process of the job that hid its descriptors breaks no cap (``Reading.unreadable``)."""
        when = "after exit" if after_exit else "running"
        if self.disk_bytes and (
            reading.disk_bytes > self.disk_bytes
            or reading.entries > MAX_NEW_ENTRIES
            or reading.descriptors > MAX_DESCRIPTORS
        ):
            return disk_breach(reading, self.disk_bytes, when)
        if reading.grew and self.crew_over(reading.crew):
            return crew_disk_breach(reading.crew, self.crew_disk_bytes, when)
        return None

    def crew_over(self, used: int) -> bool:
        """Whether a crew's places holding ``used`` bytes are past ``CREW_MAX_DISK_MB`` (never, without it)."""
        return bool(self.crew_disk_bytes) and used > self.crew_disk_bytes

    def oom_breach(self, worker: WorkerProcess) -> Breach | None:
        """The memory limit, if the kernel enforced it: its OOM killer stopped a process of the job."""
        cgroup = worker.containment.cgroup
        kills = cgroup.oom_kills() if cgroup is not None else 0
        if cgroup is None or not kills:
            return None
        peak = cgroup.memory_peak()
        return Breach(
            Reason.MEMORY_LIMIT_EXCEEDED,
            f"the job reached its memory limit of {self.memory_bytes // MiB} MiB; the kernel stopped it",
            {
                "memory_bytes": peak,
                "limit_bytes": self.memory_bytes,
                "oom_kills": kills,
                "enforced_by": "cgroup",
            },
        )

    def watch(
        self,
        worker: WorkerProcess,
        places: Places,
        on_breach: Callable[[Breach], None],
        on_found: Callable[[Boundary], None],
    ) -> None:
        """Sample ``worker`` (and what its job wrote to ``places``) in every round until ``unwatch``; ``on_breach``
        is told once of the limit it broke, ``on_found`` of its boundary each time a round found processes of the
        job it had not seen."""
        worker.containment.places = places
        self._watched[worker] = (on_breach, on_found)
        if self.output_bytes:  # checked as it is read, not sampled: a flood passes nothing between two samples
            cap = self.output_bytes
            worker.cap_output(cap, lambda total: self._breached(worker, output_breach(total, cap)))

    def _breached(self, worker: WorkerProcess, breach: Breach) -> None:
        """Tell the job of the first limit its worker broke, once: it is watched no more."""
        watched = self._watched.pop(worker, None)
        if watched is not None:
            watched[0](breach)

    def unwatch(self, worker: WorkerProcess) -> None:
        self._watched.pop(worker, None)

    @property
    def watching(self) -> bool:
        """Whether any worker is sampled each period."""
        return bool(self._watched)

    def sample(self) -> None:
        """One round for every watched worker, sharing one scan of the process table (housekeeping calls
        this every ``period``)."""
        if not self._watched:
            return
        table = ProcessTable.scan()
        for worker, (_, on_found) in list(self._watched.items()):
            breach = None if worker.exited.done() else self.check(worker, table)
            if worker.containment.boundary_grew:
                on_found(worker.containment.boundary())
            if breach is not None:
                self._breached(worker, breach)


def _ms_up(seconds: float) -> float:
    """Up to the millisecond: a use just past a limit never reads as at it."""
    return math.ceil(seconds * 1000) / 1000


def output_breach(total: int, limit: int) -> Breach:
    return Breach(
        Reason.OUTPUT_LIMIT_EXCEEDED,
        f"the job wrote {total} bytes to stdout/stderr, over {limit}",
        {"output_bytes": total, "limit_bytes": limit},
    )


def disk_breach(reading: Reading, limit: int, when: str) -> Breach:
    """A job over ``WORKER_MAX_DISK_MB``, ``when`` measured (running, or after exit)."""
    cap = f"its {limit // MiB} MiB (WORKER_MAX_DISK_MB)"
    if reading.descriptors > MAX_DESCRIPTORS:
        message = f"the job's processes held over {MAX_DESCRIPTORS} descriptors, too many to count against {cap}"
    elif reading.entries > MAX_NEW_ENTRIES:
        message = f"the job wrote over {MAX_NEW_ENTRIES} new files to its places ({when}), over {cap}"
    else:
        held = f" and held {reading.held // MiB} MiB in files with no name" if reading.held_files else ""
        written = f"{reading.written // MiB} MiB to its scratch directory and its crew's places{held}"
        message = f"the job wrote {written} ({when}), over {cap}"
    return Breach(
        Reason.DISK_LIMIT_EXCEEDED,
        message,
        {
            "disk_bytes": reading.disk_bytes,
            "limit_bytes": limit,
            "limit": "WORKER_MAX_DISK_MB",
            "files": reading.entries,
            "descriptors": reading.descriptors,
            "held_bytes": reading.held,
            "held_files": reading.held_files,
            "unreadable_pids": list(reading.unreadable),
            "measured": when,
        },
    )


def crew_disk_breach(used: int, limit: int, when: str) -> Breach:
    """A crew's places over ``CREW_MAX_DISK_MB``, ``when`` measured (running, or after exit)."""
    return Breach(
        Reason.DISK_LIMIT_EXCEEDED,
        f"the crew's HOME and storage reached {used // MiB} MiB ({when}), over its {limit // MiB} MiB"
        " (CREW_MAX_DISK_MB)",
        {"crew_disk_bytes": used, "limit_bytes": limit, "limit": "CREW_MAX_DISK_MB", "measured": when},
    )


def rlimits(settings: Settings) -> tuple[tuple[tuple[str, int], ...], int]:
    """The kernel limits of every worker process (``RLIMIT_*`` name, value; the unset left out), and its CPU backstop:
    the seconds it may use from its job's start before the kernel stops it (0: none). Sent in its settings."""
    static = (
        ("RLIMIT_NOFILE", settings.worker_max_open_files),
        ("RLIMIT_AS", settings.worker_max_address_space_mb * MiB),
        ("RLIMIT_FSIZE", settings.worker_max_disk_mb * MiB),  # no one file past the disk cap, whatever its place
    )
    cpu = settings.worker_max_cpu_seconds
    return tuple((name, value) for name, value in static if value), cpu + CPU_BACKSTOP_SECONDS if cpu else 0
