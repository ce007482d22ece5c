"""The job core in this process: the real ``Supervisor`` (admission, runner, recorder, housekeeping), a real
journal in a temporary directory and real limits, with a ``Launcher`` whose workers are scripted processes
without CrewAI (``tests/helpers/scripted_worker.py``): every branch of a job's life in tens of milliseconds."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import sys
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any

import httpx
import orjson

from protocol import Registry
from supervisor import config
from supervisor.http.app import create_app
from supervisor.jobs.supervisor import Supervisor
from supervisor.journal.records import Job
from supervisor.journal.statefiles import prepare_directory, prepare_places
from supervisor.journal.store import Journal
from supervisor.layout import WORKER_PLACES
from supervisor.models import StartRequest
from supervisor.processes.launcher import LaunchError, SpawnLauncher
from supervisor.processes.limits import Limits
from supervisor.processes.process import WorkerProcess
from supervisor.processes.reaper import Reaper
from tests.conftest import ROOT

SCRIPTED_WORKER = ROOT / "tests/helpers/scripted_worker.py"
CREW = "scripted"
TOKEN = "core-test-token-0123456789"
DEADLINE = 60.0  # any one wait of a test: far above the ~0.1 s each takes, so only a hang reaches it
# A cancel returns once the kill is confirmed: its grace, then CONFIRM_SECONDS (5 s) at most; the rest is room
# for a machine at load 10. Below the jobs' default timeout, so a cancel that does nothing fails as such.
CANCEL_DEADLINE = 30.0


class ScriptedLauncher:
    """Spawns scripted workers, each playing its job's ``input["script"]``. ``gate`` held shut keeps every
    spawn waiting (its job stays launching); ``refusal`` makes the next spawns fail as a launcher's would."""

    name = "scripted"

    def __init__(self, reaper: Reaper, budgets: dict[str, Any], crews: tuple[str, ...] = (CREW,)) -> None:
        self.budgets = budgets  # the crews' own, as a registry would describe them
        self.crews = crews  # the registry's: each plays its job's script alike
        self._spawn = SpawnLauncher(reaper, [sys.executable, str(SCRIPTED_WORKER)])
        self.gate = asyncio.Event()
        self.gate.set()
        self.spawning = asyncio.Event()  # a spawn has begun
        self.refusal: str | None = None
        self.workers: list[WorkerProcess] = []

    async def describe(self, env: Mapping[str, str], cwd: str) -> Registry:
        return Registry(list(self.crews), [], budgets=self.budgets)

    def start(self) -> None:
        pass

    async def spawn(self, env: Mapping[str, str], cwd: str) -> WorkerProcess:
        self.spawning.set()
        await self.gate.wait()
        if self.refusal is not None:
            raise LaunchError(self.refusal)
        worker = await self._spawn.spawn(env, cwd)
        self.workers.append(worker)
        return worker

    async def stop(self) -> None:
        pass

    def health(self) -> dict[str, object]:
        return {}


@dataclasses.dataclass
class Core:
    sup: Supervisor
    launcher: ScriptedLauncher
    journal: Journal

    async def start(
        self, script: list[str], action_id: str = "job", timeout_ms: int = 60_000, crew: str = CREW, **extra: Any
    ) -> Job:
        """Admit a job of ``crew`` that plays ``script`` (``extra`` joins its input); raises the admission's refusal."""
        body = StartRequest(crew_id=crew, action_id=action_id, input={"script": script, **extra}, timeout_ms=timeout_ms)
        return await self.sup.admit(body, f"key-{action_id}", legacy=False)

    async def cancel(self, action_id: str = "job", reason: str | None = None) -> None:
        """Cancel, and return once the job is terminal: a cancel that never ends fails here, not at a hang guard."""
        async with asyncio.timeout(CANCEL_DEADLINE):
            await self.sup.cancel(action_id, reason)

    async def settled(self, action_id: str = "job") -> tuple[str, dict[str, Any]]:
        """The job's terminal event, once committed: its name and data."""
        assert await self.sup.runner.wait(action_id, DEADLINE), f"{action_id} did not end within {DEADLINE} s"
        name, data = self.events(action_id)[-1]
        assert name in ("completed", "failed", "cancelled"), f"{action_id} ended without a terminal event: {name}"
        return name, data

    def events(self, action_id: str = "job") -> list[tuple[str, dict[str, Any]]]:
        stored = self.journal.reader.stored_events(action_id, 0, 10_000, 1 << 30)
        return [(event.event, orjson.loads(event.data)) for event in stored]

    async def running(self, action_id: str = "job") -> None:
        """Until the job's ``started`` event has committed."""
        async with asyncio.timeout(DEADLINE):
            while not any(name == "started" for name, _ in self.events(action_id)):
                await asyncio.sleep(0.005)

    def http(self) -> httpx.AsyncClient:
        """The supervisor's app in this process, with its token: its routes without a socket."""
        transport = httpx.ASGITransport(app=create_app(self.sup))
        return httpx.AsyncClient(
            transport=transport, base_url="http://core", headers={"Authorization": f"Bearer {TOKEN}"}
        )

    async def phase_reached(self, action_id: str, phase: str) -> None:
        async with asyncio.timeout(DEADLINE):
            while (job := self.sup.roster.get(action_id)) is None or job.phase != phase:
                await asyncio.sleep(0.005)


def identity(it: Core, index: int = 0) -> tuple[int, float]:
    """A worker's pid and start time, as read while it lived: ``gone`` on them is never true of a pid that never was."""
    worker = it.launcher.workers[index]
    return worker.pid, worker.create_time


def settings(journal: Path, **overrides: str) -> config.Settings:
    environ = {"AIP_CREWAI_REGISTRY": "scripted:registry", "AIP_CREWAI_STATE_FILE": str(journal)}
    environ |= {"AIP_CREWAI_BEARER_TOKEN": TOKEN}
    environ |= {"AIP_CREWAI_CGROUPS": "off"}  # the test process's own cgroup stays as it is
    environ |= {f"AIP_CREWAI_{name.upper()}": value for name, value in overrides.items()}
    return config.load({}, environ)


@contextlib.asynccontextmanager
async def core(
    tmp: Path, budgets: dict[str, Any] | None = None, crews: tuple[str, ...] = (CREW,), **overrides: str
) -> AsyncIterator[Core]:
    """A supervisor opened over ``tmp`` serving ``crews`` (``budgets``: their own, as a registry would describe
    them), stopped (every job ended, every worker gone) on the way out."""
    state = tmp / "state"
    prepare_directory(state)
    prepare_places(state, WORKER_PLACES)
    chosen = settings(state / "journal.db", **overrides)

    def launcher_for(reaper: Reaper, limits: Limits) -> ScriptedLauncher:
        return ScriptedLauncher(reaper, budgets or {}, crews)

    async with Supervisor.open(chosen, state / "journal.db", launcher_for) as sup:
        assert isinstance(sup.launcher, ScriptedLauncher)
        yield Core(sup, sup.launcher, sup.journal)


def in_loop(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """A coroutine test, run in a loop of its own."""

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))

    return run
