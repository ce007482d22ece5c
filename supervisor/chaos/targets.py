"""The supervisor under test: one chaos starts itself (``Local``: its processes and journal in sight), or
one at a URL that the operator's own command kills and brings back (``Deployment``: ``kubectl delete pod
crew-supervisor-0 --grace-period=0 --force``, ``podman kill cs && podman start cs``), of which only
what the API shows is checked."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from supervisor import testing
from supervisor.chaos.checks import Seen
from supervisor.chaos.faults import CONFIRM_SECONDS, Record
from supervisor.enums import Readiness
from supervisor.layout import JOURNAL
from supervisor.testing import Server

POLL_SECONDS = 0.2


class RestartError(RuntimeError):
    """The restart command failed, or the supervisor did not come back in time: one line says which."""


class Local:
    """A supervisor on loopback, started on entry and stopped on exit, each start appending to one log."""

    def __init__(self, state: Path, args: argparse.Namespace, log: Path) -> None:
        self.state, self.args, self.log = state, args, log
        self.journal = state / JOURNAL

    def __enter__(self) -> Local:
        self.server = self._start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop()  # on any error too: nothing left running on a disk about to be unmounted

    def client(self, token: str | None = None, *, timeout: float = 60, **kwargs: Any) -> httpx.Client:
        return self.server.client(token, timeout=timeout, **kwargs)

    def kill(self, record: Record) -> tuple[list[Seen], str | None]:
        """SIGSTOP it (it forks nothing more), note its processes, SIGKILL it and reap it: returns those
        processes, which must all be gone after the restart, and what went wrong, if anything."""
        process = self.server.process
        if process.poll() is not None:
            return [], f"the supervisor had exited on its own (status {process.returncode}) before the kill"
        process.send_signal(signal.SIGSTOP)
        before = _processes(self.server)
        record.aim("supervisor kill", process.pid)
        process.send_signal(signal.SIGKILL)
        if process.wait(CONFIRM_SECONDS) != -signal.SIGKILL:
            return before, f"the supervisor exited with {process.returncode}, not by the SIGKILL"
        record.count("supervisor")
        return before, None

    def stop(self) -> list[Seen]:
        """SIGTERM it (no drain: the harness sets none) once the load has stopped; returns its processes."""
        before = _processes(self.server)
        self.server.stop()
        return before

    def restart(self) -> None:
        """Start it again on the same state, once the load has stopped: every job admitted is checked."""
        self.server = self._start()

    def _start(self) -> Server:
        return testing.start(
            self.state,
            self.args.registry,
            args=["--log-level", "warning"],
            log=self.log,
            max_concurrency=self.args.concurrency,
            max_retained_runs=100000,
            min_free_disk_mb=1,
        )


def _processes(server: Server) -> list[Seen]:
    found = []
    for process in server.processes():
        with contextlib.suppress(psutil.Error):
            found.append(Seen.of(process))
    return found


@dataclasses.dataclass
class Deployment:
    url: str
    token: str | None
    restart_cmd: str
    restart_seconds: float

    def client(self, token: str | None = None, *, timeout: float = 60, **kwargs: Any) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token or self.token}"} if token or self.token else {}
        # Proxies from the environment apply: a deployment may well sit behind one.
        return httpx.Client(base_url=self.url, headers=headers, timeout=timeout, **kwargs)

    def instance(self) -> str | None:
        """The supervisor's ``instance`` while it answers ready, else None."""
        try:
            with self.client(timeout=5) as client:
                answer = client.get("/health")
        except httpx.TransportError:
            return None
        health = answer.json() if answer.status_code == 200 else {}
        return health.get("instance") if health.get("status") == Readiness.READY else None

    def restart(self) -> None:
        """Run the command; confirmed once ``/health`` answers ready with another ``instance`` (one that
        answers as before was never killed, whatever the command said)."""
        before = self.instance()
        deadline = time.monotonic() + self.restart_seconds
        try:
            done = subprocess.run(
                self.restart_cmd, shell=True, capture_output=True, text=True, timeout=self.restart_seconds
            )
        except subprocess.TimeoutExpired:
            raise RestartError(f"--restart-cmd ran longer than {self.restart_seconds:.0f} s") from None
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise RestartError(f"--restart-cmd exited with {done.returncode}: {last}")
        now = None
        while time.monotonic() < deadline:
            now = self.instance()
            if now is not None and now != before:
                return
            time.sleep(POLL_SECONDS)
        if now is not None:
            raise RestartError(
                f"the supervisor at {self.url} answered as the same instance: the command did not kill it"
            )
        raise RestartError(f"the supervisor at {self.url} was not ready again within {self.restart_seconds:.0f} s")
