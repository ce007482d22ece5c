"""Settings: the reference's AIP_CREWAI_* names, defaults and ranges, each also a flag."""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import os
import pwd
import re
import shlex
import stat
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

PREFIX = "AIP_CREWAI_"
OPERATIONS = ("run", "batch_run", "replay", "train", "test", "knowledge_query", "memory_reset")
DEMO_REGISTRY = "worker.demo:registry"
MAX_TOKEN_BYTES = 16384
DEFAULT_PREFORK = 2  # idle pre-forked workers, at most MAX_CONCURRENCY


class ConfigError(Exception):
    """One line naming the setting and what is wrong with it; ``fix``, where one command fixes it, says
    which (``crew-supervisor doctor`` prints it)."""

    def __init__(self, message: str, fix: str = "") -> None:
        super().__init__(message)
        self.fix = fix


@dataclasses.dataclass(frozen=True)
class Parser:
    """A setting's parser, with what it accepts for the settings page: a number within ``bounds`` (both
    included), or what ``accepts`` says, followed by the ``choices`` (neither: any text)."""

    parse: Callable[[str], Any]
    accepts: str = ""
    choices: tuple[str, ...] = ()
    bounds: tuple[float, float] | None = None

    def __call__(self, raw: str) -> Any:
        return self.parse(raw)


def _accepting(accepts: str = "", choices: tuple[str, ...] = ()) -> Callable[[Callable[[str], Any]], Parser]:
    """A decorator: the parser function, with what it accepts."""
    return lambda parse: Parser(parse, accepts, choices)


@_accepting(choices=("true", "false"))
def _boolean(raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("must be true or false")


def _integer(low: int, high: int) -> Parser:
    def parse(raw: str) -> int:
        value = int(raw.strip())
        if not low <= value <= high:
            raise ValueError(f"must be from {low} to {high}")
        return value

    return Parser(parse, bounds=(low, high))


def _number(low: float, high: float) -> Parser:
    def parse(raw: str) -> float:
        value = float(raw.strip())
        if not low <= value <= high:
            raise ValueError(f"must be from {low:g} to {high:g}")
        return value

    return Parser(parse, bounds=(low, high))


@_accepting("comma-separated environment variable names; a trailing * matches a prefix")
def _names(raw: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in raw.split(",") if name.strip())
    for name in names:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*\*?", name):
            raise ValueError(f"{name!r} is not an environment variable's name (a trailing * matches a prefix)")
    return names


@_accepting("comma-separated, any of", OPERATIONS)
def _operations(raw: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(part.strip() for part in raw.split(",") if part.strip()))
    unknown = [name for name in names if name not in OPERATIONS]
    if unknown or not names:
        raise ValueError(f"must be a comma-separated subset of {','.join(OPERATIONS)}")
    return names


def _or_auto(parser: Parser) -> Parser:
    """Empty means "sized from other settings" (resolved in ``load``)."""

    def parse_or_auto(raw: str) -> int | None:
        return None if not raw.strip() else parser(raw)

    return dataclasses.replace(parser, parse=parse_or_auto)


def _choice(*allowed: str) -> Parser:
    def parse(raw: str) -> str:
        if raw.strip() not in allowed:
            raise ValueError(f"must be one of {', '.join(allowed)}")
        return raw.strip()

    return Parser(parse, choices=allowed)


_text = Parser(str.strip)


class Setting(NamedTuple):
    """One setting: its parser, its default as its variable would say it, and its help, plain text for
    ``serve --help`` and the settings page; ``doc``, Markdown, adds what only the page says."""

    parse: Parser
    default: str
    help: str
    doc: str = ""


MiB = 1024 * 1024
# name (after the prefix) -> its setting; docs/settings.md is made from this table (scripts/docs.py settings)
SPEC: dict[str, Setting] = {
    "REGISTRY": Setting(
        _text,
        "",
        "crew registry as module:attr (required; --demo picks the offline demo crews)",
        "a callable attribute is called for the mapping; its values map each crew id to a zero-argument factory"
        " (a function, or any callable that takes no argument), so each job gets a fresh crew; an instance is refused",
    ),
    "HOST": Setting(_text, "127.0.0.1", "address to bind", "the reference defaults to `0.0.0.0`; this one to loopback"),
    "PORT": Setting(_integer(0, 65535), "8090", "port to bind"),
    "STATE_FILE": Setting(_text, "", "journal path (SQLite); required unless ALLOW_EPHEMERAL on loopback"),
    "BEARER_TOKEN": Setting(
        _text,
        "",
        "the bearer token clients must send",
        "not a flag (see above); this or `BEARER_TOKEN_FILE` is required unless `ALLOW_UNAUTHENTICATED` on"
        " loopback; see [Security](security.md)",
    ),
    "BEARER_TOKEN_FILE": Setting(
        _text,
        "",
        "file holding the bearer token (regular, 0600 or stricter); set it or BEARER_TOKEN, not both",
    ),
    "ALLOW_UNAUTHENTICATED": Setting(
        _boolean, "false", "serve without a token: a development switch, refused off loopback"
    ),
    "ALLOW_EPHEMERAL": Setting(
        _boolean, "false", "keep the journal in a temporary directory: a development switch, refused off loopback"
    ),
    "ALLOWED_OPERATIONS": Setting(_operations, "run", "the operations clients may start, comma-separated"),
    "MAX_CONCURRENCY": Setting(_integer(1, 1024), "4", "workers running at once; more jobs wait in order"),
    "MAX_RETAINED_RUNS": Setting(
        _integer(1, 100000),
        "2000",
        "jobs kept in the journal before admission answers 507; at least MAX_CONCURRENCY",
    ),
    "MAX_EVENTS_PER_RUN": Setting(_integer(2, 100000), "1000", "events per job, the last kept for the terminal one"),
    "MAX_EVENT_BYTES": Setting(
        _integer(1024, 4 * MiB),
        "262144",
        "largest event data (compact JSON); a larger chunk, or an output that does not fit its completed event,"
        " fails the job (reason event_too_large)",
    ),
    "MAX_STATE_BYTES": Setting(
        _integer(MiB, 4096 * MiB), str(256 * MiB), "largest journal before admission answers 507"
    ),
    "MIN_FREE_DISK_MB": Setting(
        _integer(0, 1 << 20),
        "64",
        "free space kept on the journal's filesystem for the jobs already running: below it admission answers 507",
        "see [Reliability](reliability.md)",
    ),
    "STREAM_CHECKPOINT_EVENTS": Setting(
        _integer(1, 10000), "128", "chunk events committed together: what a crash may lose at most"
    ),
    "TRAINING_DIR": Setting(
        _text,
        "",
        "where train writes artifacts (required when train is allowed)",
        "mode 0700, not a symlink, owned by `WORKER_USER` when that is set, and this supervisor's alone: the"
        " hidden `.partial` files in it are removed at start",
    ),
    "LAUNCHER": Setting(
        _choice("forkserver", "spawn"),
        "forkserver",
        "forkserver (warm, milliseconds per job) or spawn (a fresh interpreter, seconds)",
        "the fork server imports CrewAI once and warms it on crews of its own, offline, and on each installed"
        " provider CrewAI routes to natively against a loopback provider of its own, so that no worker repeats"
        " that first-use work; see [Architecture](architecture.md#how-it-works)",
    ),
    "PREFORK": Setting(
        _or_auto(_integer(0, 64)),
        "",
        "idle workers forked ahead of demand by the fork server (default min(MAX_CONCURRENCY, 2); 0: off)",
        "each still serves one job only, and gets its job's environment and directory with its start",
    ),
    "LOG_FORMAT": Setting(
        _choice("json", "text"),
        "json",
        "json (one object per line: time, level, event, job fields, durations) or text (for people)",
    ),
    "STOP_GRACE_MS": Setting(_integer(0, 60000), "0", "SIGTERM grace before SIGKILL when stopping a worker"),
    "DRAIN_SECONDS": Setting(
        _number(0, 3600),
        "20",
        "after SIGTERM, how long running jobs may still finish before they are killed (0: at once); keep it"
        " about 10 s below the orchestrator's grace period",
        "see [Stopping](operating.md#stopping-metrics-logs-containers)",
    ),
    "HEARTBEAT_SECONDS": Setting(_number(0.05, 300), "15", "SSE comment sent while a stream is idle"),
    "HEADER_TIMEOUT_SECONDS": Setting(
        _number(0.1, 300),
        "10",
        "a connection that has not sent a request's headers this long after connecting (or after its last"
        " response) is closed",
    ),
    "MAX_HEADER_BYTES": Setting(
        _integer(1024, MiB),
        "32768",
        "a request's line and headers together (one header line: 8 KiB, at most 100 headers); beyond, 431 and"
        " the connection closed",
        "see [Bounds and timeouts](security.md#bounds-and-timeouts)",
    ),
    "BODY_TIMEOUT_SECONDS": Setting(
        _number(0.1, 3600),
        "30",
        "a request's body must have arrived this long after its headers, else 408 and the connection closed",
    ),
    "SEND_TIMEOUT_SECONDS": Setting(
        _number(0.1, 3600),
        "30",
        "a client that reads nothing of an answer waiting to be sent (a stream it stopped reading) for this"
        " long is disconnected",
    ),
    "MAX_CONNECTIONS": Setting(
        _integer(1, 1 << 20),
        "4096",
        "connections kept at once (lowered to fit the open-files limit); beyond it the oldest one still"
        " waiting for its headers is closed, or the newcomer answered 503",
        "the lowering is logged at start; see [Security](security.md)",
    ),
    "WORKER_MAX_MEMORY_MB": Setting(
        _integer(0, 1 << 20),
        "2048",
        "memory of a job's processes: its memory cgroup's charge where there is one, else their PSS sampled (0: off)",
        "see [Limits](operating.md#limits)",
    ),
    "WORKER_MAX_CPU_SECONDS": Setting(
        _integer(0, 1 << 20), "3600", "CPU seconds a job's processes may use, counted from its start (0: off)"
    ),
    "WORKER_MAX_PROCESSES": Setting(
        _integer(0, 100000),
        "256",
        "processes and threads of one job, the worker's included, as a pids cgroup counts them (0: off)",
    ),
    "WORKER_MAX_OPEN_FILES": Setting(
        _integer(0, 1 << 20), "1024", "open files per worker process (RLIMIT_NOFILE; 0: off)"
    ),
    "WORKER_MAX_ADDRESS_SPACE_MB": Setting(
        _integer(0, 1 << 30),
        "0",
        "address space per worker process (RLIMIT_AS; 0: off)",
        "a CrewAI worker maps 0.5–1 GiB before it allocates anything",
    ),
    "WORKER_MAX_OUTPUT_BYTES": Setting(
        _integer(0, 1 << 40), str(64 * MiB), "stdout+stderr bytes a job may write (0: off)"
    ),
    "WORKER_NICE": Setting(
        _integer(0, 19),
        "10",
        "workers' niceness, so the supervisor stays responsive under load",
        "the fork server keeps answering too; workers stay in the supervisor's session, so it holds under the"
        " kernel's autogroup scheduling",
    ),
    "LIMIT_SAMPLE_MS": Setting(_integer(10, 60000), "250", "how often memory, CPU and processes are sampled"),
    "CGROUPS": Setting(
        _choice("auto", "off"),
        "auto",
        "auto: a pids and a memory cgroup per job where the kernel lets us write them (the kernel enforces"
        " WORKER_MAX_PROCESSES and WORKER_MAX_MEMORY_MB); off: sampling only",
    ),
    "CONSOLE": Setting(
        _boolean,
        "false",
        "serve the operator console (a browser page) under /console; the page is public, every call it makes needs"
        " the bearer token",
        "see [The console](operating.md#the-console-in-a-browser)",
    ),
    "WORKER_ENV": Setting(
        _names,
        "",
        "the supervisor's environment variables the workers get, comma-separated names (a trailing * matches a"
        " prefix: OPENAI_*); PATH and PYTHONPATH always; empty: all of them but the bearer token's",
        "see [What is trusted](security.md#what-is-trusted-crews)",
    ),
    "WORKER_USER": Setting(
        _text,
        "",
        "run the fork server and the workers as this user: a name, a uid (its passwd entry gives the group) or"
        " uid:gid; the supervisor must be root, and a uid or gid of 0 is refused (empty: the supervisor's uid)",
        "see [A separate uid for workers](security.md#a-separate-uid-for-workers)",
    ),
}


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
    max_retained_runs: int
    max_events_per_run: int
    max_event_bytes: int
    max_state_bytes: int
    min_free_disk_mb: int
    stream_checkpoint_events: int
    training_dir: str
    launcher: str
    prefork: int | None  # None until ``load`` sizes it
    log_format: str
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
    worker_nice: int
    limit_sample_ms: int
    cgroups: str
    console: bool
    worker_env: tuple[str, ...]
    worker_user: str
    token: str | None = None  # resolved from BEARER_TOKEN or BEARER_TOKEN_FILE
    worker_ids: tuple[int, int] | None = None  # (uid, gid) resolved from WORKER_USER; None: the supervisor's

    @property
    def loopback(self) -> bool:
        return is_loopback(self.host)


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
    return dataclasses.replace(settings, token=_check(settings))


def _check(s: Settings) -> str | None:
    if not s.registry:
        raise ConfigError(f"{PREFIX}REGISTRY is required (module:attr), or pass --demo for the offline demo crews")
    if s.max_retained_runs < s.max_concurrency:
        raise ConfigError(f"{PREFIX}MAX_RETAINED_RUNS must be at least {PREFIX}MAX_CONCURRENCY ({s.max_concurrency})")
    if not s.state_file and not (s.allow_ephemeral and s.loopback):
        raise ConfigError(f"{PREFIX}STATE_FILE is required unless {PREFIX}ALLOW_EPHEMERAL=true on a loopback host")
    if s.allow_ephemeral and not s.loopback:
        raise ConfigError(f"{PREFIX}ALLOW_EPHEMERAL is only allowed on a loopback host, not {s.host!r}")
    if s.allow_unauthenticated and not s.loopback:
        raise ConfigError(f"{PREFIX}ALLOW_UNAUTHENTICATED is only allowed on a loopback host, not {s.host!r}")
    if "train" in s.allowed_operations:
        _check_training_dir(s.training_dir, s.worker_ids)
    token = _token(s)
    if token is None and not s.allow_unauthenticated:
        raise ConfigError(
            f"{PREFIX}BEARER_TOKEN or {PREFIX}BEARER_TOKEN_FILE is required "
            f"(or {PREFIX}ALLOW_UNAUTHENTICATED=true on a loopback host)"
        )
    return token


def _token(s: Settings) -> str | None:
    if s.bearer_token and s.bearer_token_file:
        raise ConfigError(f"set only one of {PREFIX}BEARER_TOKEN and {PREFIX}BEARER_TOKEN_FILE")
    raw = s.bearer_token
    if s.bearer_token_file:
        raw = _read_token_file(s.bearer_token_file)
    if not raw:
        return None
    if len(raw.encode()) > MAX_TOKEN_BYTES or any(ord(c) < 0x21 or ord(c) == 0x7F for c in raw):
        raise ConfigError(f"{PREFIX}BEARER_TOKEN must be at most {MAX_TOKEN_BYTES} bytes of visible characters")
    return raw


def _read_token_file(path: str) -> str:
    name = f"{PREFIX}BEARER_TOKEN_FILE={path!r}"
    regular = f"point {PREFIX}BEARER_TOKEN_FILE at a regular file (not a link), mode 0600"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(f"{name}: cannot open without following links: {exc.strerror}", regular) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(f"{name}: not a regular file", regular)
        if info.st_mode & 0o077:
            raise ConfigError(
                f"{name}: mode {info.st_mode & 0o777:04o} lets others read it; use 0600",
                f"chmod 600 {shlex.quote(path)}",
            )
        if info.st_size > MAX_TOKEN_BYTES + 2:
            raise ConfigError(f"{name}: larger than {MAX_TOKEN_BYTES} bytes")
        data = os.read(fd, MAX_TOKEN_BYTES + 2)
    finally:
        os.close(fd)
    try:
        return data.decode().strip()
    except UnicodeDecodeError:
        raise ConfigError(f"{name}: not UTF-8") from None


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
