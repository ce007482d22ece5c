"""How workers come to exist. The interface lets a fork server replace cold spawning later."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Mapping
from typing import Protocol as Interface

from protocol import Failed, FrameError, Hello, Registry
from supervisor.process import WorkerProcess

DESCRIBE_SECONDS = 180.0


class LaunchError(Exception):
    pass


class Launcher(Interface):
    name: str

    async def spawn(self, env: Mapping[str, str], cwd: str) -> WorkerProcess: ...

    async def describe(self, env: Mapping[str, str], cwd: str) -> list[str]: ...


class SpawnLauncher:
    """A fresh interpreter per job (``python -m worker``): slow to start, nothing shared."""

    name = "spawn"

    def __init__(self, argv: list[str] | None = None) -> None:
        self.argv = argv or [sys.executable, "-m", "worker"]

    async def spawn(self, env: Mapping[str, str], cwd: str) -> WorkerProcess:
        return await self._launch("job", env, cwd)

    async def describe(self, env: Mapping[str, str], cwd: str) -> list[str]:
        """The crew ids of the configured registry, read by a worker so we never import crewai."""
        worker = await self._launch("describe", env, cwd)
        try:
            async with asyncio.timeout(DESCRIBE_SECONDS):
                hello = await worker.next_message()
                answer = await worker.next_message()
        except TimeoutError:
            answer = None
            hello = None
        finally:
            await worker.kill()
        if isinstance(answer, Registry) and isinstance(hello, Hello):
            return answer.crews
        if isinstance(answer, Failed):
            raise LaunchError(answer.message)
        detail = worker.stderr.text().strip().splitlines()[-1:] or ["no output"]
        if isinstance(answer, FrameError):
            raise LaunchError(f"worker broke the protocol: {answer}")
        raise LaunchError(f"worker did not describe the registry: {detail[0]}")

    async def _launch(self, mode: str, env: Mapping[str, str], cwd: str) -> WorkerProcess:
        control_r, control_w = os.pipe()
        event_r, event_w = os.pipe()
        argv = [
            *self.argv,
            mode,
            "--event-fd",
            str(event_w),
            "--control-fd",
            str(control_r),
            "--parent-pid",
            str(os.getpid()),
        ]
        try:
            # Spawned from the loop's thread: PDEATHSIG follows the creating thread, which lives on.
            popen = subprocess.Popen(
                argv,
                pass_fds=(control_r, event_w),
                start_new_session=True,
                env=dict(env),
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        except OSError as exc:
            for fd in (control_r, control_w, event_r, event_w):
                os.close(fd)
            raise LaunchError(f"cannot start worker: {exc}") from exc
        os.close(control_r)
        os.close(event_w)
        worker = WorkerProcess(popen, control_w, event_r)
        await worker.attach()
        return worker
