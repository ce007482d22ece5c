"""Warm starts: a fork server that has imported CrewAI and the registry forks each job's worker.

Each worker is forked as our child (the fork server clones it with ``CLONE_PARENT``, or where it cannot, forks it
through a middle process that leaves at once: we are a subreaper), not the fork server's: we reap it and read its
exit status, watch it through a pidfd, kill its group and confirm it gone exactly as for a spawned worker, and the
fork server's death takes none.
If the fork server dies or refuses, jobs fall back to cold spawning while a new one starts. One that
cannot warm CrewAI (a CrewAI release changed what warming relies on) refuses at start, in one line we
log; it would refuse again, so workers are then spawned cold for the supervisor's whole life.

Workers forked ahead of demand (``prefork``): a few idle workers wait, each on its own pipes, for a
Start that carries the job's environment and directory (they were forked with the fork server's).
Their limits are applied while they wait (a pids cgroup takes ~13 ms to join on cgroup v1), so a job
takes the oldest already bounded; it then goes through what any new worker does (pid journaled,
watched by the reaper) and the pool is refilled after. No worker is ever given a second job.
Idle workers die with us (PDEATHSIG, and their control pipes close); they outlive a fork server that
dies, and its replacement only tops the pool up.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

import psutil

from protocol import (
    CONTROL_FD,
    MAX_FRAME_BYTES,
    Failed,
    Fork,
    Forked,
    FrameError,
    MessageReader,
    Mode,
    Reason,
    Refused,
    Registry,
    command_line,
    pack,
)
from supervisor.enums import LauncherName
from supervisor.processes.launcher import DESCRIBE_SECONDS, LaunchError, SpawnLauncher, spawn_process
from supervisor.processes.limits import Limits
from supervisor.processes.pipes import PipeEnds, make_pipes
from supervisor.processes.process import WorkerProcess
from supervisor.processes.reaper import Reaper

log = logging.getLogger("crew_supervisor.forkserver")
FORK_SECONDS = 10.0
STOP_SECONDS = 5.0  # how long the fork server may take to leave once its socket closes
SOCKET_FD = CONTROL_FD  # the fork server's control channel is its socket
PF_EXITING = 0x4  # /proc/<pid>/stat flags: the process is in exit


class ForkServerLauncher:
    name = LauncherName.FORKSERVER

    def __init__(self, fallback: SpawnLauncher, prefork: int = 0, limits: Limits | None = None) -> None:
        self.fallback = fallback
        self.prefork = prefork
        self.limits = limits  # applied to idle workers as they are forked, released if they never work
        self._idle: list[WorkerProcess] = []  # forked ahead of demand, oldest first
        self._filling: asyncio.Task[None] | None = None
        self.restarts = 0
        self._server: _ForkServer | None = None
        self._env: Mapping[str, str] = {}
        self._cwd = "/"
        self._replacing: asyncio.Task[None] | None = None
        self._stopping = False
        self.refused: str | None = None  # why it could not warm: then every worker is spawned cold

    @property
    def alive(self) -> bool:
        return self._server is not None and self._server.alive

    async def describe(self, env: Mapping[str, str], cwd: str) -> Registry:
        """Starts the fork server; its first word describes the registry."""
        self._env, self._cwd = env, cwd
        try:
            self._server = await self._start()
        except _Refused as exc:
            self.refused = str(exc)
            log.error("fork server refused to start, workers will be spawned cold: %s", exc)
            return await self.fallback.describe(env, cwd)
        return self._server.registry

    @property
    def idle_workers(self) -> int:
        return sum(not worker.exited.done() for worker in self._idle)

    def start(self) -> None:
        if self._server is not None:
            self._refill()

    async def spawn(self, env: Mapping[str, str], cwd: str) -> WorkerProcess:
        idle = await self._take()  # whether or not the fork server that forked it still lives
        if idle is not None:
            self._refill()
            return idle
        if self.refused is not None:
            return await self.fallback.spawn(env, cwd)
        server = self._server
        if server is not None and server.alive:
            try:
                return await server.fork(env, cwd, prefault=False)
            except _Unavailable as exc:
                log.warning("fork server unavailable (%s); spawning cold while it is replaced", exc)
        self._replace()
        return await self.fallback.spawn(env, cwd)

    def health(self) -> dict[str, object]:
        forkserver = {"alive": self.alive, "restarts": self.restarts, "idle_workers": self.idle_workers}
        warmed = self._server.registry.warmed if self._server is not None else {}
        return {"forkserver": {**forkserver, "refused": self.refused, "warmed": warmed}}

    async def stop(self) -> None:
        self._stopping = True
        tasks = [task for task in (self._replacing, self._filling) if task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)  # a worker they were forking is discarded
        await self._drop_idle()
        if self._server is not None:
            await self._server.stop()

    async def _start(self) -> _ForkServer:
        # Replaced as soon as it is seen dead, not at the next job.
        return await _ForkServer.spawn(self.fallback.reaper, self.fallback.argv, self._env, self._cwd, self._replace)

    def _replace(self) -> None:
        if self._stopping:
            return
        if self._replacing is None or self._replacing.done():
            self._replacing = _detached(self._restart(), "forkserver-restart")

    async def _take(self) -> WorkerProcess | None:
        """The oldest idle worker still waiting, out of the pool for good. Asked of the kernel, not only
        of our watchers: one killed a moment ago may not have been seen exiting yet."""
        while self._idle:
            worker = self._idle.pop(0)
            if _waiting(worker):
                return worker
            await self._discard(worker)
        return None

    def _refill(self) -> None:
        """Fork up to ``prefork`` idle workers, off the hot path: a task, one fork at a time."""
        if self.prefork and not self._stopping and (self._filling is None or self._filling.done()):
            self._filling = _detached(self._fill(), "prefork")

    async def _fill(self) -> None:
        while not self._stopping and self.idle_workers < self.prefork:
            server = self._server
            if server is None or not server.alive:
                return  # a replacement refills once it is up
            try:
                worker = await server.fork(self._env, self._cwd, prefault=True)
            except (_Unavailable, LaunchError) as exc:
                log.warning("could not fork an idle worker: %s", exc)
                return
            try:
                if self.limits is not None:
                    await self.limits.apply(worker)
            except BaseException:  # cancelled (we are stopping): it must not outlive the pool it was for
                await self._discard(worker)
                raise
            if self._stopping or server is not self._server:
                await self._discard(worker)
                return
            self._idle.append(worker)

    async def _drop_idle(self) -> None:
        """Kill every idle worker and confirm it gone."""
        idle, self._idle = self._idle, []
        await asyncio.gather(*(self._discard(worker) for worker in idle), return_exceptions=True)

    async def _discard(self, worker: WorkerProcess) -> None:
        """An idle worker that will never work: killed, confirmed gone, its limits released."""
        await worker.kill()
        if self.limits is not None:
            self.limits.release(worker)

    async def _restart(self) -> None:
        if self._server is not None:
            await self._server.stop()
        try:
            self._server = await self._start()
        except _Refused as exc:
            self.refused = str(exc)
            log.error("fork server refused to start, workers will be spawned cold: %s", exc)
            return
        except LaunchError as exc:
            log.error("fork server did not restart: %s", exc)
            return
        self.restarts += 1
        log.warning("fork server restarted (pid %d)", self._server.pid)
        self._refill()


class _Unavailable(Exception):
    pass


class _Refused(LaunchError):
    """It could not warm CrewAI and will not serve: not worth restarting."""


@dataclasses.dataclass(eq=False)
class _ForkServer:
    reaper: Reaper
    pid: int
    channel: socket.socket
    registry: Registry
    on_death: Callable[[], None]  # it was seen dead: called once, on the loop
    alive: bool = True
    _lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)
    _pending: asyncio.Future[int] | None = None  # the reply to the fork in flight: the new worker's pid
    _exited: asyncio.Future[int | None] | None = None  # its own exit, watched once it is stopped

    @classmethod
    async def spawn(
        cls, reaper: Reaper, argv: list[str], env: Mapping[str, str], cwd: str, on_death: Callable[[], None]
    ) -> _ForkServer:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        command = command_line(argv, Mode.FORKSERVER, os.getpid(), cwd)
        try:
            # Its stdout and stderr are ours: what it says while importing belongs in our log.
            pid = spawn_process(
                reaper,
                command,
                env,
                {0: null, 1: sys.stdout.fileno(), 2: sys.stderr.fileno(), SOCKET_FD: theirs.fileno()},
            )
        finally:
            theirs.close()
            os.close(null)
        ours.setblocking(False)
        try:
            async with asyncio.timeout(DESCRIBE_SECONDS):
                data = await asyncio.get_running_loop().sock_recv(ours, MAX_FRAME_BYTES)
            answer = MessageReader().feed(data)
        except asyncio.CancelledError:  # the supervisor stops during start-up: no import is worth waiting for
            ours.close()
            os.kill(pid, signal.SIGKILL)  # not yet reaped, so the pid is still its own
            await reaper.watch(pid)
            raise
        except (TimeoutError, FrameError, OSError) as exc:
            answer = [
                Failed(
                    error_type="fork_server",
                    reason=Reason.LAUNCH_FAILED,
                    message=f"no registry from the fork server: {exc}",
                    uncertain_outcome=False,
                )
            ]
        if len(answer) != 1 or not isinstance(answer[0], Registry):
            ours.close()
            await _wait_or_kill(reaper.watch(pid), pid)
            failed = answer[0] if answer and isinstance(answer[0], Failed) else None
            if failed is not None and failed.reason == Reason.WARMUP_FAILED:
                raise _Refused(failed.message)
            raise LaunchError(failed.message if failed is not None else "it exited")
        server = cls(reaper, pid, ours, answer[0], on_death)
        asyncio.get_running_loop().add_reader(ours.fileno(), server._on_readable)  # its replies, and its death
        return server

    async def fork(self, env: Mapping[str, str], cwd: str, prefault: bool) -> WorkerProcess:
        async with self._lock:  # one request in flight: replies come in order
            if not self.alive:
                raise _Unavailable("it exited")
            ours, theirs = make_pipes()
            pending = self._pending = asyncio.get_running_loop().create_future()
            # Our child from its clone (or its middle process leaving), before the reply: not an orphan to reap.
            self.reaper.adopting = True
            try:
                worker = await self._exchange(ours, theirs, pending, Fork(env=dict(env), cwd=cwd, prefault=prefault))
            except BaseException:
                ours.close()  # a worker forked anyway sees EOF on its control pipe and leaves
                raise
            finally:
                self.reaper.adopting = False
        await worker.attach()
        return worker

    async def _exchange(
        self, ours: PipeEnds, theirs: PipeEnds, pending: asyncio.Future[int], request: Fork
    ) -> WorkerProcess:
        """Send ``request`` with the worker's pipe ends; the worker, once its pid comes back."""
        try:
            socket.send_fds(self.channel, [pack(request)], dataclasses.astuple(theirs))
        except OSError as exc:
            self._die()
            raise _Unavailable(str(exc)) from None
        finally:
            theirs.close()
        try:
            pid = await asyncio.wait_for(pending, FORK_SECONDS)
        except (TimeoutError, _Unavailable) as exc:
            self._die()
            raise _Unavailable(str(exc) or "no answer") from None
        if pid == 0:  # the kernel refused a fork (a process or memory limit): this worker only
            raise LaunchError("the fork server could not fork")
        try:
            self.reaper.register(pid, kill_group=False)  # a job's worker: its group is its containment's
        except OSError as exc:
            raise LaunchError(f"forked worker {pid} died at once") from exc
        return WorkerProcess(pid, ours, self.reaper, self.reaper.watch(pid), LauncherName.FORKSERVER)

    def _on_readable(self) -> None:
        while self.alive:
            try:
                data = self.channel.recv(MAX_FRAME_BYTES)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self._die()
                return
            try:
                messages = MessageReader().feed(data)
            except FrameError:
                self._die()
                return
            for message in messages:
                self._dispatch(message)

    def _dispatch(self, message: object) -> None:
        if isinstance(message, Forked) and self._pending is not None and not self._pending.done():
            self._pending.set_result(message.pid)
        else:
            reason = message.reason if isinstance(message, Refused) else f"unexpected {type(message).__name__}"
            log.warning("fork server misbehaved: %s", reason)
            self._die()

    def _die(self) -> None:
        if not self.alive:
            return
        self.alive = False
        with contextlib.suppress(Exception):
            asyncio.get_running_loop().remove_reader(self.channel.fileno())
        if self._pending is not None and not self._pending.done():
            self._pending.set_exception(_Unavailable("the fork server exited"))
        self.channel.close()
        self.on_death()

    async def stop(self) -> None:
        """Closing the socket ends it (its workers are ours, and stay)."""
        self._die()
        if self._exited is None:  # stopped twice (a restart cancelled by close): one watch
            self._exited = self.reaper.watch(self.pid)
        await _wait_or_kill(self._exited, self.pid)


def _detached(work: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
    """A task of the launcher's own, in a context of its own: asked for from a job's spawn (a refill, a restart),
    it is no part of that job, and outlives it. A task copies its starter's context, where the job's trace is
    current: its lines (a fork that failed, a restart) would carry the job's trace id, and so would the readers
    it registers (a new fork server's socket), for the rest of the supervisor's life."""
    return asyncio.get_running_loop().create_task(work, name=name, context=contextvars.Context())


def _waiting(worker: WorkerProcess) -> bool:
    """The worker is the one we forked, and is neither dead nor exiting."""
    if worker.exited.done():
        return False
    try:
        same = psutil.Process(worker.pid).create_time() == worker.create_time
    except psutil.NoSuchProcess:
        return False
    return same and _not_exiting(worker.pid)


def _not_exiting(pid: int) -> bool:
    """Neither dead, nor exiting, nor with a SIGKILL pending: what /proc says the moment ``kill`` returns."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        with open(f"/proc/{pid}/status", "rb") as status:
            lines = status.read().splitlines()
    except (OSError, IndexError):
        return False
    state, flags = fields[0], int(fields[6])
    if state in (b"Z", b"X", b"x") or flags & PF_EXITING:
        return False
    pending = 0
    for line in lines:
        if line.startswith((b"SigPnd:", b"ShdPnd:")):
            pending |= int(line.split()[1], 16)
    return not pending & (1 << (signal.SIGKILL - 1))


async def _wait_or_kill(exited: asyncio.Future[int | None], pid: int) -> None:
    """It leaves on EOF of its socket; past ``STOP_SECONDS`` it is killed. Either way the reaper reaps it."""
    try:
        await asyncio.wait_for(asyncio.shield(exited), STOP_SECONDS)
    except TimeoutError:
        os.kill(pid, signal.SIGKILL)  # not yet reaped, so the pid is still its own
        await exited
