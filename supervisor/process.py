"""One worker process as the supervisor sees it: its pipes, its exit, and how to stop it for sure."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import os
import signal
import time
from collections.abc import Mapping
from typing import Any

import psutil

from protocol import FrameError, Message, pack
from supervisor.cgroups import PidsCgroup
from supervisor.pipes import QUEUE_HIGH, QUEUE_LOW, Frames, PipeEnds, Tail
from supervisor.reaper import Reaper, signal_group

CONFIRM_SECONDS = 5.0
MAX_REMEMBERED = 4096  # descendants remembered per worker (a fork bomb is capped well below this)


@dataclasses.dataclass(frozen=True)
class StopEvidence:
    """What a stop proved: recorded in the job's terminal event."""

    stop_confirmed: bool
    pid: int
    pgid: int
    signal: str
    exit_status: int | None
    descendants_killed: int
    elapsed_ms: float

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Usage:
    """One sample of a worker's tree: the worker and every descendant still running."""

    rss_bytes: int
    cpu_seconds: float  # user + system, reaped children included
    cpu_percent: float  # since the previous sample; 100 is one core
    processes: int
    threads: int  # in all processes: what a pids cgroup counts
    sampled_at: float  # wall clock


class WorkerProcess:
    """A launched worker: leads its own process group. Its exit status comes from the reaper
    (``Reaper.watch``), whoever's child it is."""

    def __init__(
        self, pid: int, pipes: PipeEnds, reaper: Reaper, exited: asyncio.Future[int | None], launched_by: str
    ) -> None:
        self.pid = pid
        self.launched_by = launched_by
        self.pgid = pid  # the worker called setsid: it leads its group
        self.create_time = psutil.Process(pid).create_time()
        self.stdout = Tail()
        self.stderr = Tail()
        self.usage: Usage | None = None  # the latest sample (see ``sample``)
        self.peak_rss = 0
        self.cpu_baseline: float | None = None  # CPU seconds used before the job began (a cold start's imports)
        self.cgroup: PidsCgroup | None = None  # set by the limits when the kernel offers one
        self._seen: dict[int, psutil.Process] = {}  # every descendant a sample found, by pid
        self.exited = exited
        self._reaper = reaper
        self._pipes = pipes
        self._messages: asyncio.Queue[Message | FrameError | None] = asyncio.Queue()
        self._frames = Frames(self._messages)
        self._control: asyncio.WriteTransport | None = None

    async def attach(self) -> None:
        """Start reading pipes without blocking the loop."""
        loop = asyncio.get_running_loop()
        await loop.connect_read_pipe(lambda: self._frames, os.fdopen(self._pipes.events, "rb", buffering=0))
        for fd, tail in ((self._pipes.stdout, self.stdout), (self._pipes.stderr, self.stderr)):
            await loop.connect_read_pipe(lambda tail=tail: tail, os.fdopen(fd, "rb", buffering=0))
        self._control, _ = await loop.connect_write_pipe(
            asyncio.Protocol, os.fdopen(self._pipes.control, "wb", buffering=0)
        )

    def send(self, message: Message) -> None:
        if self._control is not None and not self._control.is_closing():
            self._control.write(pack(message))

    def close_control(self) -> None:
        """The worker exits when it sees EOF here."""
        if self._control is not None:
            self._control.close()

    async def next_message(self) -> Message | FrameError | None:
        """The next message, a FrameError if the stream broke, or None at EOF."""
        message = await self._messages.get()
        if self._messages.qsize() <= QUEUE_LOW:
            self._frames.resume()
        return message

    async def trailing_messages(self, timeout: float) -> list[Message | FrameError]:
        """After the terminal message only EOF may come: whatever else arrives, until EOF or a quiet ``timeout``."""
        trailing: list[Message | FrameError] = []
        while len(trailing) < QUEUE_HIGH:  # enough to judge; the rest is not read
            try:
                message = await asyncio.wait_for(self.next_message(), timeout)
            except TimeoutError:
                break
            if message is None:
                break
            trailing.append(message)
        return trailing

    async def wait_exit(self, timeout: float) -> int | None:
        """The exit status; None if it is unknown or ``timeout`` passed first (see ``exited``)."""
        try:
            return await asyncio.wait_for(asyncio.shield(self.exited), timeout)
        except TimeoutError:
            return None

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

    def proportional_memory(self) -> int:
        """The tree's PSS: pages shared with the fork server or each other count by share. Exact but
        slow (the kernel walks every mapping, ~6 ms for a CrewAI process), so asked only when RSS is high."""
        total = 0
        for process in [psutil.Process(self.pid), *self.descendants()]:
            total += _pss(process)
        return total

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

    async def kill(self, grace: float = 0.0) -> StopEvidence:
        """Stop the worker's whole group and every descendant, then prove they are gone."""
        started = time.monotonic()
        # Snapshot first: a grandchild may have left the group with setsid.
        tree = self.descendants()
        sent = signal.SIGKILL
        if grace > 0 and not self.exited.done():
            signal_group(self.pgid, signal.SIGTERM)
            await self.wait_exit(grace)
            if self.exited.done():
                sent = signal.SIGTERM
        if not self.exited.done():
            signal_group(self.pgid, signal.SIGKILL)
        for process in tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()  # psutil refuses a pid that now names another process
        status = await self.wait_exit(CONFIRM_SECONDS)
        confirmed = self.exited.done() and await self._reaper.confirm_gone(tree, CONFIRM_SECONDS)
        self.close_control()
        return StopEvidence(
            stop_confirmed=confirmed,
            pid=self.pid,
            pgid=self.pgid,
            signal=signal.Signals(sent).name,
            exit_status=status,
            descendants_killed=len(tree),
            elapsed_ms=round((time.monotonic() - started) * 1000, 3),
        )


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


def kill_orphan(pid: int, start_time: float, pgid: int) -> bool:
    """Kill a worker left by an earlier supervisor; True if it was found. A reused pid is never signalled."""
    try:
        process = psutil.Process(pid)
        if process.create_time() != start_time:
            return False
        tree = [process, *process.children(recursive=True)]
    except psutil.NoSuchProcess:
        return False
    if pgid == pid:
        signal_group(pgid, signal.SIGKILL)
    for member in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            member.kill()
    psutil.wait_procs(tree, timeout=CONFIRM_SECONDS)
    return True
