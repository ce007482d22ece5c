"""A real supervisor for tests, benchmarks and tours: ``python -m supervisor serve`` on a free loopback port.

    with testing.start(tmp / "state", "tests.crews:registry", max_concurrency=2) as server:
        with server.client() as client:
            client.post("/jobs", json=..., headers={"Idempotency-Key": "k"})

Each server gets a fresh bearer token, a state directory of its own (the journal inside it) and a log file.
``start`` waits until ``/health`` answers, within a deadline, and otherwise fails with the log's tail;
``stop`` sends SIGTERM, then SIGKILL after a deadline (``DRAIN_SECONDS`` is 0 here unless given, so running
jobs are killed at once rather than waited for); ``shut_down`` stops it and also waits for its fork server and
workers, naming (and killing) any that outlived it. Settings are keyword arguments named as the
``AIP_CREWAI_*`` variables without the prefix (``launcher="spawn"``); ``env`` is applied last and wins.

Imports neither crewai nor the worker package (the supervisor never does): a test that only talks HTTP
stays light, and the process it starts runs this same source tree.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import psutil

from supervisor.config import PREFIX
from supervisor.layout import JOURNAL
from supervisor.settings_table import SPEC
from supervisor.tokens import FILE_SETTINGS

TOKEN_SETTINGS = frozenset(PREFIX + name for name in ("BEARER_TOKEN", *FILE_SETTINGS.values()))

SOURCE = Path(__file__).resolve().parent.parent  # holds the supervisor package the child must import
READY_SECONDS = 120.0
STOP_SECONDS = 30.0
LOG_TAIL_CHARS = 3000
FORKED_WORKER = "crew-worker"  # a forked worker's process name (``worker.tether.name_worker``)


class StartError(RuntimeError):
    """The supervisor exited, or did not answer ``/health`` in time; the message ends with its log's tail."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclasses.dataclass
class Server:
    """A started supervisor process and how to reach it."""

    process: subprocess.Popen[bytes]
    url: str
    token: str
    state: Path  # the state directory; the journal is ``state / JOURNAL`` (supervisor/layout.py)
    log: Path  # its stdout and stderr

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def client(self, token: str | None = None, *, timeout: float = 60, **kwargs: Any) -> httpx.Client:
        """A client on this server with its token (or ``token``); loopback only, never through a proxy."""
        return httpx.Client(**self._client_options(token, timeout), **kwargs)

    def async_client(self, token: str | None = None, *, timeout: Any = 60, **kwargs: Any) -> httpx.AsyncClient:
        return httpx.AsyncClient(**self._client_options(token, timeout), **kwargs)

    def _client_options(self, token: str | None, timeout: Any) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {token or self.token}"}
        return {"base_url": self.url, "headers": headers, "timeout": timeout, "trust_env": False}

    def healthy(self, client: httpx.Client) -> bool:
        """Whether ``/health`` answers 200 now; raises StartError once the process has exited."""
        if self.process.poll() is not None:
            raise StartError(f"the supervisor exited with {self.process.returncode} at start:\n{self.log_tail()}")
        try:
            return client.get("/health").status_code == 200
        except httpx.TransportError:
            return False

    def wait_ready(self, timeout: float = READY_SECONDS) -> None:
        """Until ``/health`` answers; a supervisor that exits or does not answer in time is stopped and raises."""
        deadline = time.monotonic() + timeout
        try:
            with self.client(timeout=2) as client:
                while not self.healthy(client):
                    if time.monotonic() > deadline:
                        raise StartError(f"the supervisor did not answer within {timeout:.0f} s:\n{self.log_tail()}")
                    time.sleep(0.1)
        except BaseException:  # an interrupted wait too: a server that never got ready is of no use
            self.stop()
            raise

    def log_tail(self, chars: int = LOG_TAIL_CHARS) -> str:
        with contextlib.suppress(OSError):
            return self.log.read_text(errors="replace")[-chars:]
        return ""

    def processes(self) -> list[psutil.Process]:
        """Its live descendants: the fork server and the workers."""
        try:
            descendants: list[psutil.Process] = psutil.Process(self.pid).children(recursive=True)  # psutil: untyped
        except psutil.NoSuchProcess:
            return []
        return descendants

    def forkserver(self) -> psutil.Process | None:
        """The fork server (None with the spawn launcher, or while there is none)."""
        for child in self._children():
            with contextlib.suppress(psutil.Error):
                # Its workers are our children too, with its command line: they are named apart.
                if "forkserver" in child.cmdline() and child.name() != FORKED_WORKER:
                    return child
        return None

    def forked_workers(self) -> list[psutil.Process]:
        """Workers the fork server forked, idle or running a job (the supervisor's children)."""
        found = []
        for child in self._children():
            with contextlib.suppress(psutil.Error):
                if child.name() == FORKED_WORKER:
                    found.append(child)
        return found

    def _children(self) -> list[psutil.Process]:
        try:
            children: list[psutil.Process] = psutil.Process(self.pid).children()  # psutil: untyped
        except psutil.NoSuchProcess:
            return []
        return children

    def stop(self, timeout: float = STOP_SECONDS) -> None:
        """SIGTERM (the supervisor stops its workers and closes the journal), SIGKILL if it outlasts ``timeout``."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    def kill(self) -> None:
        """SIGKILL, as a crash would: the journal is left as it was, the workers die with their parent."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()

    def shut_down(self, *, kill: bool = False, timeout: float = STOP_SECONDS) -> list[str]:
        """``stop`` it (``kill``: ``kill`` it) and wait up to ``timeout`` for every process it had to be gone.

        Returns a line for each one that outlived it, each then SIGKILLed: empty when nothing was left behind.
        """
        tree = self.processes()  # now: once it has exited, its children are no longer found under it
        if kill:
            self.kill()
        else:
            self.stop(timeout)
        left = []
        for process in _survivors(tree, timeout):
            with contextlib.suppress(psutil.NoSuchProcess):  # it went in the meantime: not left behind
                left.append(f"pid {process.pid} {process.name()!r}: {shlex.join(process.cmdline())}")
                process.kill()  # psutil checks the start time first: never a process that reused the pid
        _survivors(tree, timeout)
        return left

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _survivors(processes: Sequence[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Those of ``processes`` still running after ``timeout`` (or none, as soon as all are gone)."""
    deadline = time.monotonic() + timeout
    while (running := [process for process in processes if _running(process)]) and time.monotonic() < deadline:
        time.sleep(0.02)
    return running


def _running(process: psutil.Process) -> bool:
    """A zombie is not: it is dead and waits only for its parent to reap it (this process, if it is ours)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(process.pid, os.WNOHANG)
    with contextlib.suppress(psutil.NoSuchProcess):
        alive: bool = process.is_running() and process.status() != psutil.STATUS_ZOMBIE  # psutil is untyped
        return alive
    return False


def start(
    state: Path,
    registry: str,
    *,
    env: Mapping[str, str] | None = None,
    path: Sequence[str | Path] = (),
    args: Sequence[str] = (),
    log: Path | None = None,
    cwd: Path | None = None,
    port: int = 0,
    wait: bool = True,
    ready_seconds: float = READY_SECONDS,
    pass_fds: Sequence[int] = (),
    python: str = sys.executable,
    token: str | None = None,
    user: tuple[int, int] | None = None,
    **settings: str | int | float | bool,
) -> Server:
    """Start ``python -m supervisor serve`` on ``registry`` (``module:attr``, importable from ``path``).

    ``state`` is the state directory (the supervisor creates it); ``log`` defaults to a file beside it;
    ``args`` are extra ``serve`` flags (``--log-level warning``); ``port`` 0 picks a free one; ``pass_fds``
    are left open in it, as a careless launcher would leave its descriptors; ``python`` is the interpreter it
    runs on (and its workers: the supervisor launches them with its own); ``token`` is its bearer token
    (default: a fresh one; a restart that must keep its clients passes theirs); ``user``, a uid and gid it runs as,
    with no other group (started by root: as a container runs it, one uid for it and its workers). The
    environment is this process's, CrewAI's switches off, then the server's own, then ``settings``
    (``max_concurrency=8``), then ``env`` (none of this process's tokens). With ``wait`` it returns once ready.
    """
    # Here, not at the top: the console script imports this module (through chaos) and must start
    # without the protocol package, so that ``doctor`` can report one another distribution shadows.
    from protocol import CREWAI_SWITCHES

    port = port or free_port()
    token = token or secrets.token_urlsafe(16)
    log = log or state.parent / f"supervisor-{port}.log"
    python_path = dict.fromkeys([str(SOURCE), *map(str, path), *os.environ.get("PYTHONPATH", "").split(os.pathsep)])
    full_env = {
        **without_tokens(os.environ),
        **CREWAI_SWITCHES,  # as the image: not OTEL_SDK_DISABLED, so an OTLP endpoint in env is enough to trace
        "PYTHONPATH": os.pathsep.join(filter(None, python_path)),
        f"{PREFIX}REGISTRY": registry,
        f"{PREFIX}HOST": "127.0.0.1",
        f"{PREFIX}PORT": str(port),
        f"{PREFIX}BEARER_TOKEN": token,
        f"{PREFIX}STATE_FILE": str(state / JOURNAL),
        # ``stop`` must not wait out the jobs a test left running: no drain unless the caller asks for one.
        f"{PREFIX}DRAIN_SECONDS": "0",
        **{_setting(name): _value(value) for name, value in settings.items()},
        **(env or {}),
    }
    command = [python, "-m", "supervisor", "serve", *args]
    with open(log, "ab") as out:  # the child keeps its own descriptor
        process = subprocess.Popen(
            command, env=full_env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, pass_fds=pass_fds, **_as(user)
        )
    server = Server(process, f"http://127.0.0.1:{port}", token, state, log)
    if wait:
        server.wait_ready(ready_seconds)
    return server


def without_tokens(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without a token setting: the server's token is its own, whatever the caller's shell exports (the
    README's exports BEARER_TOKEN_FILE, which beside the server's BEARER_TOKEN would refuse its start)."""
    return {name: value for name, value in environ.items() if name not in TOKEN_SETTINGS}


def _as(user: tuple[int, int] | None) -> dict[str, Any]:
    """Popen's arguments that run a process as ``user`` (uid, gid) with no other group; none for this user."""
    return {"user": user[0], "group": user[1], "extra_groups": []} if user is not None else {}


def _setting(name: str) -> str:
    if name.upper() not in SPEC:
        raise TypeError(f"no setting {PREFIX}{name.upper()}")
    return PREFIX + name.upper()


def _value(value: str | int | float | bool) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)
