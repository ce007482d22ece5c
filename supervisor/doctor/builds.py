"""What the workers will meet: the registry and each crew's factory, the fork server's warm-up, and CrewAI's
network switches.

The registry is loaded, the fork server's warm-up rehearsed (our own crews, offline and, unless
``WARMUP=offline``, on each installed provider against a provider of its own on loopback) and every crew
built in a worker process (``python -m worker check``), as the supervisor learns its crews (``python -m
worker describe``): the supervisor never imports CrewAI.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from protocol import CREW, CREWAI_SWITCHES, NOT_A_FACTORY, QUIET_CREWAI, Built, Mode, Registry, factory_fix
from supervisor.config import PREFIX, ConfigError, Settings
from supervisor.doctor import crewenv, host
from supervisor.doctor.findings import Finding, ok, problem, warning
from supervisor.enums import LauncherName
from supervisor.jobs.environment import worker_env
from supervisor.journal.statefiles import prepare_places
from supervisor.layout import WORKER_PLACES
from supervisor.processes import reach
from supervisor.processes.launcher import LaunchError, SpawnLauncher, expect_registry
from supervisor.processes.process import WorkerProcess
from supervisor.processes.reaper import Reaper

BUILD_SECONDS = 180.0  # importing CrewAI alone takes 5-7 s here, far longer on a loaded machine
# What CrewAI 1.15 reads as "off" for each of its switches (protocol.CREWAI_SWITCHES): telemetry takes the usual
# yes-words; tracing is off only at an explicit "false" or "0" (else a prompt or the user's stored consent decides);
# the version check is skipped only at "true" or "1".
OFF = {
    "CREWAI_DISABLE_TELEMETRY": ("true", "1", "yes", "on"),
    "CREWAI_TRACING_ENABLED": ("false", "0"),
    "CREWAI_DISABLE_VERSION_CHECK": ("true", "1"),
}


def telemetry(environ: Mapping[str, str] = os.environ) -> list[Finding]:
    """Each of CrewAI's switches as a worker sees it: the operator's value if set, else the one the worker sets.
    ``OTEL_SDK_DISABLED`` is not the operator's to get wrong: no ``OTEL_*`` variable reaches a worker (they set the
    supervisor's own tracing: ``jobs/environment.py``), so every worker sets it true for itself."""
    found = [
        problem(
            "telemetry",
            f"{name}={environ[name]!r} in the environment turns CrewAI's network calls on in every worker",
            f"unset {name} (the worker then sets {name}={wanted}) or set it to {wanted}",
        )
        for name, wanted in CREWAI_SWITCHES.items()
        if environ.get(name, wanted).lower() not in OFF[name]
    ]
    return found or [ok("telemetry", f"off in the workers: {', '.join(QUIET_CREWAI)}")]


def runtime(settings: Settings) -> list[Finding]:
    """With ``WORKER_USER``: whether a worker still imports what it needs once it took that uid, as serve checks
    it at start (``reach.check``); nothing to say without it."""
    if settings.worker_ids is None:
        return []
    state = Path(settings.state_file).absolute().parent if settings.state_file else Path(tempfile.gettempdir())
    try:
        reach.check(settings, worker_env(settings, state, ""))
    except ConfigError as exc:
        return [problem("runtime", str(exc), exc.fix)]
    what = "the standard library, this environment's packages and crew-supervisor, and finds the registry's module"
    return [ok("runtime", f"a worker of {sys.executable} as uid {settings.worker_ids[0]} imports {what}")]


def built(settings: Settings) -> list[Finding]:
    """Load the registry, rehearse the warm-up and build each crew once, offline and with telemetry off
    whatever the environment says, in a worker of the workers' user, with a HOME and CrewAI storage thrown
    away after."""
    with tempfile.TemporaryDirectory(prefix="crew-supervisor-doctor-") as place:
        if settings.worker_ids is not None:
            os.chown(place, *settings.worker_ids)
        prepare_places(Path(place), WORKER_PLACES, settings.worker_ids)  # the places its sandbox lets it change
        env = {**worker_env(settings, Path(place), ""), **QUIET_CREWAI}
        return asyncio.run(_build(settings, env, place))


def warmed(settings: Settings, warmth: Mapping[str, Any]) -> Finding:
    """What the fork server's warm-up warms (``worker.warmup.Warmth``), as the check worker rehearsed it."""
    if settings.launcher != LauncherName.FORKSERVER:
        return ok("warm-up", f"not used: {PREFIX}LAUNCHER={settings.launcher} starts a fresh interpreter per job")
    if "refused" in warmth:
        fix = "report it with your CrewAI version: jobs still run, each in a fresh interpreter (seconds to start)"
        return warning("warm-up", f"the fork server would refuse to start: {warmth['refused']}", fix)
    paths = ", ".join(["CrewAI offline", *warmth["paths"]])
    skipped = "; ".join(f"{name}: {why}" for name, why in warmth["not_warmed"].items())
    contexts = f"{warmth['tls_contexts']} TLS contexts parsed before the fork"
    return ok("warm-up", f"warms {paths}; {contexts}" + (f"; not warmed: {skipped}" if skipped else ""))


@dataclasses.dataclass
class Checked:
    """What a check worker said: the registry's crews, each build's error ("": it built), or why it said nothing."""

    listed: list[str] = dataclasses.field(default_factory=list)
    built: dict[str, str] = dataclasses.field(default_factory=dict)
    described: Registry | None = None
    error: str = ""


async def _check(env: Mapping[str, str], cwd: str, only: str | None = None) -> Checked:
    """A check worker's builds: every crew, or (``only``) that crew alone."""
    checked = Checked()
    worker: WorkerProcess | None = None
    try:
        async with asyncio.timeout(BUILD_SECONDS):
            worker = await SpawnLauncher(Reaper()).launch(Mode.CHECK, env, cwd, *((CREW, only) if only else ()))
            checked.described = await expect_registry(worker)
            checked.listed = checked.described.crews
            while len(checked.built) < (1 if only else len(checked.listed)):
                message = await worker.next_message()
                if not isinstance(message, Built):  # it exited (None), or broke the protocol
                    said = worker.stderr.text().strip().splitlines()[-1:] or [str(message)]
                    raise LaunchError(f"the worker stopped while building it: {said[0]}")
                checked.built[message.crew_id] = message.error
    except (LaunchError, TimeoutError) as exc:
        error = str(exc) or f"no answer within {BUILD_SECONDS:.0f} s"
        if checked.listed:  # the registry loaded: the crew being built broke the worker, or hung
            checked.built[only or checked.listed[len(checked.built)]] = error
        else:
            checked.error = error
    finally:
        if worker is not None:
            await worker.kill()
    return checked


async def _build(settings: Settings, env: Mapping[str, str], cwd: str) -> list[Finding]:
    """Every crew built once without an env file; then each crew that has one built again, alone, in a worker
    launched with it, as its jobs are (a crew that reads its key when built needs it)."""
    spec = settings.registry
    checked = await _check(env, cwd)
    if checked.described is None or checked.error:
        error = checked.error
        return [problem("registry", f"the workers cannot load the registry: {error}", _fix_registry(spec, error))]
    rehearsed = [warmed(settings, checked.described.warmed), host.containment(settings, checked.described.contained)]
    rehearsed.append(host.sandbox(settings, checked.described.sandbox))
    files = crewenv.read(settings, checked.listed)
    built = {crew_id: error for crew_id, error in checked.built.items() if crew_id not in files.broken}
    for crew_id, variables in files.usable.items():
        if crew_id in built:
            alone = await _check({**worker_env(settings, Path(cwd), crew_id, variables), **QUIET_CREWAI}, cwd, crew_id)
            built[crew_id] = alone.error or alone.built.get(crew_id, "its worker built no such crew")
    good = [crew_id for crew_id, error in built.items() if not error]
    summary = f"{spec}: {len(good)} of {len(checked.listed)} crews build ({', '.join(good) or 'none'})"
    if untried := [crew_id for crew_id in checked.listed if crew_id not in checked.built]:
        detail = f"{summary}; not tried after the one that stopped the worker: {', '.join(untried)}"
        head = warning("registry", detail, "fix that crew, then run the doctor again")
    else:
        head = ok("registry", summary)
    return [
        head,
        *(
            problem("crew", f"crew {crew_id!r} does not build: {error}", _fix_crew(spec, crew_id, error))
            for crew_id, error in built.items()
            if error
        ),
        *files.findings,
        *rehearsed,
    ]


def _fix_crew(spec: str, crew_id: str, error: str) -> str:
    """The fix a job of that crew names too, for a value that is no factory (worker/registry.py's words)."""
    if NOT_A_FACTORY in error:
        return factory_fix(crew_id)
    return f"correct its factory in {spec.partition(':')[0]}: every job of that crew fails until then"


def _fix_registry(spec: str, error: str) -> str:
    """The fix for what went wrong (worker/registry.py's words), not one fix for every registry problem."""
    module = spec.partition(":")[0] or "your_crews"
    if f"{spec}: RegistryError:" in error:  # it imported; what it holds is wrong (the worker names the spec)
        if "is not of the form module:attr" in error:
            return f"set {PREFIX}REGISTRY to module:attr, the module and its mapping of crew ids ({module}:registry)"
        if "imports but has no attribute" in error:
            return f"name in {PREFIX}REGISTRY the attribute of {module} that holds its mapping of crew id to factory"
        return f"make {spec} a non-empty mapping of crew id (a non-blank string) to crew factory"
    return (
        f"make {module} importable by the workers (installed in this environment, or on"
        f" PYTHONPATH) and {PREFIX}REGISTRY name a non-empty mapping of crew id to crew factory"
    )
