"""What a worker process finds when it starts: its pipes on fixed fds, its settings, its places, and CrewAI told
to stay offline.

The supervisor's launchers and the fork server put the pipes there, and the supervisor writes the settings
(``WorkerSettings.to_environ``) that the worker takes back out of its environment (``WorkerSettings.take``). Both
sides take the numbers and the names from here, so they cannot drift apart.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Callable, Mapping, MutableMapping
from typing import TypeVar

T = TypeVar("T")

CONTROL_FD = 3  # supervisor -> worker (Start, Stop); for the fork server, its socket
EVENT_FD = 4  # worker -> supervisor: every frame the worker sends

# The supervisor's settings: the few a worker reads come in its environment under this prefix, and the worker
# takes them out of its environment first (worker.tether.take_settings), so no job's code sees any.
SETTINGS_PREFIX = "AIP_CREWAI_"
REGISTRY = SETTINGS_PREFIX + "REGISTRY"  # module:attr, the crews the worker loads
WORKER_NICE = SETTINGS_PREFIX + "WORKER_NICE"  # a job's worker's niceness (the fork server keeps the supervisor's)
WARMUP = SETTINGS_PREFIX + "WARMUP"  # what the fork server warms (``Warmup``)
TRAINING_DIR = SETTINGS_PREFIX + "TRAINING_DIR"  # where a train job publishes its artifact, absolute
# "uid:gid" a worker (or the fork server) switches to before anything else, when the supervisor's
# AIP_CREWAI_WORKER_USER is set; absent, it keeps the supervisor's uid.
WORKER_IDS = SETTINGS_PREFIX + "WORKER_IDS"
# When jobs are sandboxed (worker/landlock.py), JSON lists of paths: what no worker process may read, and what the
# workers may change (each job then only its own places, its Start's ``writable``).
SANDBOX_HIDDEN = SETTINGS_PREFIX + "SANDBOX_HIDDEN"
SANDBOX_WRITABLE = SETTINGS_PREFIX + "SANDBOX_WRITABLE"
# The job's event bounds, which the worker keeps its chunk events within (worker/chunks.py).
MAX_EVENTS = SETTINGS_PREFIX + "MAX_EVENTS_PER_RUN"
MAX_EVENT_BYTES = SETTINGS_PREFIX + "MAX_EVENT_BYTES"
# The kernel limits a worker process sets on itself before any crew code runs (worker.tether.confine), lowered
# only: a JSON object of resource.RLIMIT_* names and values (soft and hard alike). A process may always lower its
# own, while another's needs the same uid or CAP_SYS_RESOURCE, which a root supervisor with WORKER_USER may lack.
RLIMITS = SETTINGS_PREFIX + "WORKER_RLIMITS"
# The CPU seconds a job's worker may use from its job's start before the kernel stops it (RLIMIT_CPU; 0: none).
CPU_BACKSTOP = SETTINGS_PREFIX + "WORKER_CPU_BACKSTOP"

# A job's places, which the supervisor sets for each crew (a crew's file may not move them): its HOME, CrewAI's
# storage (absolute: CrewAI reads a relative one against the cwd) and the temporary directory.
HOME = "HOME"
STORAGE_DIR = "CREWAI_STORAGE_DIR"
TMPDIR = "TMPDIR"
PLACES = (HOME, STORAGE_DIR, TMPDIR)

# CrewAI calls home (and stalls ~20 s offline) unless these are set before it is imported. Its own switches pass
# from the supervisor's environment to a job's (an operator's value wins: the doctor checks it still means off).
CREWAI_SWITCHES = {
    "CREWAI_DISABLE_TELEMETRY": "true",
    "CREWAI_TRACING_ENABLED": "false",
    "CREWAI_DISABLE_VERSION_CHECK": "true",
}
# What every worker sets for itself before CrewAI is imported (worker.tether.prepare_environment), where its
# environment has none: CrewAI's switches and the OpenTelemetry SDK off, which CrewAI also reads as off. No OTEL_*
# variable reaches a worker (they are the supervisor's own tracing: supervisor/jobs/environment.py), so that one is
# always true there, and the supervisor, which never imports CrewAI, needs none of it: set on the supervisor,
# OTEL_SDK_DISABLED=true turns its tracing off.
QUIET_CREWAI = {**CREWAI_SWITCHES, "OTEL_SDK_DISABLED": "true"}


class Warmup(enum.StrEnum):
    """What the fork server warms (``WARMUP``): any other value than ``offline`` warms the providers too."""

    PROVIDERS = "providers"  # our own crews offline, and on each installed provider against a loopback one
    OFFLINE = "offline"  # our own crews offline alone


class BadSetting(ValueError):
    """A worker setting whose value the worker cannot read: names the variable and what it must be."""


@dataclasses.dataclass(frozen=True)
class WorkerSettings:
    """The supervisor's settings a worker process reads. The defaults are what a worker run alone assumes (the
    supervisor's, but for its niceness): the supervisor writes every field, but ``ids`` and ``training_dir`` only
    when set."""

    registry: str = ""
    nice: int = 0
    warmup: str = Warmup.PROVIDERS  # text: the supervisor's setting, which the worker reads as a ``Warmup``
    max_events: int = 1000
    max_event_bytes: int = 262144
    hidden: tuple[str, ...] = ()
    writable: tuple[str, ...] = ()
    ids: tuple[int, int] | None = None
    training_dir: str = ""
    rlimits: tuple[tuple[str, int], ...] = ()
    cpu_backstop: int = 0

    def to_environ(self) -> dict[str, str]:
        environ = {
            SANDBOX_HIDDEN: json.dumps(list(self.hidden)),
            SANDBOX_WRITABLE: json.dumps(list(self.writable)),
            REGISTRY: self.registry,
            WORKER_NICE: str(self.nice),
            WARMUP: self.warmup,
            MAX_EVENTS: str(self.max_events),
            MAX_EVENT_BYTES: str(self.max_event_bytes),
            RLIMITS: json.dumps(dict(self.rlimits)),
            CPU_BACKSTOP: str(self.cpu_backstop),
        }
        if self.ids is not None:
            environ[WORKER_IDS] = "{}:{}".format(*self.ids)
        if self.training_dir:
            environ[TRAINING_DIR] = self.training_dir
        return environ

    @classmethod
    def from_environ(cls, environ: Mapping[str, str], default: WorkerSettings | None = None) -> WorkerSettings:
        """The settings in ``environ``, ``default``'s (else the defaults) for each absent; raises BadSetting for a
        value it cannot read."""
        default = default or cls()
        return cls(
            registry=environ.get(REGISTRY, default.registry),
            nice=_read(environ, WORKER_NICE, int, "an integer", default.nice),
            warmup=environ.get(WARMUP, default.warmup),
            max_events=_read(environ, MAX_EVENTS, int, "an integer", default.max_events),
            max_event_bytes=_read(environ, MAX_EVENT_BYTES, int, "an integer", default.max_event_bytes),
            hidden=_read(environ, SANDBOX_HIDDEN, _paths, "a JSON list of paths", default.hidden),
            writable=_read(environ, SANDBOX_WRITABLE, _paths, "a JSON list of paths", default.writable),
            ids=_read(environ, WORKER_IDS, _ids, "uid:gid", default.ids),
            training_dir=environ.get(TRAINING_DIR, default.training_dir),
            rlimits=_read(environ, RLIMITS, _rlimits, "a JSON object of RLIMIT_* names and values", default.rlimits),
            cpu_backstop=_read(environ, CPU_BACKSTOP, int, "an integer", default.cpu_backstop),
        )

    @classmethod
    def take(cls, environ: MutableMapping[str, str], default: WorkerSettings | None = None) -> WorkerSettings:
        """The settings in ``environ`` (as ``from_environ``), taken out of it with every other ``AIP_CREWAI_*``
        variable: no job's code finds any in its environment, nor passes them on to what it runs."""
        taken = {name: environ.pop(name) for name in list(environ) if name.startswith(SETTINGS_PREFIX)}
        return cls.from_environ(taken, default)


def _read(environ: Mapping[str, str], name: str, parse: Callable[[str], T], expected: str, default: T) -> T:
    if name not in environ:
        return default
    try:
        return parse(environ[name])
    except ValueError:  # json's errors are ValueErrors too
        raise BadSetting(f"{name}={environ[name]!r}: must be {expected}") from None


def _paths(raw: str) -> tuple[str, ...]:
    paths = json.loads(raw)
    if not isinstance(paths, list) or not all(isinstance(path, str) for path in paths):
        raise ValueError(raw)
    return tuple(paths)


def _rlimits(raw: str) -> tuple[tuple[str, int], ...]:
    limits = json.loads(raw)
    if not isinstance(limits, dict) or not all(
        name.startswith("RLIMIT_") and type(value) is int and value >= 0 for name, value in limits.items()
    ):
        raise ValueError(raw)
    return tuple(limits.items())


def _ids(raw: str) -> tuple[int, int]:
    uid, colon, gid = raw.partition(":")
    if not colon:
        raise ValueError(raw)
    return int(uid), int(gid)
