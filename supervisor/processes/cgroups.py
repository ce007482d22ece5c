"""Kernel caps per worker: a pids cgroup (always: it is what holds the job), a memory cgroup and a CPU count,
where the kernel lets us make them.

Sampling sees a fork bomb or a memory hog only after the fact. A cgroup's ``pids.max`` makes the kernel
refuse the fork itself, and its member list names every process of the job, even one that left with
setsid (no job can leave its cgroups: its worker denies itself every cgroup write, ``worker/landlock.py``);
its memory limit makes the kernel's OOM killer stop the job at the limit, however fast it grows, and
counts the kill; its CPU count (``cpuacct``; ``cpu.stat`` on v2) holds what every member used, one that
re-forked and ended too. RLIMIT_NPROC cannot do the first (it counts all processes of the user, and root
ignores it), RLIMIT_AS not the second (it counts address space, not memory).

Cgroup v1 (a ``pids`` and a ``memory`` hierarchy) and v2 (one unified tree) are both read. On v2 our own
cgroup must enable the controllers for the jobs' cgroups below it, which a cgroup holding processes cannot
(the root excepted): at the root of a cgroup namespace (a container's own, mounted writable) the processes
it holds move into a leaf first; a supervisor inside any other cgroup that holds processes (a login session)
samples instead. This project's VM runs v1; ``scripts/smoke-cgroup2`` runs the containment tests on a v2
kernel, in both layouts. A controller we cannot write (an unprivileged container, a read-only cgroup mount)
is left to sampling; the container's own limits stay the hard cap.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import os
from pathlib import Path

log = logging.getLogger("crew_supervisor.cgroups")
CGROUP_ROOT = Path("/sys/fs/cgroup")
PIDS, MEMORY, CPU = "pids", "memory", "cpuacct"
# What proves a directory of ours is a cgroup with the controller: its cap's (or count's) file, v1 then v2.
CAP_FILES = {PIDS: ("pids.max",), MEMORY: ("memory.limit_in_bytes", "memory.max"), CPU: ("cpuacct.usage", "cpu.stat")}
BASE_PREFIX, JOB_PREFIX = "crew-supervisor-", "worker-"  # a supervisor's directory, a job's within it
LEAF = "init"  # v2, at a cgroup namespace's root: where the processes it held go (``_enable_below``)


@dataclasses.dataclass(frozen=True)
class Controller:
    """Where one controller's job cgroups go: our own directory under the controller's hierarchy."""

    name: str
    base: Path
    v1: bool


class JobCgroup:
    """One job's cgroups: one directory per controller (a single one on cgroup v2)."""

    def __init__(self, paths: dict[str, tuple[Path, bool]]) -> None:
        self._paths = paths  # controller -> (directory, v1)

    @property
    def caps_memory(self) -> bool:
        return MEMORY in self._paths

    def paths(self) -> tuple[str, ...]:
        return tuple(sorted({str(path) for path, _ in self._paths.values()}))

    def pids(self) -> list[int]:
        """Every member: any of the job's cgroups lists them all, since none of them can leave."""
        return members_of(next(iter(self._paths.values()))[0])

    def holds(self, pid: int) -> bool:
        """Whether ``pid`` is a member now (``holds``), of the cgroup ``pids`` reads."""
        return holds(next(iter(self._paths.values()))[0], pid)

    def kill(self) -> None:
        """On v2, the kernel kills every member at once (``kill_members``); v1 has no such file."""
        for directory, v1 in self._paths.values():
            if not v1:
                kill_members(directory)
                return

    def cpu_seconds(self) -> float | None:
        """All the CPU the job's members used while they were members, ended ones included; None without the count."""
        place = self._paths.get(CPU)
        if place is None:
            return None
        with contextlib.suppress(OSError, ValueError):
            if place[1]:
                return int((place[0] / "cpuacct.usage").read_text()) / 1e9
            for line in (place[0] / "cpu.stat").read_text().splitlines():
                if line.startswith("usage_usec "):
                    return int(line.split()[1]) / 1e6
        return None

    def refused_forks(self) -> int:
        """How many forks ``pids.max`` refused (the ``max`` line of ``pids.events``)."""
        return self._count(PIDS, "pids.events", "max")

    def oom_kills(self) -> int:
        """How many of the job's processes the kernel killed at the memory limit."""
        place = self._paths.get(MEMORY)
        if place is None:
            return 0
        return self._count(MEMORY, "memory.oom_control" if place[1] else "memory.events", "oom_kill")

    def memory_current(self) -> int | None:
        """What the job is charged now, the measure its memory cap holds it to; None once it is gone."""
        place = self._paths.get(MEMORY)
        if place is None:
            return None
        with contextlib.suppress(OSError, ValueError):
            return int((place[0] / ("memory.usage_in_bytes" if place[1] else "memory.current")).read_text())
        return None

    def memory_peak(self) -> int:
        """The most memory the job was charged at once (``memory.peak`` needs Linux 5.19 on v2)."""
        place = self._paths.get(MEMORY)
        if place is None:
            return 0
        with contextlib.suppress(OSError, ValueError):
            return int((place[0] / ("memory.max_usage_in_bytes" if place[1] else "memory.peak")).read_text())
        return 0

    def remove(self) -> None:
        """Only an empty cgroup can go; reaped processes leave it at once."""
        for directory in {path for path, _ in self._paths.values()}:
            with contextlib.suppress(OSError):
                directory.rmdir()

    def _count(self, controller: str, file: str, key: str) -> int:
        place = self._paths.get(controller)
        if place is None:
            return 0
        with contextlib.suppress(OSError, ValueError):
            for line in (place[0] / file).read_text().splitlines():
                name, _, count = line.partition(" ")
                if name == key:
                    return int(count)
        return 0


class Cgroups:
    """The supervisor's own directories of job cgroups, one per controller it can write."""

    def __init__(self, controllers: list[Controller]) -> None:
        self.controllers = controllers

    @property
    def names(self) -> set[str]:
        return {controller.name for controller in self.controllers}

    def bases(self) -> tuple[str, ...]:
        """Our directories, where every job cgroup of ours goes: what the state's lock file records of us."""
        return tuple(sorted({str(controller.base) for controller in self.controllers}))

    @classmethod
    def find(cls, wanted: list[str], root: Path = CGROUP_ROOT) -> Cgroups | None:
        """Our directory for each of ``wanted`` we can write, made now; None if none."""
        found = []
        for name in wanted:
            for candidate, v1 in _own_directories(root, name):
                if not v1 and name != CPU and not _enable_below(candidate, name, at_root=candidate == root):
                    continue
                base = candidate / f"{BASE_PREFIX}{os.getpid()}"
                try:
                    base.mkdir(mode=0o755, exist_ok=True)
                except OSError:
                    continue
                if any((base / cap).exists() for cap in CAP_FILES[name]) and _delegate(base, name, v1):
                    found.append(Controller(name, base, v1))
                    break
                with contextlib.suppress(OSError):
                    base.rmdir()
        return cls(found) if found else None

    def join(self, name: str, pid: int, processes: int, memory_bytes: int) -> JobCgroup | None:
        """Move ``pid`` (not yet running job code) into new cgroups capped at ``processes`` and
        ``memory_bytes``; a controller that refuses is left out (and said so), the others still hold."""
        paths: dict[str, tuple[Path, bool]] = {}
        for controller in self.controllers:
            path = controller.base / f"{JOB_PREFIX}{name}"
            try:
                path.mkdir(mode=0o755, exist_ok=not controller.v1)  # v2: one directory for all
                if controller.name == PIDS:
                    (path / "pids.max").write_text(str(processes) if processes else "max")
                elif controller.name == MEMORY:
                    _cap_memory(path, memory_bytes, controller.v1)
                (path / "cgroup.procs").write_text(str(pid))
            except OSError as exc:
                log.warning("no %s cgroup for a worker: %s", controller.name, exc.strerror)
                with contextlib.suppress(OSError):
                    path.rmdir()
                continue
            paths[controller.name] = (path, controller.v1)
        return JobCgroup(paths) if paths else None

    def remove_stale(self) -> None:
        """Remove the empty cgroups supervisors that died left. Run once this supervisor has fenced its journal,
        which killed what its dead predecessor's jobs left in theirs; a cgroup still holding a process is another
        journal's job's, for its own supervisor to fence (and so to record what it killed)."""
        for candidate in {controller.base.parent for controller in self.controllers}:
            for base in candidate.glob(f"{BASE_PREFIX}*"):
                pid = base.name.removeprefix(BASE_PREFIX)
                if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                    for job in (child for child in base.iterdir() if child.is_dir()):
                        with contextlib.suppress(OSError):
                            job.rmdir()
                    with contextlib.suppress(OSError):
                        base.rmdir()

    def remove(self) -> None:
        for base in {controller.base for controller in self.controllers}:
            for child in base.iterdir() if base.exists() else ():
                if child.is_dir():
                    with contextlib.suppress(OSError):
                        child.rmdir()
            with contextlib.suppress(OSError):
                base.rmdir()


def is_job_cgroup(path: Path) -> bool:
    """Whether ``path`` is a job's cgroup as a supervisor names it, under the cgroup root."""
    return (
        path.is_absolute()
        and ".." not in path.parts
        and CGROUP_ROOT in path.parents
        and path.name.startswith(JOB_PREFIX)
        and path.parent.name.startswith(BASE_PREFIX)
    )


def jobs_under(base: Path, pid: int) -> list[Path]:
    """The job cgroups in ``base``, which must be the directory of the supervisor ``pid`` (``Cgroups.bases``): a
    record naming it is data, so nothing else is read."""
    named = base.is_absolute() and ".." not in base.parts and base.name == f"{BASE_PREFIX}{pid}"
    if not named or CGROUP_ROOT not in base.parents:
        return []
    with contextlib.suppress(OSError):
        return sorted(child for child in base.iterdir() if child.is_dir() and is_job_cgroup(child))
    return []


def members_of(path: Path) -> list[int]:
    """The pids in the cgroup now. Only a count, or a hint: a member may end as soon as it is read and its pid go to
    a process of another cgroup, so a pid from here is killed only once ``holds`` says it is still a member."""
    with contextlib.suppress(OSError, ValueError):
        return [int(line) for line in (path / "cgroup.procs").read_text().split()]
    return []


def holds(path: Path, pid: int) -> bool:
    """Whether the cgroup ``path`` holds ``pid`` now, as ``/proc/<pid>/cgroup`` names it: asked after the process
    is identified (psutil: pid and start time) and before it is killed, it proves the process identified is a
    member, not one that took the pid of a member that ended after ``members_of`` read it."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            _, controllers, where = line.split(":", 2)
            if path in _directories(CGROUP_ROOT, controllers, where.lstrip("/")):
                return True
    return False


def kill_members(path: Path) -> bool:
    """Have the kernel kill every member of the cgroup at once, forks in flight included (``cgroup.kill``: v2,
    Linux 5.14); False where there is no such file (v1, an older kernel)."""
    try:
        (path / "cgroup.kill").write_text("1")
    except OSError:
        return False
    return True


def remove_job_cgroup(path: Path) -> None:
    """A dead supervisor's job cgroup (``is_job_cgroup``), emptied by its fencing; then its supervisor's, once
    that is empty too."""
    for directory in (path, path.parent):
        with contextlib.suppress(OSError):
            directory.rmdir()


def _delegate(base: Path, name: str, v1: bool) -> bool:
    """On v2 a job's directory has the controller's files only if ``base`` enables it for its children
    (allowed: ``base`` holds no process). v1 hierarchies need nothing, nor v2's CPU count (``cpu.stat``)."""
    if v1 or name == CPU:
        return True
    try:
        (base / "cgroup.subtree_control").write_text(f"+{name}")
    except OSError as exc:
        log.warning("cannot delegate the %s controller to job cgroups: %s", name, exc.strerror)
        return False
    return True


def _enable_below(ours: Path, name: str, *, at_root: bool) -> bool:
    """On v2, our own cgroup must enable ``name`` for the jobs' cgroups below it, and hold no process then (the
    host's root excepted): ``pids`` is threaded, so enabling it would go through, making ours a thread root whose
    children can hold no domain. At the root of our view, a container's own cgroup namespace, its processes move
    into a leaf (``LEAF``) first, as nested container engines do; elsewhere they may be others' (a login session's)."""
    control = ours / "cgroup.subtree_control"
    with contextlib.suppress(OSError):
        if name in control.read_text().split():
            return True
    try:
        if (ours / "cgroup.type").exists() and members_of(ours):  # the host's root has no type
            if not at_root:
                log.warning("cannot enable %s for job cgroups: %s holds processes", name, ours)
                return False
            _move_members(ours, ours / LEAF)
        control.write_text(f"+{name}")
    except OSError as exc:
        log.warning("cannot enable %s for job cgroups in %s: %s", name, ours, exc.strerror)
        return False
    return True


def _move_members(source: Path, leaf: Path) -> None:
    """Raises OSError if any process is left in ``source``: ``pids`` enabled there would make it a thread root."""
    leaf.mkdir(mode=0o755, exist_ok=True)
    for _ in range(3):  # a process forked while we moved the others stays behind: take it on the next round
        for pid in members_of(source):
            with contextlib.suppress(OSError):  # it ended meanwhile
                (leaf / "cgroup.procs").write_text(str(pid))
    if members_of(source):
        raise OSError(errno.EBUSY, f"processes left in {source}")
    log.info("moved the processes of %s into %s, to enable controllers for job cgroups", source, leaf)


def _cap_memory(path: Path, limit: int, v1: bool) -> None:
    """The limit before the process moves in, so what it charges from then on is capped (pages a forked
    worker copied ahead before joining stay charged to the supervisor's cgroup, ~20 MB). Swap is capped
    too where the kernel accounts it, or the job could page out past the limit."""
    if v1:
        (path / "memory.limit_in_bytes").write_text(str(limit))
        with contextlib.suppress(OSError):  # memsw exists only with swap accounting on
            (path / "memory.memsw.limit_in_bytes").write_text(str(limit))
    else:
        (path / "memory.max").write_text(str(limit))
        (path / "memory.oom.group").write_text("1")  # the whole job goes, not just its largest process
        with contextlib.suppress(OSError):
            (path / "memory.swap.max").write_text("0")


def _own_directories(root: Path, controller: str) -> list[tuple[Path, bool]]:
    """Where our cgroup for ``controller`` lives: its v1 hierarchy first, then the v2 unified tree."""
    found: list[tuple[Path, bool]] = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            relative = path.lstrip("/")
            if controller in controllers.split(","):
                found.extend((directory, True) for directory in _directories(root, controllers, relative))
            elif controllers == "":
                for directory in _directories(root, controllers, relative):
                    # Ours only if it holds us: a cgroup namespace seen through another's mount does not.
                    if os.getpid() in members_of(directory):
                        # A namespace's leaf (``_enable_below``): its jobs' cgroups go beside it, at the root.
                        at_leaf = relative == LEAF and (directory.parent / "cgroup.type").exists()
                        found.append((directory.parent if at_leaf else directory, False))
    return [(path, v1) for path, v1 in found if path.is_dir()]


def _directories(root: Path, controllers: str, relative: str) -> list[Path]:
    """Where the cgroup a line of ``/proc/<pid>/cgroup`` names is: in its v1 hierarchy, or in the v2 tree (at the
    root, or under ``unified`` on a hybrid host)."""
    if controllers:
        return [root / controllers / relative]
    return [root / relative, root / "unified" / relative]
