"""A job's environment: the supervisor's, without its settings and secrets (or only what ``WORKER_ENV`` names),
the worker's own places, and its crew's file in ``CREW_ENV_DIR``; and the few settings the worker itself
reads, which ride along to the worker process only (it takes them out of its environment before any job code).

A crew's file (``<crew_id>.env``) is read at each job's start, so an operator rotates a key by rewriting it.
Its values are secrets: no error, log line or journal row quotes them, and a worker's output tails redact them.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Collection
from pathlib import Path

from protocol import HOME, PLACES, SETTINGS_PREFIX, STORAGE_DIR, TMPDIR, WorkerSettings
from supervisor.config import Settings
from supervisor.jobs.sandbox import hidden, workers_writable
from supervisor.layout import TMP, crew_places
from supervisor.processes.limits import rlimits as worker_rlimits

ALWAYS_PASSED = ("PATH", "PYTHONPATH")  # what finds the interpreter's tools and the crews' code
# The supervisor's tracing (supervisor/jobs/tracing.py): the exporter's endpoint and headers (which may hold a vendor's
# key) are the supervisor's alone; a worker sends its spans as frames. Its OTEL_SDK_DISABLED is protocol.QUIET_CREWAI's.
TRACING_PREFIX = "OTEL_"
MAX_FILE_BYTES = 64 * 1024
# What can be a file's name: no separator, no leading dot (``..``, a hidden file), nothing a shell would mangle.
SAFE_CREW_ID = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,200}")
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class CrewEnvError(Exception):
    """A crew's file that cannot be used, naming the file and the line; never quoting a value."""


def job_env(
    settings: Settings,
    state: Path,
    crew_id: str,
    tmpdir: Path,
    crew_vars: dict[str, str] | None = None,
    tokens: Collection[str] = (),
) -> dict[str, str]:
    """What the job's code finds in ``os.environ``: the supervisor's environment without any ``AIP_CREWAI_*``
    variable (settings, the tokens and their files among them), any ``OTEL_*`` one (the supervisor's tracing), or
    a variable holding one of ``tokens``, filtered by ``WORKER_ENV`` when set (which cannot name those back); then
    ``crew_vars`` (its crew's file, which cannot set them either); then the worker's places.

    Each crew gets its own CrewAI storage, so a replay finds that crew's latest kickoff, and its own HOME, so
    crews share no file CrewAI keeps there (its ``secret.key``, caches). ``tmpdir`` is the job's own (in its
    scratch directory; the fork server's is ``tmp`` in the state directory): private, and removed with it. The
    runner makes a job's places before its worker starts; the worker keeps CrewAI's lock files in the storage
    (``worker/places.py``).
    """
    allowed = (*settings.worker_env, *ALWAYS_PASSED) if settings.worker_env else ()
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith((SETTINGS_PREFIX, TRACING_PREFIX))
        and value not in tokens  # a token exported under another name too
        and (not allowed or _named(name, allowed))
    }
    env.update(crew_vars or {})
    home, storage = crew_places(state, crew_id)
    env.update({HOME: str(home), STORAGE_DIR: str(storage), TMPDIR: str(tmpdir)})
    return env


def worker_settings(settings: Settings, state: Path, writable: list[str] | None = None) -> dict[str, str]:
    """The settings the worker process reads from its environment (and then takes out of it), as the contract
    writes them: the registry, its niceness, the fork server's warm-up, the job's event bounds, its rlimits, the
    workers' uid, the training directory, what its sandbox hides and lets it change: ``writable`` (a job's places,
    for a worker spawned for it) or else every worker's places."""
    rlimits, cpu_backstop = worker_rlimits(settings)
    contract = WorkerSettings(
        registry=settings.registry,
        nice=settings.worker_nice,
        warmup=settings.warmup,
        max_events=settings.max_events_per_run,
        max_event_bytes=settings.max_event_bytes,
        hidden=tuple(hidden(settings, state)),
        writable=tuple(workers_writable(settings, state) if writable is None else writable),
        ids=settings.worker_ids,
        training_dir=str(Path(settings.training_dir).absolute()) if settings.training_dir else "",
        rlimits=rlimits,
        cpu_backstop=cpu_backstop,
    )
    return contract.to_environ()


def worker_env(
    settings: Settings, state: Path, crew_id: str, crew_vars: dict[str, str] | None = None
) -> dict[str, str]:
    """What a worker process not yet given a job (the fork server, a describing one) is launched with: a job
    environment, no crew's file (the doctor's check of one crew: ``crew_vars``, its file's), the state directory's
    ``tmp``, and the worker's settings."""
    env = job_env(settings, state, crew_id, state / TMP, crew_vars, settings.every_token)  # started with the tokens
    return {**env, **worker_settings(settings, state)}


def read_crew_env(directory: str, crew_id: str) -> dict[str, str]:
    """The variables of ``<directory>/<crew_id>.env``: none without a directory, a file, or a crew id that can
    name one. Raises CrewEnvError for a file that is not a regular one, is writable by others than its owner,
    is owned by another user than us or root, is larger than MAX_FILE_BYTES, or has a bad line."""
    if not directory or not SAFE_CREW_ID.fullmatch(crew_id):
        return {}
    path = os.path.join(directory, crew_id + ".env")
    try:
        # Links are followed (a Kubernetes secret volume's files are links); O_NONBLOCK: a FIFO cannot hang us.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise CrewEnvError(f"{path}: cannot open: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise CrewEnvError(f"{path}: not a regular file")
        # Whoever can write it can set PYTHONPATH or LD_PRELOAD for the crew's workers: their code would run there.
        if info.st_mode & 0o022 or info.st_uid not in (0, os.geteuid()):
            raise CrewEnvError(
                f"{path}: mode {info.st_mode & 0o777:04o}, uid {info.st_uid}: others could change it;"
                " make it ours or root's, 0600"
            )
        data = os.read(fd, MAX_FILE_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_FILE_BYTES:
        raise CrewEnvError(f"{path}: larger than {MAX_FILE_BYTES} bytes")
    return parse_crew_env(path, data)


def parse_crew_env(path: str, data: bytes) -> dict[str, str]:
    """``NAME=VALUE`` lines, blank lines and ``#`` comments. A value is taken as written (no quotes removed, no
    expansion), without the spaces around it."""
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise CrewEnvError(f"{path}: not UTF-8") from None
    found: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, equals, value = line.partition("=")
        name = name.strip()
        where = f"{path}, line {number}"
        if not equals or not NAME.fullmatch(name):  # the line is not quoted: it may hold a key
            raise CrewEnvError(f"{where}: not NAME=VALUE (a name of letters, digits and _)")
        if name.startswith((SETTINGS_PREFIX, TRACING_PREFIX)) or name in PLACES:
            raise CrewEnvError(f"{where}: {name} is the supervisor's to set")
        if name in found:
            raise CrewEnvError(f"{where}: {name} is set twice")
        if "\0" in value:
            raise CrewEnvError(f"{where}: {name}'s value holds a NUL byte")
        found[name] = value.strip()
    return found


def _named(name: str, allowed: tuple[str, ...]) -> bool:
    return any(name.startswith(pattern[:-1]) if pattern.endswith("*") else name == pattern for pattern in allowed)
