"""Per-job limits, enforced from the supervisor's side so a job cannot opt out.

Kernel limits are set on the worker from here (``prlimit``, not a request to the worker): open files,
address space and a pids cgroup (where one can be made) before it is given its job, a CPU backstop once
the job starts. A sampler measures every worker's whole tree each period and names the limit a job broke.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import resource
from collections.abc import Callable, Mapping
from typing import Any

from supervisor.cgroups import PidsCgroups
from supervisor.config import Settings
from supervisor.process import WorkerProcess, children_by_parent

log = logging.getLogger("crew_supervisor.limits")
MiB = 1024 * 1024
# RLIMIT_CPU is per process and counts from its start; it backs up the sampler, which should act first.
CPU_BACKSTOP_SECONDS = 5


@dataclasses.dataclass(frozen=True)
class Breach:
    error_type: str
    message: str
    proof: dict[str, Any]


class Limits:
    def __init__(self, settings: Settings) -> None:
        self.memory_bytes = settings.worker_max_memory_mb * MiB
        self.cpu_seconds = settings.worker_max_cpu_seconds
        self.processes = settings.worker_max_processes
        self.open_files = settings.worker_max_open_files
        self.address_space = settings.worker_max_address_space_mb * MiB
        self.output_bytes = settings.worker_max_output_bytes
        self.period = settings.limit_sample_ms / 1000
        self.cgroups = PidsCgroups.find() if self.processes else None
        self._watched: dict[WorkerProcess, Callable[[Breach], None]] = {}
        self._sampler: asyncio.Task[None] | None = None

    def health(self) -> dict[str, object]:
        return {"process_limit": "cgroup" if self.cgroups else "sampled" if self.processes else "off"}

    async def apply(self, worker: WorkerProcess, name: str) -> None:
        """Bound a worker that has not yet been given its job."""
        for kind, value in ((resource.RLIMIT_NOFILE, self.open_files), (resource.RLIMIT_AS, self.address_space)):
            if value:
                _prlimit(worker.pid, kind, value, value)
        if self.cgroups is not None:
            # Off the loop: moving a process between cgroups waits on the kernel (~15 ms measured).
            worker.cgroup = await asyncio.to_thread(self.cgroups.join, name, worker.pid, self.processes)

    def begin(self, worker: WorkerProcess) -> None:
        """The job starts now: CPU counts from here (not a cold start's imports), with a kernel backstop."""
        worker.cpu_baseline = worker.cpu_seconds()
        if self.cpu_seconds:
            soft = int(worker.cpu_baseline) + self.cpu_seconds + CPU_BACKSTOP_SECONDS
            _prlimit(worker.pid, resource.RLIMIT_CPU, soft, soft + 1)  # SIGXCPU first, SIGKILL a second later

    def release(self, worker: WorkerProcess) -> None:
        if worker.cgroup is not None:
            worker.cgroup.remove()

    def close(self) -> None:
        if self._sampler is not None:
            self._sampler.cancel()
        if self.cgroups is not None:
            self.cgroups.close()

    def check(self, worker: WorkerProcess, children: Mapping[int, list[int]] | None = None) -> Breach | None:
        """Sample the worker's tree now; the first limit it breaks, if any."""
        output = worker.stdout.total + worker.stderr.total
        if self.output_bytes and output > self.output_bytes:
            return Breach(
                "output_limit_exceeded",
                f"the job wrote {output} bytes to stdout/stderr, over {self.output_bytes}",
                {"output_bytes": output},
            )
        usage = worker.sample(children)
        if usage is None:
            return None
        refused = worker.cgroup.refused_forks() if worker.cgroup is not None else 0
        if self.processes and (refused or usage.threads > self.processes):
            return Breach(
                "process_limit_exceeded",
                f"the job tried to run more than {self.processes} processes and threads",
                {"processes": usage.processes, "threads": usage.threads, "forks_refused": refused},
            )
        # RSS counts pages shared with the fork server once per process; PSS, the measure, never exceeds it.
        if self.memory_bytes and usage.rss_bytes > self.memory_bytes:
            memory = worker.proportional_memory()
            if memory > self.memory_bytes:
                return Breach(
                    "memory_limit_exceeded",
                    f"the job's memory reached {memory // MiB} MiB, over {self.memory_bytes // MiB} MiB",
                    {"memory_bytes": memory, "peak_rss_bytes": worker.peak_rss, "limit_bytes": self.memory_bytes},
                )
        used = usage.cpu_seconds - (worker.cpu_baseline or 0.0)
        if self.cpu_seconds and worker.cpu_baseline is not None and used > self.cpu_seconds:
            return Breach(
                "cpu_limit_exceeded",
                f"the job used {used:.1f} CPU seconds, over {self.cpu_seconds}",
                {"cpu_seconds": round(used, 3), "limit_seconds": self.cpu_seconds},
            )
        return None

    def watch(self, worker: WorkerProcess, on_breach: Callable[[Breach], None]) -> None:
        """Sample ``worker`` each period until ``unwatch``; ``on_breach`` is told once of the limit it broke."""
        self._watched[worker] = on_breach
        if self._sampler is None:
            self._sampler = asyncio.get_running_loop().create_task(self._sample_all(), name="limits")

    def unwatch(self, worker: WorkerProcess) -> None:
        self._watched.pop(worker, None)

    async def _sample_all(self) -> None:
        """One round per period for every worker, sharing one scan of the process table."""
        try:
            while self._watched:
                children = children_by_parent()
                for worker, on_breach in list(self._watched.items()):
                    breach = None if worker.exited.done() else self.check(worker, children)
                    if breach is not None:
                        self.unwatch(worker)
                        on_breach(breach)
                await asyncio.sleep(self.period)
        finally:
            self._sampler = None


def _prlimit(pid: int, kind: int, soft: int, hard: int) -> None:
    """Lower only: a limit already tighter (set by the operator's own ulimit) is kept."""
    _, current_hard = resource.prlimit(pid, kind)
    hard = hard if current_hard == resource.RLIM_INFINITY else min(hard, current_hard)
    soft = min(soft, hard)
    try:
        resource.prlimit(pid, kind, (soft, hard))
    except (OSError, ValueError) as exc:
        log.warning("could not set worker limit %d: %s", kind, type(exc).__name__, extra={"pid": pid})
