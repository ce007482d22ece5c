"""Where every process of the supervisor's ends: each exit it sees, and every ``waitpid`` it makes.

Three kinds of process end here:

- **Children we spawned** (a cold-started worker, the fork server): ``register``-ed at spawn, watched
  through a pidfd, reaped here the moment they exit; ``watch`` gives the exit status.
- **A fork server's workers**: its children, not ours. The fork server reaps them and reports each
  exit status; their exit itself is seen here through a pidfd, and if the report never comes (the
  fork server died too) the status is unknown.
- **Orphans we adopted** as a child subreaper (a job's grandchild whose parent died): reaped by
  ``reap`` (called every second) or by ``confirm_gone`` when a kill waits for them. Registered
  children are never reaped this way: their status belongs to whoever watches them.

Every process we watch leads its own process group (a worker calls setsid; ``spawn_process`` starts
the fork server in a session of its own). When one exits, what it left in its group is killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import os
import signal
import time

import psutil

PR_SET_CHILD_SUBREAPER = 36
EXIT_REPORT_SECONDS = 1.0  # how long a fork server's exit report may lag the exit itself


def become_subreaper() -> None:
    """Adopt orphaned descendants, so a killed worker's grandchildren are ours to reap."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


@dataclasses.dataclass(eq=False)
class _Child:
    pidfd: int  # opened at spawn: the pid cannot name another process while we hold it
    exited: asyncio.Future[int | None] | None = None  # made by the first ``watch``


class Reaper:
    """Owns every ``waitpid`` of this process; one per supervisor, passed to what spawns or kills."""

    def __init__(self) -> None:
        self._children: dict[int, _Child] = {}
        self.adopted = 0  # orphans of ours still there after the last ``reap`` (running or not yet reaped)

    def register(self, pid: int) -> None:
        """``pid`` is a child we just spawned: reaped only where it is watched, never as an orphan."""
        self._children[pid] = _Child(os.pidfd_open(pid))

    def watch(self, pid: int, reported: asyncio.Future[int] | None = None) -> asyncio.Future[int | None]:
        """The exit status of ``pid`` once it has exited (on the running loop); None if unknown.

        A registered child is reaped here. Any other process (a fork server's worker) is reaped by
        its parent, whose word on the status is ``reported``: if that has not come within
        ``EXIT_REPORT_SECONDS`` of the exit, the status is None. Raises ProcessLookupError if an
        unregistered ``pid`` is already gone.
        """
        loop = asyncio.get_running_loop()
        child = self._children.get(pid)
        if child is not None:
            if child.exited is None:
                child.exited = loop.create_future()
                loop.add_reader(child.pidfd, self._on_exit, pid, child.pidfd, child.exited)
            return child.exited
        pidfd = os.pidfd_open(pid)
        exited: asyncio.Future[int | None] = loop.create_future()
        if reported is not None:
            reported.add_done_callback(lambda report: _settle(exited, None if report.cancelled() else report.result()))
        loop.add_reader(pidfd, self._on_exit, pid, pidfd, exited)
        return exited

    def _on_exit(self, pid: int, pidfd: int, exited: asyncio.Future[int | None]) -> None:
        loop = asyncio.get_running_loop()
        loop.remove_reader(pidfd)
        os.close(pidfd)
        # Until it is reaped the leader is a zombie and its pid (the group id) cannot be reused:
        # anything it left running in its group goes with it.
        signal_group(pid, signal.SIGKILL)
        if self._children.pop(pid, None) is not None:
            _, status = os.waitpid(pid, 0)
            _settle(exited, os.waitstatus_to_exitcode(status))
            return
        # Another's child (a fork server's worker), unless that parent died first and it became ours: then
        # nobody else will reap it or report its status.
        with contextlib.suppress(ChildProcessError):
            reaped, status = os.waitpid(pid, os.WNOHANG)
            if reaped:
                _settle(exited, os.waitstatus_to_exitcode(status))
                return
        loop.call_later(EXIT_REPORT_SECONDS, _settle, exited, None)

    def reap(self) -> int:
        """Reap adopted orphans that have exited (a job's daemonised grandchild, say): how many."""
        reaped = adopted = 0
        for child in psutil.Process().children():
            if child.pid in self._children:
                continue
            with contextlib.suppress(psutil.NoSuchProcess):
                if child.status() == psutil.STATUS_ZOMBIE and self._reap_adopted(child.pid):
                    reaped += 1
                else:
                    adopted += 1
        self.adopted = adopted
        return reaped

    async def confirm_gone(self, processes: list[psutil.Process], timeout: float) -> bool:
        """True once none of ``processes`` runs; reaps those that became our children (subreaper)."""
        deadline = time.monotonic() + timeout
        pending = list(processes)
        while pending:
            pending = [p for p in pending if not self._gone(p)]
            if not pending:
                return True
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.002)
        return True

    def _gone(self, process: psutil.Process) -> bool:
        try:
            if not process.is_running():  # compares start time too: a reused pid is not ours
                return True
            if process.status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            return True
        # Our child through the subreaper: reap it. Another parent's zombie is dead all the same.
        self._reap_adopted(process.pid)
        return True

    def _reap_adopted(self, pid: int) -> bool:
        """Reap ``pid`` if it is an exited orphan of ours; a registered child is left to its watcher."""
        if pid in self._children:
            return False
        try:
            return os.waitpid(pid, os.WNOHANG)[0] != 0
        except ChildProcessError:
            return False


def _settle(exited: asyncio.Future[int | None], status: int | None) -> None:
    if not exited.done():
        exited.set_result(status)


def signal_group(pgid: int, sig: int) -> None:
    """Signal a process group that may already be gone."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)
