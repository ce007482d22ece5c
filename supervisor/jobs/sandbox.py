"""What a job may reach: the policy every worker process sets on itself (``worker/landlock.py``), when it starts
and again, narrower, once it has its job.

A job reads everything but what is hidden: the state directory (the journal, every job's record; the other
crews' HOME and storage; the other jobs' scratch directories), the bearer tokens' files, the crews' env files
and, unless it trains, the training directory. It writes only its own places: its scratch directory (its cwd,
with its TMPDIR inside), its crew's HOME and CrewAI storage, ``WORKER_WRITABLE``, and the training directory when
it trains. The same domain keeps every process outside the job out of its reach (no trace, no ``/proc/<pid>/mem``,
and from Landlock ABI 6 no signal, no abstract socket). Paths are resolved: Landlock judges where a link leads.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

from protocol import HOME, LANDLOCK_ABI, STORAGE_DIR, Layer, Operation
from supervisor.config import PREFIX, ConfigError, Settings
from supervisor.layout import WORKER_PLACES

log = logging.getLogger("crew_supervisor")


def hidden(settings: Settings, state: Path) -> list[str]:
    """What no worker process may read (nor change): none when jobs run unsandboxed. The workers' domain, and a job
    that trains, get the training directory back as a place they may change."""
    if settings.worker_sandbox == "off":
        return []
    return _resolved(state, *settings.token_files.values(), settings.crew_env_dir, settings.training_dir)


def workers_writable(settings: Settings, state: Path) -> list[str]:
    """What the workers' domain lets a worker process change (each job then only its own, ``Sandbox.policy``): the
    workers' places in the state directory, the training directory, ``WORKER_WRITABLE``."""
    return _resolved(*(state / name for name in WORKER_PLACES), settings.training_dir, *settings.worker_writable)


def check_places(settings: Settings, state: Path) -> None:
    """Refuse a place every job may change that is no directory, or holds or lies beneath what every job must not
    read, and a training directory that holds any of those (the workers' domain may change it). Raises
    ConfigError."""
    if settings.worker_sandbox == "off":
        return
    secrets = _resolved(state, *settings.token_files.values(), settings.crew_env_dir)
    shared = [(place, True) for place in settings.worker_writable]
    for place, beneath_too in [*shared, *([(settings.training_dir, False)] if settings.training_dir else [])]:
        real = os.path.realpath(place)
        if beneath_too and not os.path.isdir(real):  # a sandbox grants rights only to what exists
            raise ConfigError(f"{PREFIX}WORKER_WRITABLE: {place} is not a directory", f"mkdir {place}, or leave it out")
        for secret in secrets:
            if os.path.commonpath([real, secret]) in ((real, secret) if beneath_too else (real,)):
                name = "WORKER_WRITABLE" if beneath_too else "TRAINING_DIR"
                raise ConfigError(
                    f"{PREFIX}{name}: {place} would let every job change or read {secret}",
                    f"name a directory apart from the state directory, the tokens' files and {PREFIX}CREW_ENV_DIR",
                )


class Sandbox:
    """A job's sandbox here: the mode asked, the layers the workers' kernel gives (``offered``, their
    ``Registry.sandbox``), and the places each job may change."""

    def __init__(self, settings: Settings, offered: list[str]) -> None:
        self.mode = settings.worker_sandbox
        self.layers = [layer for layer in Layer if layer in offered and (self.mode != "off" or layer is Layer.SECCOMP)]
        self.missing = [layer for layer in Layer if layer not in offered]
        self._shared = _resolved(*settings.worker_writable)
        self._training = _resolved(settings.training_dir)

    def check(self) -> None:
        """Refuse to serve without every layer when enforced; else say, once, what a job gets."""
        if self.mode == "enforce" and self.missing:
            raise ConfigError(f"{PREFIX}WORKER_SANDBOX=enforce, but {self.shortfall()}", self.fix())
        if self.mode == "off":
            log.warning("jobs run unsandboxed (%sWORKER_SANDBOX=off): each reaches all its uid may", PREFIX)
        elif self.missing:
            log.warning("a job's sandbox: %s; %s", ", ".join(self.layers) or "none", self.shortfall())
        else:
            log.info("a job's sandbox: %s", ", ".join(self.layers))

    def policy(self, env: Mapping[str, str], cwd: str, operation: Operation) -> list[str] | None:
        """The places a job may change, its Start's ``writable`` (None: no sandbox)."""
        if self.mode == "off":
            return None
        training = self._training if operation == Operation.TRAIN else []
        return [*_resolved(cwd, env[HOME], env[STORAGE_DIR]), *self._shared, *training]

    def health(self) -> dict[str, object]:
        return {"mode": self.mode, "layers": list(self.layers), "missing": list(self.missing)}

    def shortfall(self) -> str:
        """Which layers the workers' kernel lacks, and what brings each."""
        needs = [f"{layer} (Landlock ABI {LANDLOCK_ABI[layer]})" for layer in self.missing if layer in LANDLOCK_ABI]
        needs += ["seccomp (x86_64)"] if Layer.SECCOMP in self.missing else []
        return "this kernel gives a job no " + ", ".join(needs)

    def fix(self) -> str:
        return (
            "a kernel with Landlock ABI 6 (Linux 6.12) in its lsm= list, on x86_64;"
            f" or {PREFIX}WORKER_SANDBOX=auto to serve with what it has"
        )


def _resolved(*places: str | Path) -> list[str]:
    return [os.path.realpath(place) for place in places if place]
