"""Serving: check everything that can be checked, open the supervisor (which fences the past, then takes the
port, then starts the crews), then listen; drain on SIGTERM.

Imported only by ``crew-supervisor serve``: the operator commands start without uvicorn or the job machinery.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
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
from supervisor.config import ConfigError
from supervisor.enums import LauncherName
from supervisor.http.app import create_app
from supervisor.http.connections import Bounds, budget, guarded_protocol
from supervisor.jobs.environment import worker_env
from supervisor.jobs.sandbox import check_places
from supervisor.jobs.supervisor import Supervisor
from supervisor.jobs.tracing import TracingError
from supervisor.journal.errors import JournalError
from supervisor.journal.statefiles import check_state_files, prepare_directory, prepare_places
from supervisor.layout import JOURNAL, WORKER_PLACES
from supervisor.processes import reach
from supervisor.processes.forkserver import ForkServerLauncher
from supervisor.processes.launcher import Launcher, LaunchError, SpawnLauncher
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
    ephemeral = None if settings.state_file else Path(tempfile.mkdtemp(prefix="crew-supervisor-"))
    journal_path = ephemeral / JOURNAL if ephemeral else Path(settings.state_file).absolute()
    try:  # before the state is touched: workers that could not import as WORKER_USER are one line with its fix
        check_places(settings, journal_path.parent)
        reach.check(settings, worker_env(settings, journal_path.parent, ""))
    except ConfigError as exc:
        _remove(ephemeral)
        sys.exit(f"crew-supervisor: {exc}; fix: {exc.fix}")
    try:
        _prepare_state(settings, journal_path)
        become_subreaper()
    except (JournalError, OSError) as exc:
        _remove(ephemeral)
        sys.exit(f"crew-supervisor: {exc}")
    config = uvicorn.Config(
        _Dated(),  # given the app once the supervisor is open (``_DrainingServer.serve``)
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
    server = _DrainingServer(config, settings, journal_path, ephemeral)
    server.run()  # the port is bound there, once the past is fenced; listening starts once the supervisor is open
    if server.unready is not None:
        sys.exit(f"crew-supervisor: {server.unready}")


class _DrainingServer(uvicorn.Server):
    """uvicorn's server around one ``Supervisor.open``: the supervisor opens on the serving loop before anything
    listens (it binds the port once nothing a dead supervisor's jobs left runs any more, before its own crews
    start: a leftover of a job could hold it until then), and on SIGTERM (or SIGINT) drains while still
    listening: new starts answer 503, running jobs get ``DRAIN_SECONDS`` to finish (a second signal ends the
    wait), then the jobs left are stopped: their waiters and streams then end, and uvicorn's shutdown closes the
    connections.

    Everything is released (every job ended, the journal committed and closed) before the signal is re-raised to
    end the process with it.
    """

    def __init__(
        self, config: uvicorn.Config, settings: config.Settings, journal: Path, ephemeral: Path | None
    ) -> None:
        super().__init__(config)
        self.settings = settings
        self.journal = journal
        self.ephemeral = ephemeral
        self.unready: str | None = None  # why the supervisor could not open: nothing listened
        self._listening: listener.Listener | None = None  # bound by ``_bind``, from ``Supervisor.open``
        self._sup: Supervisor | None = None
        self._opening: asyncio.Task[None] | None = None  # the start-up, while the supervisor opens
        self._signalled: asyncio.Event | None = None
        self._skip_drain: asyncio.Event | None = None
        # The handlers this process had before ``asyncio.run`` put its own on SIGINT (one that only cancels the
        # main task), taken now: a Python one is put back at exit, so the signal re-raised then reaches whoever
        # embedded us (coverage's SIGTERM handler saves its data on it). Otherwise the loop's removal leaves its
        # own (SIG_DFL; Python's for SIGINT): an inherited SIG_IGN put back would turn the re-raise into exit 0.
        self._found = {sig: signal.getsignal(sig) for sig in HANDLED_SIGNALS}

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        with self.capture_signals():
            async with contextlib.AsyncExitStack() as stack:
                stack.callback(_remove, self.ephemeral)  # last: after the journal's close
                stack.callback(self._unbind)
                self._opening = started = asyncio.current_task()
                assert started is not None  # a coroutine runs in a task
                try:
                    launcher = functools.partial(_launcher, self.settings)
                    opening = Supervisor.open(self.settings, self.journal, launcher, fenced=self._bind)
                    self._sup = await stack.enter_async_context(opening)
                except (JournalError, LaunchError, OSError, listener.ListenError, TracingError) as exc:
                    self.unready = str(exc)
                    return
                except ConfigError as exc:  # what the workers found (WORKER_SANDBOX=enforce on a kernel without)
                    self.unready = f"{exc}; fix: {exc.fix}"
                    return
                except asyncio.CancelledError:
                    if not self.should_exit:
                        raise
                    started.uncancel()  # a signal during start-up: what was opened is closed, then it ends us
                    return
                finally:
                    self._opening = None
                log.info(
                    "serving crews %s on %s:%d with launcher %s",
                    ", ".join(self._sup.crews),
                    self.settings.host,
                    self.settings.port,
                    self._sup.launcher.name,
                )
                assert isinstance(self.config.app, _Dated) and self._listening is not None
                self.config.app.app = create_app(self._sup)
                # Listening here, not left to uvicorn: uvloop listens through the descriptor, past Listener.listen,
                # and without SO_REUSEADDR its connections' TIME_WAIT refused the next start's bind of the port.
                self._listening.listen(self.config.backlog)
                await self._serve([self._listening])

    def _bind(self) -> None:
        """Raises ListenError, naming whoever holds the port: a stranger, nothing of ours runs now."""
        self._listening = listener.bind(self.settings.host, self.settings.port)

    def _unbind(self) -> None:
        if self._listening is not None:
            self._listening.close()

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
            for sig, handler in self._found.items():
                loop.remove_signal_handler(sig)
                if callable(handler):
                    signal.signal(sig, handler)
        for captured in reversed(self._captured_signals):  # exit with the signal, as uvicorn does
            signal.raise_signal(captured)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """Called on the loop (``capture_signals``), so it may log. The first signal starts the drain (during
        start-up, it ends the start-up at once); a later one, SIGTERM or SIGINT alike, ends its wait. Unlike
        uvicorn's, a second SIGINT does not force the exit: the stop after the drain is bounded anyway, and done
        in order the streams still get their jobs' terminal events before the connections close."""
        name = signal.Signals(sig).name
        if self.should_exit:
            log.warning("received %s again: the drain's wait ends", name, extra={"signal": name})
            if self._skip_drain is not None:
                self._skip_drain.set()
        else:
            log.warning("received %s: draining", name, extra={"signal": name})
        self._captured_signals.append(sig)  # re-raised at exit, as uvicorn does
        self.should_exit = True
        if self._opening is not None:  # nothing serves yet: the start-up ends now, not after the crews' import
            self._opening.cancel()
        if self._signalled is not None:
            self._signalled.set()

    async def main_loop(self) -> None:
        """uvicorn's loop without its tick: the tick refreshed the Date header (``_Dated`` stamps it now)
        and looked for a signal, which now wakes this loop itself. An idle supervisor wakes for nothing."""
        assert self._signalled is not None
        while not await self.on_tick(0):
            await self._signalled.wait()
            self._signalled.clear()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """The drain and the stop come before uvicorn's shutdown stops listening: while jobs finish, their
        streams and waiters, ``/health``, reads and cancels are still served."""
        assert self._sup is not None and self._skip_drain is not None
        await self._sup.stop(self.settings.drain_seconds, self._skip_drain)
        await super().shutdown(sockets)


class _Dated:
    """The app, with the ``date`` header uvicorn would send (first, as uvicorn puts it), stamped when each
    response starts."""

    def __init__(self, app: ASGIApp | None = None) -> None:
        self.app = app
        self._second = -1
        self._date = b""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        assert self.app is not None
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


def _prepare_state(settings: config.Settings, journal_path: Path) -> None:
    """The state directory private, its files checked, the workers' places made."""
    state = journal_path.parent
    if (was := prepare_directory(state, settings.worker_ids)) is not None:
        log.warning("state directory %s had mode %04o, which let others list it: made it private", state, was)
    check_state_files(journal_path)
    prepare_places(state, WORKER_PLACES, settings.worker_ids)


def _launcher(settings: config.Settings, reaper: Reaper, limits: Limits) -> Launcher:
    spawn = SpawnLauncher(reaper)
    return (
        ForkServerLauncher(spawn, settings.prefork or 0, limits)
        if settings.launcher == LauncherName.FORKSERVER
        else spawn
    )


def _remove(ephemeral: Path | None) -> None:
    if ephemeral is not None:
        shutil.rmtree(ephemeral, ignore_errors=True)
