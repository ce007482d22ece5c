"""Where every process of the supervisor's ends: each exit it sees, and every ``waitpid`` it makes.

Two kinds of process end here:

- **Our children** (a cold-started worker, the fork server, and a forked worker, which the fork server
  cloned as ours, or its middle process left to us): ``register``-ed when they are made, watched through a pidfd,
  reaped here the moment they exit; ``watch`` gives the exit status.
- **Orphans we adopted** as a child subreaper (a job's grandchild whose parent died): reaped by
  ``reap`` (called every second) or by ``confirm_gone`` when a kill waits for them. Registered
  children are never reaped this way: their status belongs to whoever watches them.

Every process we watch leads its own process group (a forked worker calls setpgid; ``spawn_process``
starts the others in a group of their own). When one exits, what it left in its group is killed; but a job's
worker's group is its job's to kill (``containment.Containment``), which counts what it kills.
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


def become_subreaper() -> None:
    """Adopt orphaned descendants, so a killed worker's grandchildren are ours to reap."""
    _subreaper(1)


def stop_being_subreaper() -> None:
    """Leave orphans to init again (for tests, which become one for a while)."""
    _subreaper(0)


def _subreaper(flag: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, flag, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


@dataclasses.dataclass(eq=False)
class _Child:
    pidfd: int  # opened at spawn: the pid cannot name another process while we hold it
    kill_group: bool  # at its exit, kill what it left in its group
    exited: asyncio.Future[int | None] | None = None  # made by the first ``watch``


class Reaper:
    """Owns every ``waitpid`` of this process; one per supervisor, passed to what spawns or kills."""

    def __init__(self) -> None:
        self._children: dict[int, _Child] = {}
        self.adopted = 0  # orphans of ours still there after the last ``reap`` (running or not yet reaped)
        # A forked worker in flight: ours once forked, registered once its pid is known.
        self.adopting = False

    def register(self, pid: int, kill_group: bool = True) -> None:
        """``pid`` is a child we just spawned: reaped only where it is watched, never as an orphan. Without
        ``kill_group`` what it leaves in its group at its exit is its caller's to kill (a job's worker)."""
        self._children[pid] = _Child(os.pidfd_open(pid), kill_group)

    def watch(self, pid: int) -> asyncio.Future[int | None]:
        """The exit status of ``pid``, a registered child, once it has exited (on the running loop)."""
        child = self._children[pid]
        if child.exited is None:
            loop = asyncio.get_running_loop()
            child.exited = loop.create_future()
            loop.add_reader(child.pidfd, self._on_exit, pid, child)
        return child.exited

    def _on_exit(self, pid: int, child: _Child) -> None:
        asyncio.get_running_loop().remove_reader(child.pidfd)
        os.close(child.pidfd)
        # Until it is reaped the leader is a zombie and its pid (the group id) cannot be reused:
        # anything it left running in its group goes with it.
        if child.kill_group:
            signal_group(pid, signal.SIGKILL)
        del self._children[pid]
        _, status = os.waitpid(pid, 0)
        if child.exited is not None and not child.exited.done():
            child.exited.set_result(os.waitstatus_to_exitcode(status))

    def reap(self) -> int:
        """Reap adopted orphans that have exited (a job's daemonised grandchild, say): how many. Not while
        a forked worker is in flight: it is our child before it is registered, and its status is its own."""
        if self.adopting:
            return 0
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


def signal_group(pgid: int, sig: int) -> None:
    """Signal a process group that may already be gone."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)
