"""A job's boundary: what holds every process the job starts, measures them, and kills all of them.

Each bounded worker gets one ``Containment``: its cgroups (where the kernel gave any), its process group, and
every descendant a sample saw. The job cannot leave its cgroups (the worker denies itself any cgroup write
before crew code runs: ``worker/landlock.py``), so on a host with cgroups they name every process of the job,
even one that left the group with setsid after its parent died. Without cgroups the group and the samples are
what know them (said in ``/health`` and by ``doctor``).

What identifies the job's processes is a ``Boundary``, journaled before the worker gets its job (and again as
samples find new descendants): a supervisor restarted after a crash kills what its dead predecessor's jobs
left (``kill_remains``), however long their worker has been gone.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import enum
import os
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import orjson
import psutil

from supervisor.processes.cgroups import JobCgroup, holds, is_job_cgroup, kill_members, members_of, remove_job_cgroup
from supervisor.processes.places import Places

MAX_REMEMBERED = 4096  # descendants remembered per worker (bounds the journaled boundary; a pids cap sits below it)
KILL_SECONDS = 5.0  # a kill that still finds new members after this has met something it cannot outrun
MAX_NAMED = 32  # leftovers a job's record names (its kill's ``descendants_killed`` counts them all)
MAX_COMMAND_CHARS = 256  # of a leftover's command line, as its job's record names it


class Left(enum.StrEnum):
    """How a process the job left running had left its worker, as the containment sees it once the worker exited
    (every one of them is then the subreaper's child: the worker's death reparents them all)."""

    IN_GROUP = "in_group"  # still in the worker's process group: a child it started and never waited for
    OWN_GROUP = "own_group"  # in a process group of its own (setpgid): found by the job's cgroup or a sample
    OWN_SESSION = "own_session"  # in a session of its own (setsid, a daemon): found by the job's cgroup or a sample


@dataclasses.dataclass(frozen=True)
class Usage:
    """One sample of a worker's tree: the worker and every descendant still running."""

    rss_bytes: int
    cpu_seconds: float  # user + system, reaped children and departed members included
    cpu_percent: float  # since the previous sample; 100 is one core
    processes: int
    threads: int  # in all processes: what a pids cgroup counts
    sampled_at: float  # wall clock


@dataclasses.dataclass(frozen=True)
class Boundary:
    """What the journal keeps of a job's processes: its cgroups' directories and the descendants samples saw
    (pid, start time). Its process group is the worker's pid, kept beside it."""

    cgroups: tuple[str, ...] = ()
    tree: tuple[tuple[int, float], ...] = ()

    def encode(self) -> bytes:
        return orjson.dumps({"cgroups": self.cgroups, "tree": self.tree})

    @classmethod
    def decode(cls, raw: bytes | str | None) -> Boundary:
        """A journaled boundary; an empty one for a record without (an older journal's, or malformed)."""
        try:
            data = orjson.loads(raw) if raw else {}
            return cls(
                tuple(str(path) for path in data.get("cgroups", ())),
                tuple((int(pid), float(started)) for pid, started in data.get("tree", ())),
            )
        except (orjson.JSONDecodeError, AttributeError, TypeError, ValueError):
            return cls()


@dataclasses.dataclass(frozen=True)
class ProcessTable:
    """One pass over /proc: each pid's children and each process group's members."""

    children: Mapping[int, list[int]]
    groups: Mapping[int, list[int]]

    @classmethod
    def scan(cls) -> ProcessTable:
        children: dict[int, list[int]] = collections.defaultdict(list)
        groups: dict[int, list[int]] = collections.defaultdict(list)
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/stat", "rb") as stat:
                    data = stat.read()
                # After the command's closing parenthesis: state, the parent's pid, the process group.
                _, parent, group = data[data.rindex(b")") + 2 :].split(None, 3)[:3]
            except (OSError, ValueError, IndexError):
                continue
            children[int(parent)].append(int(name))
            groups[int(group)].append(int(name))
        return cls(children, groups)

    def tree(self, root: int) -> set[int]:
        """Every descendant of ``root`` still attached to it."""
        found: set[int] = set()
        pending = list(self.children.get(root, ()))
        while pending:
            pid = pending.pop()
            if pid not in found:
                found.add(pid)
                pending.extend(self.children.get(pid, ()))
        return found


NO_TABLE = ProcessTable({}, {})  # for a worker that has exited: nothing is attached to it any more


class Containment:
    """One job's processes: the worker, its cgroups (if the kernel gave any), its group, its descendants and
    the samples taken of them. Remembers every descendant a sample saw (with its CPU time), so one that leaves
    the tree is still known to be the job's, and what one that ended used still counts."""

    def __init__(self, pid: int, create_time: float, cgroup: JobCgroup | None = None) -> None:
        self.pid = pid
        self.pgid = pid  # the worker leads its own process group
        self.sid = _session(pid)  # the worker's session, which it keeps: the supervisor's
        self.create_time = create_time
        self.cgroup = cgroup
        self.places: Places | None = None  # where its job writes, once it has one
        self.usage: Usage | None = None  # the latest sample (see ``sample``)
        self.members: tuple[psutil.Process, ...] = ()  # the processes it found, the worker first
        self.peak_rss = 0
        self.cpu_baseline: float | None = None  # CPU seconds used before the job began (a cold start's imports)
        self._seen: dict[int, psutil.Process] = {}  # every descendant a sample found, by pid
        self._cpu_seen: dict[int, float] = {}  # the last CPU time a sample read of each, ended ones included
        self._journaled = 0  # how many of ``_seen`` the last ``boundary`` held

    def boundary(self) -> Boundary:
        """What identifies this job's processes, for the journal."""
        self._journaled = len(self._seen)
        tree = tuple((pid, process.create_time()) for pid, process in list(self._seen.items()))
        return Boundary(self.cgroup.paths() if self.cgroup is not None else (), tree)

    @property
    def boundary_grew(self) -> bool:
        """Whether samples found descendants the journal does not hold yet."""
        return len(self._seen) > self._journaled

    def descendants(self, table: ProcessTable | None = None) -> list[psutil.Process]:
        """Every other process of this job still there: the worker's tree, its cgroup's members, any descendant
        a sample saw that has left the tree, and, without a cgroup, its group's members (``table``: one scan of
        the process table, shared by a round of samples). A pid its cgroup lists counts only if, once identified,
        it is still a member (``cgroups.holds``): it may be a stranger's that a member which ended left."""
        table = table if table is not None else ProcessTable.scan()
        pids, cgroup = table.tree(self.pid), self.cgroup
        members = set(cgroup.pids()) - pids if cgroup is not None else set()
        if cgroup is None:
            pids.update(table.groups.get(self.pgid, ()))
        found = {}
        for pid in (pids | members) - {self.pid}:
            known = self._seen.get(pid)
            with contextlib.suppress(psutil.NoSuchProcess):
                process = known if known is not None and known.is_running() else psutil.Process(pid)
                if process is not known and cgroup is not None and pid in members and not cgroup.holds(pid):
                    continue
                if process.create_time() >= self.create_time and running(process):  # a group outlives its leader
                    found[pid] = process
        for pid, process in list(self._seen.items()):
            if pid not in found and running(process):
                found[pid] = process
        return list(found.values())

    def leftovers(self) -> list[psutil.Process]:
        """Processes of this job still running once the worker itself has exited. Its children went to us (the
        subreaper) when it died, so no scan from its pid finds them: the cgroup, the group and the samples do."""
        return [process for process in self.descendants(_table_without_tree(self.cgroup)) if running(process)]

    def named(self, processes: Iterable[psutil.Process]) -> list[dict[str, object]]:
        """``processes`` (its ``leftovers``), at most MAX_NAMED, as the job's record names them: pid, command line and
        how it left the worker (``Left``). One that ended meanwhile is left out."""
        named: list[dict[str, object]] = []
        for process in processes:
            if len(named) == MAX_NAMED:
                break
            try:
                command = " ".join(process.cmdline()) or process.name()
                group, session = os.getpgid(process.pid), os.getsid(process.pid)
            except (psutil.Error, OSError):
                continue
            left = Left.IN_GROUP if group == self.pgid else Left.OWN_GROUP if session == self.sid else Left.OWN_SESSION
            named.append({"pid": process.pid, "command": command[:MAX_COMMAND_CHARS], "left": left})
        return named

    def kill(self, snapshot: Iterable[psutil.Process] = ()) -> list[psutil.Process]:
        """SIGKILL every process of the job but the worker (``snapshot``, taken before the worker's group was
        signalled, and whatever the job holds now), until none is found; the processes signalled, each running
        when it was. A fork racing the kill loses: a process with SIGKILL pending cannot fork."""
        killed: dict[int, psutil.Process] = {}
        deadline = time.monotonic() + KILL_SECONDS
        found = [*snapshot, *self.leftovers()]
        while found:
            for process in found:
                if process.pid not in killed and process.pid != self.pid and running(process):
                    with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                        process.kill()  # psutil refuses a pid that now names another process
                        killed[process.pid] = process
            if self.cgroup is not None:
                self.cgroup.kill()  # v2: the kernel kills what is there, forks in flight included
            if time.monotonic() > deadline:
                break
            found = [process for process in self.leftovers() if process.pid not in killed]
        return list(killed.values())

    def cpu_seconds(self) -> float:
        """The worker's own CPU time so far (and its reaped children's); 0 once it is gone."""
        try:
            times = psutil.Process(self.pid).cpu_times()
        except psutil.NoSuchProcess:
            return 0.0
        spent: float = times.user + times.system + times.children_user + times.children_system  # psutil: untyped
        return spent

    def job_cpu_seconds(self, sampled: float) -> float:
        """All the job's CPU so far: its cgroup's count where there is one (it counts every member, one that
        re-forked and ended too), else ``sampled`` (what ``sample`` counted of the tree and the processes it saw)."""
        counted = self.cgroup.cpu_seconds() if self.cgroup is not None else None
        return counted if counted is not None else sampled

    def proportional_memory(self, table: ProcessTable | None = None) -> int:
        """The tree's PSS: pages shared with the fork server or each other count by share. Exact but slow (the
        kernel walks every mapping, ~6 ms for a CrewAI process), so asked only when RSS is high."""
        return sum(_pss(process) for process in [psutil.Process(self.pid), *self.descendants(table)])

    def memory_view(self, table: ProcessTable) -> Callable[[], tuple[int | None, str]]:
        """What the job's memory is, as its cap measures it, as a reading to take off the loop (a PSS takes ms a
        process): the cgroup's charge where one caps it, else the PSS of the processes its tree has now."""
        cgroup = self.cgroup if self.cgroup is not None and self.cgroup.caps_memory else None
        if cgroup is not None:
            return lambda: (cgroup.memory_current(), "cgroup")
        processes = [psutil.Process(self.pid), *self.descendants(table)]
        return lambda: (sum(_pss(process) for process in processes), "pss")

    def sample(self, table: ProcessTable | None = None) -> Usage | None:
        """Measure the tree now; None once the worker is gone. Remembers every descendant it sees."""
        try:
            tree = [psutil.Process(self.pid), *self.descendants(table)]
        except psutil.NoSuchProcess:
            return None
        rss, alive, threads, tree_cpu, worker_cpu = 0, 0, 0, 0.0, 0.0
        self.members = tuple(tree)
        for process in tree:
            try:
                with process.oneshot():
                    rss += process.memory_info().rss
                    times = process.cpu_times()
                    threads += process.num_threads()
            except psutil.NoSuchProcess:
                continue
            own = times.user + times.system
            tree_cpu += own + times.children_user + times.children_system
            alive += 1
            if process.pid == self.pid:
                worker_cpu = own
            elif process.pid in self._seen or len(self._seen) < MAX_REMEMBERED:
                self._seen.setdefault(process.pid, process)
                self._cpu_seen[process.pid] = own
        # The tree now, with what its members reaped; or every process seen, ended ones too, each by its own time
        # (one that ended unreaped by the tree, as a relay's, counts only there): never one counted twice.
        sampled = max(tree_cpu, worker_cpu + sum(self._cpu_seen.values())) if alive else 0.0
        cpu_total = self.job_cpu_seconds(sampled)
        now = time.time()
        previous = self.usage
        elapsed = now - previous.sampled_at if previous else 0.0
        percent = max(cpu_total - previous.cpu_seconds, 0.0) / elapsed * 100 if previous and elapsed > 0 else 0.0
        self.usage = Usage(rss, round(cpu_total, 3), round(percent, 1), alive, threads, now)
        self.peak_rss = max(self.peak_rss, rss)
        return self.usage


def kill_remains(
    worker_pid: int | None,
    start_time: float | None,
    pgid: int | None,
    boundary: Boundary,
    before: float | None = None,
) -> list[psutil.Process]:
    """Kill everything a dead supervisor's job left: the worker if it is alive with its start time, every member
    of the job's cgroups, of its group (started after the worker), and every descendant a sample saw (by pid and
    start time). The processes signalled. A pid, or a group id, now another's is never signalled.

    ``before``: the cgroups may be a live process's too, one that took the pid of the dead supervisor that made them
    and is a supervisor (of another state: it names its directory the same); its jobs' processes all started after
    it, so only a member that started ``before`` is killed, and the directories stay (with ``cgroup.kill``, which
    would take its jobs too, not used)."""
    killed: dict[int, psutil.Process] = {}
    deadline = time.monotonic() + KILL_SECONDS
    cgroups = [path for path in map(Path, boundary.cgroups) if is_job_cgroup(path)]  # a journal is data
    while True:
        found = _remains(worker_pid, start_time, pgid, cgroups, boundary.tree, before)
        fresh = [process for process in found if process.pid not in killed]
        if before is None:  # v2: the kernel kills every member at once, one forked or reused meanwhile included
            for path in cgroups:
                kill_members(path)
        for process in fresh:
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                process.kill()  # psutil refuses a pid that now names another process
                killed[process.pid] = process
        if not fresh or time.monotonic() > deadline:
            break
    for path in cgroups if before is None else ():  # removable once the kernel has taken the killed out of it
        _wait_empty(path, deadline)
        remove_job_cgroup(path)
    return list(killed.values())


def _wait_empty(cgroup: Path, deadline: float) -> None:
    while members_of(cgroup) and time.monotonic() < deadline:
        time.sleep(0.005)


def _remains(
    worker_pid: int | None,
    start_time: float | None,
    pgid: int | None,
    cgroups: list[Path],
    tree: Iterable[tuple[int, float]],
    before: float | None,
) -> list[psutil.Process]:
    pids: dict[int, float | None] = dict(tree)
    member_of = {pid: path for path in cgroups for pid in members_of(path)}
    pids.update(dict.fromkeys(member_of, None))
    if worker_pid and start_time:
        pids[worker_pid] = start_time
        if pgid == worker_pid and _alive_as(worker_pid, start_time):
            for pid in ProcessTable.scan().groups.get(pgid, ()):
                pids.setdefault(pid, None)
    found = []
    for pid, started in pids.items():
        with contextlib.suppress(psutil.NoSuchProcess):
            process = psutil.Process(pid)
            created = process.create_time()
            # A member of the job's cgroup is the job's whoever it is, once identified (``holds``: a pid it listed
            # may be a stranger's by now); any other only if it is the very process.
            if started is not None:
                ours = created == started
            elif pid in member_of and not (holds(member_of[pid], pid) and (before is None or created < before)):
                ours = False
            else:
                ours = start_time is None or created >= start_time
            if ours and running(process):  # ``running``: still the process identified, after ``holds`` read
                found.append(process)
    return found


def _alive_as(pid: int, start_time: float) -> bool:
    """Whether the worker still exists (a zombie too): only then is its group's id surely still the job's. Once
    its group has emptied, the id may name a new group, long after a crash."""
    try:
        created: float = psutil.Process(pid).create_time()  # psutil is untyped
        return created == start_time
    except psutil.NoSuchProcess:
        return False


def _session(pid: int) -> int:
    """``pid``'s session; our own if it is gone (a worker stays in the session it was started in: ours)."""
    try:
        return os.getsid(pid)
    except OSError:
        return os.getsid(0)


def _table_without_tree(cgroup: JobCgroup | None) -> ProcessTable:
    """What ``leftovers`` reads: nothing is attached to an exited worker, so only its group needs the table, and
    only where no cgroup holds the job."""
    return NO_TABLE if cgroup is not None else ProcessTable(children={}, groups=ProcessTable.scan().groups)


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


def running(process: psutil.Process) -> bool:
    try:
        alive: bool = process.is_running() and process.status() != psutil.STATUS_ZOMBIE  # psutil is untyped
    except psutil.NoSuchProcess:
        return False
    return alive
