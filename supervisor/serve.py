"""Serving: check everything that can be checked, fence the past, then listen; drain on SIGTERM.

Imported only by ``crew-supervisor serve``: the operator commands start without uvicorn or the job machinery.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import socket
import sys
import tempfile
from pathlib import Path

import uvicorn

from supervisor import config
from supervisor.http.app import create_app
from supervisor.jobs.fencing import fence_restored
from supervisor.jobs.runner import worker_env
from supervisor.jobs.supervisor import Supervisor
from supervisor.journal.statefiles import prepare_directory
from supervisor.journal.store import Journal, JournalError
from supervisor.processes.forkserver import ForkServerLauncher
from supervisor.processes.launcher import LaunchError, SpawnLauncher
from supervisor.processes.reaper import Reaper, become_subreaper

log = logging.getLogger("crew_supervisor")
GRACEFUL_SHUTDOWN_SECONDS = 5


def serve(settings: config.Settings, log_level: str) -> None:
    ephemeral = None if settings.state_file else Path(tempfile.mkdtemp(prefix="crew-supervisor-"))
    journal_path = ephemeral / "journal.db" if ephemeral else Path(settings.state_file).absolute()
    try:
        sup = _prepare(settings, journal_path)
    except (JournalError, LaunchError, OSError) as exc:
        sys.exit(f"crew-supervisor: {exc}")
    config = uvicorn.Config(
        create_app(sup),
        host=settings.host,
        port=settings.port,
        proxy_headers=False,
        server_header=False,
        log_level=log_level,
        access_log=False,
        log_config=None,  # our handler (logs.configure) formats uvicorn's records too
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
    )
    server = _DrainingServer(config, sup, ephemeral)
    try:
        server.run()
    finally:
        server.release()


class _DrainingServer(uvicorn.Server):
    """On SIGTERM, stop the jobs first: their waiters and streams then end, and connections close.

    Everything is released before uvicorn re-raises the signal to end the process with it.
    """

    def __init__(self, config: uvicorn.Config, sup: Supervisor, ephemeral: Path | None) -> None:
        super().__init__(config)
        self.sup = sup
        self.ephemeral = ephemeral

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await self.sup.stop()
        await super().shutdown(sockets)
        self.release()

    def release(self) -> None:
        self.sup.journal.close()
        if self.ephemeral:
            shutil.rmtree(self.ephemeral, ignore_errors=True)


def _prepare(settings: config.Settings, journal_path: Path) -> Supervisor:
    """Lock and open the journal, learn the crews, fence jobs a dead supervisor left running."""
    state = journal_path.parent
    prepare_directory(state)
    for place in ("home", "storage", "scratch"):
        (state / place).mkdir(mode=0o700, exist_ok=True)
    journal = Journal(journal_path, settings.stream_checkpoint_events, settings.max_state_bytes)
    if journal.imported_from:
        log.warning(
            "imported the reference journal at %s; the original is kept at %s", journal_path, journal.imported_from
        )
    if journal.upgraded_from:
        log.warning("upgraded the journal at %s; the original is kept at %s", journal_path, journal.upgraded_from)
    try:
        become_subreaper()
        reaper = Reaper()
        spawn = SpawnLauncher(reaper)
        launcher = ForkServerLauncher(spawn, settings.prefork or 0) if settings.launcher == "forkserver" else spawn
        registry = asyncio.run(launcher.describe(worker_env(settings, state, ""), str(state / "scratch")))
        crews = registry.crews
        sup = Supervisor(settings, journal, launcher, crews, state, reaper)
        fenced = fence_restored(journal)
    except BaseException:
        journal.close()
        raise
    if fenced:
        log.warning("fenced %d job(s) left running by a previous supervisor", len(fenced))
    log.info(
        "serving crews %s on %s:%d with launcher %s", ", ".join(crews), settings.host, settings.port, launcher.name
    )
    return sup
