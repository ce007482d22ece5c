"""What a job may reach: the policy every worker process sets on itself (``worker/landlock.py``), when it starts
and again, narrower, once it has its job.

A job reads everything but what is hidden: the state directory (the journal, every job's record; the other
crews' HOME and storage; the other jobs' scratch directories), the bearer token's file, the crews' env files
and, unless it trains, the training directory. It writes only its own places: its scratch directory (its cwd,
with its TMPDIR inside), its crew's HOME and CrewAI storage, and the training directory when it trains. The
same domain keeps every process outside the job out of its reach (no trace, no ``/proc/<pid>/mem``, no signal).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

from protocol import Layer
from supervisor.config import PREFIX, ConfigError, Settings
from supervisor.journal.statefiles import WORKER_PLACES

log = logging.getLogger("crew_supervisor")

LANDLOCK_ABI = {Layer.FILESYSTEM: 2, Layer.PROCESSES: 2, Layer.SIGNALS: 6, Layer.SOCKETS: 6}


def hidden(settings: Settings, state: Path) -> list[str]:
    """What no worker process may read (nor change): none when jobs run unsandboxed. A job that trains is given the
    training directory back as one of its places (``Sandbox.policy``)."""
    if settings.worker_sandbox == "off":
        return []
    places = (state, settings.bearer_token_file, settings.crew_env_dir, settings.training_dir)
    return [str(Path(place).absolute()) for place in places if place]


def workers_writable(settings: Settings, state: Path) -> list[str]:
    """What the workers' domain lets a worker process change (each job then only its own, ``Sandbox.policy``): the
    workers' places in the state directory, the training directory, ``WORKER_WRITABLE``."""
    places = [str(state / name) for name in WORKER_PLACES]
    if settings.training_dir:
        places.append(str(Path(settings.training_dir).absolute()))
    return places + list(settings.worker_writable)


class Sandbox:
    def __init__(self, settings: Settings, offered: list[str]) -> None:
        """``offered``: the layers the workers say their kernel has (``Registry.sandbox``)."""
        self.mode = settings.worker_sandbox
        self.layers = [layer for layer in Layer if layer in offered and (self.mode != "off" or layer is Layer.SECCOMP)]
        self.missing = [layer for layer in Layer if layer not in offered]
        self._training = str(Path(settings.training_dir).absolute()) if settings.training_dir else ""
        self._shared = list(settings.worker_writable)

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

    def policy(self, env: Mapping[str, str], cwd: str, operation: str) -> list[str] | None:
        """The places a job may change, its Start's ``writable`` (None: no sandbox)."""
        if self.mode == "off":
            return None
        training = [self._training] if self._training and operation == "train" else []
        return [cwd, env["HOME"], env["CREWAI_STORAGE_DIR"], *self._shared, *training]

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
