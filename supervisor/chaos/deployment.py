"""A supervisor chaos did not start: reached at its URL, crashed and brought back by the operator's own
command (``kubectl delete pod crew-supervisor-0 --grace-period=0 --force``, ``docker kill x && docker
start x``). Its processes and journal are out of sight: only what the API shows is checked."""

from __future__ import annotations

import dataclasses
import subprocess
import time
from typing import Any

import httpx

POLL_SECONDS = 0.2


class RestartError(RuntimeError):
    """The restart command failed, or the supervisor did not come back in time: one line says which."""


@dataclasses.dataclass
class Deployment:
    url: str
    token: str | None
    restart_cmd: str
    restart_seconds: float

    def client(self, token: str | None = None, *, timeout: float = 60, **kwargs: Any) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token or self.token}"} if token or self.token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=timeout, **kwargs)

    def instance(self) -> str | None:
        """The supervisor's ``instance`` while it answers ready, else None."""
        try:
            with self.client(timeout=5) as client:
                answer = client.get("/health")
        except httpx.TransportError:
            return None
        health = answer.json() if answer.status_code == 200 else {}
        return health.get("instance") if health.get("status") == "ready" else None

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
