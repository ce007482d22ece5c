"""How workers come to exist: cold spawning here, a fork server in ``forkserver.py``.

Either way a worker starts leading its own process group (in our session), with its control pipe
on fd 3, its event pipe on fd 4 and its stdout/stderr on pipes of their own.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import sys
from collections.abc import Mapping
from typing import Protocol as Interface

from protocol import CONTROL_FD, EVENT_FD, Failed, FrameError, Hello, Message, Mode, Registry, command_line
from supervisor.enums import LauncherName
from supervisor.processes.pipes import make_pipes
from supervisor.processes.process import WorkerProcess
from supervisor.processes.reaper import Reaper

DESCRIBE_SECONDS = 180.0


class LaunchError(Exception):
    pass


class Launcher(Interface):
    name: LauncherName

    async def describe(self, env: Mapping[str, str], cwd: str) -> Registry:
        """What the registry offers; a registry that cannot load raises LaunchError with its error."""
        ...

    def start(self) -> None:
        """Begin serving spawns, once the supervisor is open (a fork server forks ahead of demand from then on)."""
        ...

    async def spawn(self, env: Mapping[str, str], cwd: str) -> WorkerProcess: ...

    async def stop(self) -> None: ...

    def health(self) -> dict[str, object]:
        """Extra fields for /health."""
        ...


def spawn_process(
    reaper: Reaper, argv: list[str], env: Mapping[str, str], fds: Mapping[int, int], kill_group: bool = True
) -> int:
    """posix_spawn ``argv`` leading a new process group, with exactly ``fds`` (target: source) open; ``reaper``
    reaps it (``kill_group``: see ``Reaper.register``).

    In our session, not a new one: where the kernel groups scheduling by session (autogroup), a session of
    its own would weigh as much as ours whatever its nice value, so ``WORKER_NICE`` would not hold. Called
    from the loop's thread: PDEATHSIG follows the creating thread, which lives as long as we do.
    """
    # Move sources clear of the targets first, so placing one never clobbers another.
    moved = {target: fcntl.fcntl(source, fcntl.F_DUPFD_CLOEXEC, 10) for target, source in fds.items()}
    try:
        actions = [(os.POSIX_SPAWN_DUP2, source, target) for target, source in moved.items()]
        pid = os.posix_spawn(argv[0], argv, dict(env), file_actions=actions, setpgroup=0)
        reaper.register(pid, kill_group)
        return pid
    except OSError as exc:
        raise LaunchError(f"cannot start {argv[0]}: {exc.strerror}") from None
    finally:
        for fd in moved.values():
            os.close(fd)


class SpawnLauncher:
    """A fresh interpreter per job (``python -m worker``): seconds to start, nothing shared."""

    name = LauncherName.SPAWN

    def __init__(self, reaper: Reaper, argv: list[str] | None = None) -> None:
        self.reaper = reaper
        # -s: no user site-packages. A worker's HOME is its crew's, which its jobs may write: a .pth file planted in
        # ~/.local/lib/pythonX.Y/site-packages would run in the crew's next cold worker before it gives up anything.
        self.argv = argv or [sys.executable, "-s", "-m", "worker"]

    async def describe(self, env: Mapping[str, str], cwd: str) -> Registry:
        """Asked of a worker, so the supervisor never imports crewai."""
        worker = await self.launch(Mode.DESCRIBE, env, cwd)
        try:
            async with asyncio.timeout(DESCRIBE_SECONDS):
                answer = await expect_registry(worker)
        except TimeoutError:
            raise LaunchError(f"no answer from the registry within {DESCRIBE_SECONDS:.0f} s") from None
        finally:
            await worker.kill()
        return answer

    def start(self) -> None:
        pass

    async def spawn(self, env: Mapping[str, str], cwd: str) -> WorkerProcess:
        return await self.launch(Mode.JOB, env, cwd)

    async def stop(self) -> None:
        pass

    def health(self) -> dict[str, object]:
        return {}

    async def launch(self, mode: Mode, env: Mapping[str, str], cwd: str, *args: str) -> WorkerProcess:
        """``python -m worker <mode>`` (``job``, ``describe`` or ``check``) with ``args``, its pipes being read."""
        ours, theirs = make_pipes()
        null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        argv = command_line(self.argv, mode, os.getpid(), cwd, *args)
        try:
            fds = {0: null, 1: theirs.stdout, 2: theirs.stderr, CONTROL_FD: theirs.control, EVENT_FD: theirs.events}
            # A job's worker leaves its group to its job's containment, which counts what it kills.
            pid = spawn_process(self.reaper, argv, env, fds, kill_group=mode is not Mode.JOB)
        except LaunchError:
            ours.close()
            raise
        finally:
            theirs.close()
            os.close(null)
        worker = WorkerProcess(pid, ours, self.reaper, self.reaper.watch(pid), self.name)
        await worker.attach()
        return worker


async def expect_registry(worker: WorkerProcess) -> Registry:
    """Hello, then the registry's description; anything else is a LaunchError saying what came."""
    hello = await worker.next_message()
    answer: Message | FrameError | None = await worker.next_message() if isinstance(hello, Hello) else hello
    if isinstance(answer, Registry):
        return answer
    if isinstance(answer, Failed):
        raise LaunchError(answer.message)
    if isinstance(answer, FrameError):
        raise LaunchError(f"worker broke the protocol: {answer}")
    detail = worker.stderr.text().strip().splitlines()[-1:] or ["no output"]
    raise LaunchError(f"worker did not describe the registry: {detail[0]}")
