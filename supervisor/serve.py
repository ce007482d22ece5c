"""Serving: check everything that can be checked, fence the past, then listen; drain on SIGTERM.

Imported only by ``crew-supervisor serve``: the operator commands start without uvicorn or the job machinery.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from email.utils import formatdate
from pathlib import Path
from types import FrameType

import uvicorn
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.server import HANDLED_SIGNALS

from supervisor import config, hardening, listener
from supervisor.http.app import create_app
from supervisor.http.connections import Bounds, budget, guarded_protocol
from supervisor.jobs.fencing import fence_restored
from supervisor.jobs.leftovers import remove_stale_partials
from supervisor.jobs.runner import worker_env
from supervisor.jobs.supervisor import Supervisor
from supervisor.journal.statefiles import WORKER_PLACES, check_state_files, prepare_directory, prepare_places
from supervisor.journal.store import Journal, JournalError
from supervisor.processes.forkserver import ForkServerLauncher
from supervisor.processes.launcher import LaunchError, SpawnLauncher
from supervisor.processes.limits import Limits
from supervisor.processes.reaper import Reaper, become_subreaper

log = logging.getLogger("crew_supervisor")
GRACEFUL_SHUTDOWN_SECONDS = 5


def serve(settings: config.Settings, log_level: str) -> None:
    # Before the state is opened and any child started: what a child could inherit is narrowed first.
    hardening.undumpable()
    hardening.close_inherited_descriptors()
    hardening.forget_token()
    open_files = hardening.raise_open_files_limit()
    max_connections, backlog = budget(settings.max_connections, open_files, settings.max_concurrency)
    if max_connections < settings.max_connections:
        log.warning("MAX_CONNECTIONS lowered to %d to fit %d open files", max_connections, open_files)
    try:  # first: a port in use is one line, before the journal is locked or a child started
        listening = listener.bind(settings.host, settings.port)
    except OSError as exc:
        sys.exit(f"crew-supervisor: cannot listen on {settings.host}:{settings.port}: {exc.strerror or exc}")
    ephemeral = None if settings.state_file else Path(tempfile.mkdtemp(prefix="crew-supervisor-"))
    journal_path = ephemeral / "journal.db" if ephemeral else Path(settings.state_file).absolute()
    try:
        sup = _prepare(settings, journal_path)
    except (JournalError, LaunchError, OSError) as exc:
        listening.close()
        sys.exit(f"crew-supervisor: {exc}")
    config = uvicorn.Config(
        _Dated(create_app(sup)),
        host=settings.host,
        port=settings.port,
        http=guarded_protocol(
            Bounds(
                max_connections,
                settings.header_timeout_seconds,
                settings.max_header_bytes,
                settings.body_timeout_seconds,
                settings.send_timeout_seconds,
            )
        ),
        ws="none",  # no websocket route: an upgrade is answered as plain HTTP, behind the token like the rest
        backlog=backlog,
        proxy_headers=False,
        server_header=False,
        date_header=False,  # stamped per response by _Dated: uvicorn refreshes its own from a 0.1 s tick
        log_level=log_level,
        access_log=False,
        log_config=None,  # our handler (logs.configure) formats uvicorn's records too
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
    )
    server = _DrainingServer(config, sup, ephemeral)
    try:
        server.run(sockets=[listening])  # listening starts here, once everything is ready
    finally:
        server.release()


class _DrainingServer(uvicorn.Server):
    """On SIGTERM (or SIGINT), drain while still listening: new starts answer 503, running jobs get
    ``DRAIN_SECONDS`` to finish (a second signal ends the wait), then the jobs left are stopped: their
    waiters and streams then end, and uvicorn's shutdown closes the connections.

    Everything is released before uvicorn re-raises the signal to end the process with it.
    """

    def __init__(self, config: uvicorn.Config, sup: Supervisor, ephemeral: Path | None) -> None:
        super().__init__(config)
        self.sup = sup
        self.ephemeral = ephemeral
        self._signalled: asyncio.Event | None = None
        self._skip_drain: asyncio.Event | None = None

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """As uvicorn's, through the loop: a signal wakes it (whichever thread the kernel gave it to), so
        the main loop can sleep until one comes instead of polling every 0.1 s."""
        loop = asyncio.get_running_loop()
        self._signalled = asyncio.Event()
        self._skip_drain = asyncio.Event()
        for sig in HANDLED_SIGNALS:
            loop.add_signal_handler(sig, self.handle_exit, sig, None)
        try:
            yield
        finally:
            for sig in HANDLED_SIGNALS:
                loop.remove_signal_handler(sig)
        for captured in reversed(self._captured_signals):  # exit with the signal, as uvicorn does
            signal.raise_signal(captured)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """Called on the loop (``capture_signals``), so it may log. The first signal starts the drain; a
        later one, SIGTERM or SIGINT alike, ends its wait. Unlike uvicorn's, a second SIGINT does not force
        the exit: the stop after the drain is bounded anyway, and done in order the streams still get their
        jobs' terminal events before the connections close."""
        name = signal.Signals(sig).name
        if self.should_exit:
            log.warning("received %s again: the drain's wait ends", name, extra={"signal": name})
            if self._skip_drain is not None:
                self._skip_drain.set()
        else:
            log.warning("received %s: draining", name, extra={"signal": name})
        self._captured_signals.append(sig)  # re-raised at exit, as uvicorn does
        self.should_exit = True
        if self._signalled is not None:
            self._signalled.set()

    async def main_loop(self) -> None:
        """uvicorn's loop without its tick: the tick refreshed the Date header (``_Dated`` stamps it now)
        and looked for a signal, which now wakes this loop itself. An idle supervisor wakes for nothing.
        The drain runs here, before uvicorn's shutdown stops listening: while jobs finish, their streams
        and waiters, ``/health``, reads and cancels are still served."""
        assert self._signalled is not None and self._skip_drain is not None
        while not await self.on_tick(0):
            await self._signalled.wait()
            self._signalled.clear()
        await self.sup.drain(self.sup.settings.drain_seconds, self._skip_drain)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await self.sup.stop()
        await super().shutdown(sockets)
        self.release()

    def release(self) -> None:
        self.sup.journal.close()
        if self.ephemeral:
            shutil.rmtree(self.ephemeral, ignore_errors=True)


class _Dated:
    """The app, with the ``date`` header uvicorn would send (first, as uvicorn puts it), stamped when each
    response starts."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._second = -1
        self._date = b""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def dated(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [(b"date", self._now()), *message.get("headers", ())]}
            await send(message)

        await self.app(scope, receive, dated)

    def _now(self) -> bytes:
        now = time.time()
        if int(now) != self._second:
            self._second, self._date = int(now), formatdate(now, usegmt=True).encode()
        return self._date


def _prepare(settings: config.Settings, journal_path: Path) -> Supervisor:
    """Lock and open the journal, learn the crews, fence jobs a dead supervisor left running."""
    state = journal_path.parent
    if (was := prepare_directory(state, settings.worker_ids)) is not None:
        log.warning("state directory %s had mode %04o, which let others list it: made it private", state, was)
    check_state_files(journal_path)
    prepare_places(state, WORKER_PLACES, settings.worker_ids)
    journal = Journal(journal_path, settings.stream_checkpoint_events, settings.max_state_bytes)
    if journal.imported_from:
        log.warning(
            "imported the reference journal at %s; the original is kept at %s", journal_path, journal.imported_from
        )
    if journal.upgraded_from:
        log.warning("upgraded the journal at %s; the original is kept at %s", journal_path, journal.upgraded_from)
    limits = Limits(settings)
    try:
        become_subreaper()
        reaper = Reaper()
        spawn = SpawnLauncher(reaper)
        launcher = (
            ForkServerLauncher(spawn, settings.prefork or 0, limits) if settings.launcher == "forkserver" else spawn
        )
        registry = asyncio.run(launcher.describe(worker_env(settings, state, ""), str(state / "scratch")))
        crews = registry.crews
        sup = Supervisor(settings, journal, launcher, limits, crews, state, reaper, registry.budgets)
        fenced = fence_restored(journal)
        remove_stale_partials(settings.training_dir)  # nothing runs yet: no such file is anyone's
    except BaseException:
        limits.stop()
        journal.close()
        raise
    if fenced:
        log.warning("fenced %d job(s) left running by a previous supervisor", len(fenced))
    log.info(
        "serving crews %s on %s:%d with launcher %s", ", ".join(crews), settings.host, settings.port, launcher.name
    )
    return sup
