"""Settings: the reference's AIP_CREWAI_* names, loaded from flags and the environment by the table in
settings_table.py, and checked (loopback-only switches, the token files, WORKER_USER, TRAINING_DIR, CREW_ENV_DIR)."""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import os
import pwd
import shlex
import stat
from collections.abc import Mapping
from typing import Any

from protocol import SETTINGS_PREFIX, Operation, Warmup
from supervisor.enums import LauncherName, Role
from supervisor.settings_table import SPEC
from supervisor.tokens import FILE_SETTINGS, TokenFileError, in_two_roles, read_tokens, shared, token_problem

PREFIX = SETTINGS_PREFIX  # the reference's settings; the worker takes its own under it too
DEMO_REGISTRY = "worker.demo:registry"
DEFAULT_PREFORK = 2  # idle pre-forked workers, at most MAX_CONCURRENCY


class ConfigError(Exception):
    """One line naming the setting and what is wrong with it; ``fix``, where one command fixes it, says
    which (``crew-supervisor doctor`` prints it)."""

    def __init__(self, message: str, fix: str = "") -> None:
        super().__init__(message)
        self.fix = fix


@dataclasses.dataclass(frozen=True)
class Settings:
    registry: str
    host: str
    port: int
    state_file: str
    bearer_token: str
    bearer_token_file: str
    allow_unauthenticated: bool
    allow_ephemeral: bool
    allowed_operations: tuple[str, ...]
    max_concurrency: int
    crew_max_concurrency: tuple[tuple[str, int], ...]  # (crew, bound), "*" for the crews not named
    max_retained_runs: int
    archive_after_seconds: int
    max_events_per_run: int
    max_event_bytes: int
    max_effects: int
    max_state_bytes: int
    min_free_disk_mb: int
    stream_checkpoint_events: int
    training_dir: str
    launcher: LauncherName
    warmup: Warmup
    prefork: int | None  # None until ``load`` sizes it
    log_format: str
    log_crew_tracebacks: bool
    stop_grace_ms: int
    drain_seconds: float
    heartbeat_seconds: float
    header_timeout_seconds: float
    max_header_bytes: int
    body_timeout_seconds: float
    send_timeout_seconds: float
    max_connections: int
    worker_max_memory_mb: int
    worker_max_cpu_seconds: int
    worker_max_processes: int
    worker_max_open_files: int
    worker_max_address_space_mb: int
    worker_max_output_bytes: int
    worker_max_disk_mb: int
    crew_max_disk_mb: int
    worker_max_tokens: int
    worker_max_llm_calls: int
    worker_nice: int
    limit_sample_ms: int
    stray_processes: str
    cgroups: str
    console: bool
    trace_ui_url: str
    worker_env: tuple[str, ...]
    crew_env_dir: str
    worker_sandbox: str
    worker_writable: tuple[str, ...]
    worker_user: str
    observer_token_file: str
    operator_token_file: str
    token: str | None = None  # the contract's first token at start-up: BEARER_TOKEN or BEARER_TOKEN_FILE's
    tokens: dict[Role, tuple[str, ...]] = dataclasses.field(default_factory=dict)  # each role's, at start-up
    worker_ids: tuple[int, int] | None = None  # (uid, gid) resolved from WORKER_USER; None: the supervisor's

    @property
    def loopback(self) -> bool:
        return is_loopback(self.host)

    @property
    def every_token(self) -> frozenset[str]:
        """Every role's tokens at start-up: what a job's environment must not hold, and its output never shows."""
        return frozenset(token for held in self.tokens.values() for token in held)

    @property
    def token_files(self) -> dict[Role, str]:
        """The token files set, by the role their tokens give."""
        paths = {Role.CONTRACT: self.bearer_token_file, Role.OPERATOR: self.operator_token_file}
        return {role: path for role, path in {**paths, Role.OBSERVER: self.observer_token_file}.items() if path}


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# Settings that must not come as a flag, and what to use instead: a command line is readable by every local
# user (/proc/<pid>/cmdline).
NOT_FLAGS = {"BEARER_TOKEN": f"--bearer-token-file FILE (0600) or {PREFIX}BEARER_TOKEN"}
NOT_A_FLAG_BECAUSE = "every local user could read it in the command line"


def flag(name: str) -> str:
    return "--" + name.lower().replace("_", "-")


def add_flags(parser: argparse.ArgumentParser) -> None:
    for name, setting in SPEC.items():
        if name in NOT_FLAGS:  # kept, so that using it is refused with the way to do it instead
            help_text = f"refused ({NOT_A_FLAG_BECAUSE}): use {NOT_FLAGS[name]}"
            parser.add_argument(flag(name), dest=name, default=None, help=help_text)
            continue
        help_text = f"{setting.help} [{PREFIX}{name}, default {setting.default!r}]"
        parser.add_argument(flag(name), dest=name, default=None, help=help_text)


def load(flags: Mapping[str, str | None], environ: Mapping[str, str] = os.environ) -> Settings:
    """Flags win over the environment, which wins over defaults. Raises ConfigError."""
    for name, instead in NOT_FLAGS.items():
        if flags.get(name) is not None:
            raise ConfigError(
                f"{flag(name)} would put the token where every local user can read it: use {instead}", instead
            )
    values: dict[str, Any] = {}
    for name, setting in SPEC.items():
        raw = flags.get(name)
        if raw is None:
            raw = environ.get(PREFIX + name, setting.default)
        try:
            values[name.lower()] = setting.parse(raw)
        except ValueError as exc:
            raise ConfigError(f"{PREFIX}{name}={raw!r}: {exc}") from None
    settings = Settings(**values)
    if settings.prefork is None:
        settings = dataclasses.replace(settings, prefork=min(settings.max_concurrency, DEFAULT_PREFORK))
    settings = dataclasses.replace(settings, worker_ids=_worker_ids(settings.worker_user))
    tokens = _check(settings)
    return dataclasses.replace(settings, tokens=tokens, token=tokens.get(Role.CONTRACT, (None,))[0])


def _check(s: Settings) -> dict[Role, tuple[str, ...]]:
    if not s.registry:
        raise ConfigError(f"{PREFIX}REGISTRY is required (module:attr), or pass --demo for the offline demo crews")
    if s.max_retained_runs < s.max_concurrency:
        raise ConfigError(f"{PREFIX}MAX_RETAINED_RUNS must be at least {PREFIX}MAX_CONCURRENCY ({s.max_concurrency})")
    if over := [f"{crew}={bound}" for crew, bound in s.crew_max_concurrency if bound > s.max_concurrency]:
        raise ConfigError(
            f"{PREFIX}CREW_MAX_CONCURRENCY: {', '.join(over)} over {PREFIX}MAX_CONCURRENCY ({s.max_concurrency})"
        )
    if not s.state_file and not (s.allow_ephemeral and s.loopback):
        raise ConfigError(f"{PREFIX}STATE_FILE is required unless {PREFIX}ALLOW_EPHEMERAL=true on a loopback host")
    if s.allow_ephemeral and not s.loopback:
        raise ConfigError(f"{PREFIX}ALLOW_EPHEMERAL is only allowed on a loopback host, not {s.host!r}")
    if s.allow_unauthenticated and not s.loopback:
        raise ConfigError(f"{PREFIX}ALLOW_UNAUTHENTICATED is only allowed on a loopback host, not {s.host!r}")
    if Operation.TRAIN in s.allowed_operations:
        _check_training_dir(s.training_dir, s.worker_ids)
    if s.crew_env_dir:
        _check_crew_env_dir(s.crew_env_dir)
    tokens = _tokens(s)
    if not tokens and not s.allow_unauthenticated:
        raise ConfigError(
            f"{PREFIX}BEARER_TOKEN or {PREFIX}BEARER_TOKEN_FILE is required "
            f"(or {PREFIX}ALLOW_UNAUTHENTICATED=true on a loopback host)"
        )
    return tokens


def _tokens(s: Settings) -> dict[Role, tuple[str, ...]]:
    """Each role's tokens, as start-up reads them: BEARER_TOKEN or the files (``supervisor/tokens.py``)."""
    if s.bearer_token and s.bearer_token_file:
        raise ConfigError(f"set only one of {PREFIX}BEARER_TOKEN and {PREFIX}BEARER_TOKEN_FILE")
    if s.bearer_token and (problem := token_problem(s.bearer_token)):
        raise ConfigError(f"{PREFIX}BEARER_TOKEN {problem}")
    found: dict[Role, tuple[str, ...]] = {Role.CONTRACT: (s.bearer_token,)} if s.bearer_token else {}
    for role, path in s.token_files.items():
        try:
            found[role] = read_tokens(FILE_SETTINGS[role], path)
        except TokenFileError as exc:
            raise ConfigError(str(exc), exc.fix) from None
    if found and Role.CONTRACT not in found:
        scoped = " and ".join(f"{PREFIX}{FILE_SETTINGS[role]}" for role in found)
        raise ConfigError(f"{scoped} need the contract's token too ({PREFIX}BEARER_TOKEN_FILE)")
    if pair := shared(found):
        raise ConfigError(in_two_roles(pair))
    return found


def _worker_ids(raw: str) -> tuple[int, int] | None:
    """WORKER_USER as (uid, gid): a name or a uid takes the user's primary group from the passwd
    database; ``uid:gid`` names both (a uid without a passwd entry, as containers often have)."""
    if not raw:
        return None
    name = f"{PREFIX}WORKER_USER={raw!r}"
    if os.geteuid() != 0:  # only root may change a process's uid; a worker would fail at its first step
        raise ConfigError(f"{name}: the supervisor must run as root to run workers as another user")
    user, colon, group = raw.partition(":")
    try:
        if colon:
            ids = (int(user), int(group))
        elif user.isdigit():
            ids = (int(user), pwd.getpwuid(int(user)).pw_gid)
        else:
            entry = pwd.getpwnam(user)
            ids = (entry.pw_uid, entry.pw_gid)
    except ValueError:
        raise ConfigError(f"{name}: must be a user name, a uid or uid:gid") from None
    except KeyError:
        raise ConfigError(f"{name}: no such user (give uid:gid for one without a passwd entry)") from None
    if not all(0 < value < 2**32 - 1 for value in ids):  # 0 is root's uid or group; 2**32-1 means "unchanged"
        raise ConfigError(f"{name}: uid and gid must be neither root's (0) nor out of range")
    return ids


def _check_training_dir(path: str, worker_ids: tuple[int, int] | None) -> None:
    name = f"{PREFIX}TRAINING_DIR"
    if not path:
        raise ConfigError(f"{name} is required when train is an allowed operation")
    quoted = shlex.quote(path)
    try:
        info = os.lstat(path)
    except OSError as exc:
        raise ConfigError(f"{name}={path!r}: {exc.strerror}", f"mkdir -m 700 {quoted}") from None
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise ConfigError(f"{name}={path!r}: must be a directory, not a symlink", f"point {name} at a directory")
    if info.st_mode & 0o077:
        raise ConfigError(f"{name}={path!r}: mode {info.st_mode & 0o777:04o}; use 0700", f"chmod 700 {quoted}")
    # 0700, so only its owner can write there: the workers write the artifacts.
    if worker_ids is not None and info.st_uid != worker_ids[0]:
        raise ConfigError(
            f"{name}={path!r}: owned by uid {info.st_uid}; the workers' user ({PREFIX}WORKER_USER,"
            f" uid {worker_ids[0]}) must own it",
            f"chown {worker_ids[0]}:{worker_ids[1]} {quoted}",
        )


def _check_crew_env_dir(path: str) -> None:
    """A directory only we (or root) can change: whoever can add a crew's file there sets that crew's environment
    (PYTHONPATH, LD_PRELOAD), so runs code in its workers. Each file is checked as it is read, at a job's start."""
    name = f"{PREFIX}CREW_ENV_DIR={path!r}"
    try:
        info = os.stat(path)  # a link to a directory is fine: a Kubernetes volume is one
    except OSError as exc:
        raise ConfigError(f"{name}: {exc.strerror}", f"mkdir -m 700 {shlex.quote(path)}") from None
    if not stat.S_ISDIR(info.st_mode):
        raise ConfigError(f"{name}: not a directory", f"point {PREFIX}CREW_ENV_DIR at a directory")
    if info.st_mode & 0o022 or info.st_uid not in (0, os.geteuid()):
        raise ConfigError(
            f"{name}: mode {info.st_mode & 0o777:04o}, uid {info.st_uid}: others could add a crew's file",
            f"chmod 700 {shlex.quote(path)}",
        )
