"""Per-job limits, enforced from the supervisor's side so a job cannot opt out.

Kernel limits are set on the worker from here (``prlimit``, not a request to the worker): open files,
address space, a pids and a memory cgroup (where they can be made) before it is given its job, a CPU backstop once
the job starts. A sampler measures every worker's whole tree each period and names the limit a job broke.

Each bounded worker's tree is a ``JobTree``: its cgroup, the samples and every descendant they saw.
The limits make one in ``apply`` (or ``watch``) and drop it in ``release``; whoever kills the worker
asks it for the descendants to kill beside the group.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import os
import resource
import time
from collections.abc import Callable, Mapping
from typing import Any

import psutil

from supervisor.config import Settings
from supervisor.processes.cgroups import MEMORY, PIDS, Cgroups, JobCgroup
from supervisor.processes.process import WorkerProcess

log = logging.getLogger("crew_supervisor.limits")
MiB = 1024 * 1024
# RLIMIT_CPU is per process and counts from its start; it backs up the sampler, which should act first.
CPU_BACKSTOP_SECONDS = 5
MAX_REMEMBERED = 4096  # descendants remembered per worker (a fork bomb is capped well below this)


@dataclasses.dataclass(frozen=True)
class Breach:
    error_type: str
    message: str
    proof: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Usage:
    """One sample of a worker's tree: the worker and every descendant still running."""

    rss_bytes: int
    cpu_seconds: float  # user + system, reaped children included
    cpu_percent: float  # since the previous sample; 100 is one core
    processes: int
    threads: int  # in all processes: what a pids cgroup counts
    sampled_at: float  # wall clock


class JobTree:
    """One worker's tree as the limits see it: the worker, its cgroups (if the kernel gave any), its
    descendants and the samples taken of them. Remembers every descendant a sample saw, so one that
    leaves the tree (setsid and a double fork) is still known to be this job's."""

    def __init__(self, pid: int, cgroup: JobCgroup | None = None) -> None:
        self.pid = pid
        self.cgroup = cgroup
        self.usage: Usage | None = None  # the latest sample (see ``sample``)
        self.peak_rss = 0
        self.cpu_baseline: float | None = None  # CPU seconds used before the job began (a cold start's imports)
        self._seen: dict[int, psutil.Process] = {}  # every descendant a sample found, by pid

    def descendants(self, children: Mapping[int, list[int]] | None = None) -> list[psutil.Process]:
        """Every other process of this job: the worker's tree, its cgroup's members, and any
        descendant a sample saw that has since left the tree (by setsid and a double fork).

        ``children`` is one scan of the process table (``children_by_parent``), shared by a round of samples.
        """
        pids = _tree(children if children is not None else children_by_parent(), self.pid)
        pids.update(self.cgroup.pids() if self.cgroup is not None else ())
        pids.discard(self.pid)
        found = {}
        for pid in pids:
            known = self._seen.get(pid)
            with contextlib.suppress(psutil.NoSuchProcess):
                found[pid] = known if known is not None and known.is_running() else psutil.Process(pid)
        for pid, process in self._seen.items():
            if pid not in found and _running(process):
                found[pid] = process
        return list(found.values())

    def cpu_seconds(self) -> float:
        """The worker's own CPU time so far (and its reaped children's); 0 once it is gone."""
        try:
            times = psutil.Process(self.pid).cpu_times()
        except psutil.NoSuchProcess:
            return 0.0
        return times.user + times.system + times.children_user + times.children_system

    def proportional_memory(self, children: Mapping[int, list[int]] | None = None) -> int:
        """The tree's PSS: pages shared with the fork server or each other count by share. Exact but
        slow (the kernel walks every mapping, ~6 ms for a CrewAI process), so asked only when RSS is high."""
        return sum(_pss(process) for process in [psutil.Process(self.pid), *self.descendants(children)])

    def memory_view(self, children: Mapping[int, list[int]]) -> Callable[[], tuple[int | None, str]]:
        """What the job's memory is, as its cap measures it, as a reading to take off the loop (a PSS takes ms a
        process): the cgroup's charge where one caps it, else the PSS of the processes its tree has now
        (``children``: one scan of the process table, shared by the readings of one view)."""
        cgroup = self.cgroup if self.cgroup is not None and self.cgroup.caps_memory else None
        if cgroup is not None:
            return lambda: (cgroup.memory_current(), "cgroup")
        processes = [psutil.Process(self.pid), *self.descendants(children)]
        return lambda: (sum(_pss(process) for process in processes), "pss")

    def leftovers(self) -> list[psutil.Process]:
        """Processes of this job still running after the worker itself has exited. Its children went
        to us (the subreaper) when it died, so no scan from its pid would find them: the cgroup and
        the samples are what know them."""
        return [process for process in self.descendants(children={}) if _running(process)]

    def sample(self, children: Mapping[int, list[int]] | None = None) -> Usage | None:
        """Measure the tree now; None once the worker is gone. Remembers every descendant it sees."""
        try:
            tree = [psutil.Process(self.pid), *self.descendants(children)]
        except psutil.NoSuchProcess:
            return None
        rss, cpu, alive, threads = 0, 0.0, 0, 0
        for process in tree:
            try:
                with process.oneshot():
                    rss += process.memory_info().rss
                    times = process.cpu_times()
                    threads += process.num_threads()
            except psutil.NoSuchProcess:
                continue
            cpu += times.user + times.system + times.children_user + times.children_system
            alive += 1
            if process.pid != self.pid and len(self._seen) < MAX_REMEMBERED:
                self._seen.setdefault(process.pid, process)
        now = time.time()
        previous = self.usage
        elapsed = now - previous.sampled_at if previous else 0.0
        percent = max(cpu - previous.cpu_seconds, 0.0) / elapsed * 100 if previous and elapsed > 0 else 0.0
        self.usage = Usage(rss, round(cpu, 3), round(percent, 1), alive, threads, now)
        self.peak_rss = max(self.peak_rss, rss)
        return self.usage


class Limits:
    def __init__(self, settings: Settings) -> None:
        self.memory_bytes = settings.worker_max_memory_mb * MiB
        self.cpu_seconds = settings.worker_max_cpu_seconds
        self.processes = settings.worker_max_processes
        self.open_files = settings.worker_max_open_files
        self.address_space = settings.worker_max_address_space_mb * MiB
        self.output_bytes = settings.worker_max_output_bytes
        self.period = settings.limit_sample_ms / 1000
        wanted = [name for name, cap in ((PIDS, self.processes), (MEMORY, self.memory_bytes)) if cap]
        self.cgroups = Cgroups.find(wanted) if settings.cgroups == "auto" else None
        self._trees: dict[WorkerProcess, JobTree] = {}
        self._watched: dict[WorkerProcess, Callable[[Breach], None]] = {}

    def health(self) -> dict[str, object]:
        """Which kind of limit holds each cap: the kernel's (a cgroup per job) or our sampling."""
        kernel = self.cgroups.names if self.cgroups is not None else set()
        return {
            "process_limit": "cgroup" if PIDS in kernel else "sampled" if self.processes else "off",
            "memory_limit": "cgroup" if MEMORY in kernel else "sampled" if self.memory_bytes else "off",
        }

    async def apply(self, worker: WorkerProcess) -> None:
        """Bound a worker that has not yet been given its job; once (a pre-forked one is bounded while idle)."""
        if worker in self._trees:
            return
        for kind, value in ((resource.RLIMIT_NOFILE, self.open_files), (resource.RLIMIT_AS, self.address_space)):
            if value:
                _prlimit(worker.pid, kind, value, value)
        cgroup = None
        if self.cgroups is not None:
            # Off the loop: moving a process between cgroups waits on the kernel (~15 ms measured).
            name = f"worker-{worker.pid}-{worker.create_time:.2f}"  # a pid is reused; with its start time it is not
            cgroup = await asyncio.to_thread(self.cgroups.join, name, worker.pid, self.processes, self.memory_bytes)
        self._trees[worker] = JobTree(worker.pid, cgroup)

    def begin(self, worker: WorkerProcess) -> None:
        """The job starts now: CPU counts from here (not a cold start's imports), with a kernel backstop."""
        tree = self._bounded(worker)
        tree.cpu_baseline = tree.cpu_seconds()
        if self.cpu_seconds:
            soft = int(tree.cpu_baseline) + self.cpu_seconds + CPU_BACKSTOP_SECONDS
            _prlimit(worker.pid, resource.RLIMIT_CPU, soft, soft + 1)  # SIGXCPU first, SIGKILL a second later

    def tree(self, worker: WorkerProcess) -> JobTree:
        """What the limits know of ``worker``'s tree; a worker not (yet) bounded gets a fresh look."""
        return self._trees.get(worker) or JobTree(worker.pid)

    def release(self, worker: WorkerProcess) -> None:
        """The worker is gone: forget its tree and remove its cgroup."""
        tree = self._trees.pop(worker, None)
        if tree is not None and tree.cgroup is not None:
            tree.cgroup.remove()

    def stop(self) -> None:
        """Remove this supervisor's cgroups (each job's is removed at ``release``)."""
        if self.cgroups is not None:
            self.cgroups.remove()

    def check(self, worker: WorkerProcess, children: Mapping[int, list[int]] | None = None) -> Breach | None:
        """Sample the worker's tree now; the first limit it breaks, if any."""
        output = worker.stdout.total + worker.stderr.total
        if self.output_bytes and output > self.output_bytes:
            return Breach(
                "output_limit_exceeded",
                f"the job wrote {output} bytes to stdout/stderr, over {self.output_bytes}",
                {"output_bytes": output},
            )
        tree = self._bounded(worker)
        usage = tree.sample(children)
        if usage is None:
            return None
        refused = tree.cgroup.refused_forks() if tree.cgroup is not None else 0
        if self.processes and (refused or usage.threads > self.processes):
            return Breach(
                "process_limit_exceeded",
                f"the job tried to run more than {self.processes} processes and threads",
                {"processes": usage.processes, "threads": usage.threads, "forks_refused": refused},
            )
        oom = self.oom_breach(worker)
        if oom is not None:  # the kernel killed one of its processes at the cap: the job goes whole
            return oom
        # RSS counts pages shared with the fork server once per process; PSS, the measure, never exceeds it.
        capped = tree.cgroup is not None and tree.cgroup.caps_memory
        if self.memory_bytes and not capped and usage.rss_bytes > self.memory_bytes:
            memory = tree.proportional_memory(children)
            if memory > self.memory_bytes:
                return Breach(
                    "memory_limit_exceeded",
                    f"the job's memory reached {memory // MiB} MiB, over {self.memory_bytes // MiB} MiB",
                    {
                        "memory_bytes": memory,
                        "peak_rss_bytes": tree.peak_rss,
                        "limit_bytes": self.memory_bytes,
                        "enforced_by": "sampling",
                    },
                )
        used = usage.cpu_seconds - (tree.cpu_baseline or 0.0)
        if self.cpu_seconds and tree.cpu_baseline is not None and used > self.cpu_seconds:
            return Breach(
                "cpu_limit_exceeded",
                f"the job used {used:.1f} CPU seconds, over {self.cpu_seconds}",
                {"cpu_seconds": round(used, 3), "limit_seconds": self.cpu_seconds},
            )
        return None

    def oom_breach(self, worker: WorkerProcess) -> Breach | None:
        """The memory limit, if the kernel enforced it: its OOM killer stopped a process of the job."""
        tree = self._trees.get(worker)
        cgroup = tree.cgroup if tree is not None else None
        kills = cgroup.oom_kills() if cgroup is not None else 0
        if cgroup is None or not kills:
            return None
        peak = cgroup.memory_peak()
        return Breach(
            "memory_limit_exceeded",
            f"the job reached its memory limit of {self.memory_bytes // MiB} MiB; the kernel stopped it",
            {
                "memory_bytes": peak,
                "limit_bytes": self.memory_bytes,
                "oom_kills": kills,
                "enforced_by": "cgroup",
            },
        )

    def watch(self, worker: WorkerProcess, on_breach: Callable[[Breach], None]) -> None:
        """Sample ``worker`` in every round until ``unwatch``; ``on_breach`` is told once of the limit it broke."""
        self._bounded(worker)
        self._watched[worker] = on_breach

    def unwatch(self, worker: WorkerProcess) -> None:
        self._watched.pop(worker, None)

    @property
    def watching(self) -> bool:
        """Whether any worker is sampled each period."""
        return bool(self._watched)

    def _bounded(self, worker: WorkerProcess) -> JobTree:
        """The tree kept for ``worker`` until ``release``: made now if ``apply`` did not run."""
        tree = self._trees.get(worker)
        if tree is None:
            tree = self._trees[worker] = JobTree(worker.pid)
        return tree

    def sample(self) -> None:
        """One round for every watched worker, sharing one scan of the process table (housekeeping calls
        this every ``period``)."""
        if not self._watched:
            return
        children = children_by_parent()
        for worker, on_breach in list(self._watched.items()):
            breach = None if worker.exited.done() else self.check(worker, children)
            if breach is not None:
                self.unwatch(worker)
                on_breach(breach)


def _prlimit(pid: int, kind: int, soft: int, hard: int) -> None:
    """Lower only: a limit already tighter (set by the operator's own ulimit) is kept.

    Reading another uid's limits is refused too (EPERM) without CAP_SYS_RESOURCE, which a root
    supervisor may lack (Docker drops it) while its workers run as WORKER_USER: logged, not fatal.
    """
    try:
        _, current_hard = resource.prlimit(pid, kind)
        hard = hard if current_hard == resource.RLIM_INFINITY else min(hard, current_hard)
        resource.prlimit(pid, kind, (min(soft, hard), hard))
    except (OSError, ValueError) as exc:
        log.warning("could not set worker limit %d: %s", kind, type(exc).__name__, extra={"pid": pid})


def children_by_parent() -> dict[int, list[int]]:
    """One pass over /proc: each pid's children. psutil's ``children()`` makes this pass per call."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                data = stat.read()
            # After the command's closing parenthesis: state, then the parent's pid.
            parent = int(data[data.rindex(b")") + 2 :].split(None, 2)[1])
        except (OSError, ValueError, IndexError):
            continue
        children[parent].append(int(name))
    return children


def _tree(children: Mapping[int, list[int]], root: int) -> set[int]:
    found: set[int] = set()
    pending = list(children.get(root, ()))
    while pending:
        pid = pending.pop()
        if pid not in found:
            found.add(pid)
            pending.extend(children.get(pid, ()))
    return found


def _pss(process: psutil.Process) -> int:
    try:
        with open(f"/proc/{process.pid}/smaps_rollup", "rb") as rollup:
            for line in rollup:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    try:
        return int(process.memory_info().rss)  # no rollup (an old kernel): RSS bounds PSS from above
    except psutil.NoSuchProcess:
        return 0


def _running(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
