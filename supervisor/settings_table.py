"""The settings table: each AIP_CREWAI_* setting's parser (with what it accepts), default and help. One
source for ``supervisor.config`` (flags, environment, checks), ``serve --help`` and docs/settings.md."""

from __future__ import annotations

import dataclasses
import enum
import os
import re
import urllib.parse
from collections.abc import Callable
from typing import Any, NamedTuple

from protocol import Operation, Warmup
from supervisor.enums import LauncherName

MAX_WORKERS = 1024  # MAX_CONCURRENCY's highest
TRACE_ID = "{trace_id}"  # where TRACE_UI_URL takes a job's trace id
JAEGER_TRACE_URL = "http://localhost:16686/trace/{trace_id}"


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


@_accepting("comma-separated absolute paths")
def _paths(raw: str) -> tuple[str, ...]:
    paths = tuple(part.strip() for part in raw.split(",") if part.strip())
    for path in paths:
        if not os.path.isabs(path):
            raise ValueError(f"{path!r} is not an absolute path")
    return paths


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


@_accepting("comma-separated, any of", tuple(Operation))
def _operations(raw: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(part.strip() for part in raw.split(",") if part.strip()))
    unknown = [name for name in names if name not in set(Operation)]
    if unknown or not names:
        raise ValueError(f"must be a comma-separated subset of {','.join(Operation)}")
    return names


@_accepting("comma-separated crew=n, and *=n for every crew not named; n from 1 to MAX_CONCURRENCY")
def _crew_bounds(raw: str) -> tuple[tuple[str, int], ...]:
    bounds: dict[str, int] = {}
    for part in (part.strip() for part in raw.split(",")):
        if not part:
            continue
        crew, equals, count = (side.strip() for side in part.rpartition("="))  # a crew id may hold "=", not ","
        if not equals or not crew:
            raise ValueError(f"{part!r} is not crew=n (or *=n)")
        if not re.fullmatch(r"[0-9]{1,4}", count) or not 1 <= int(count) <= MAX_WORKERS:
            raise ValueError(f"{part!r}: n must be a whole number from 1 to {MAX_WORKERS}")
        if crew in bounds:
            raise ValueError(f"{crew!r} is named twice")
        bounds[crew] = int(count)
    return tuple(bounds.items())


@_accepting("an http:// or https:// URL holding {trace_id} (empty: none)")
def _trace_url(raw: str) -> str:
    """A URL template: the trace id goes where ``{trace_id}`` is. Printable ASCII only: the CLI prints it, the console
    makes a link of it."""
    template = raw.strip()
    if not template:
        return ""
    parts = urllib.parse.urlsplit(template.replace(TRACE_ID, "0" * 32))
    if TRACE_ID not in template or parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"must be an http:// or https:// URL holding {TRACE_ID} (Jaeger's: {JAEGER_TRACE_URL})")
    if not re.fullmatch(r"[\x21-\x7e]+", template):
        raise ValueError("must be printable ASCII, without spaces (percent-encode the rest)")
    return template


def _or_auto(parser: Parser) -> Parser:
    """Empty means "sized from other settings" (resolved in ``load``)."""

    def parse_or_auto(raw: str) -> int | None:
        return None if not raw.strip() else parser(raw)

    return dataclasses.replace(parser, parse=parse_or_auto)


def _named(names: type[enum.StrEnum]) -> Parser:
    """One of ``names``, as its member."""
    allowed = tuple(name.value for name in names)
    return Parser(lambda raw: names(_choice(*allowed)(raw)), choices=allowed)


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
DAY = 86400
MAX_ARCHIVE_AGE_SECONDS = 3650 * DAY  # the longest retention window, and the oldest a bulk archive may name
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
        "may hold several tokens, one a line, and is read again when it changes (within 5 s): see"
        " [tokens and rotation](operating.md#tokens-and-rotation)",
    ),
    "OBSERVER_TOKEN_FILE": Setting(
        _text,
        "",
        "file of observer tokens, one a line (0600): they read (health, jobs, events, output, metrics, workers)",
        "never start, cancel, archive or ask for stacks (403); read again when it changes; needs the contract's token"
        " too; see [Security](security.md#token-roles)",
    ),
    "OPERATOR_TOKEN_FILE": Setting(
        _text,
        "",
        "file of operator tokens, one a line (0600): they read, cancel, archive and ask for stacks",
        "never start a job (403); read again when it changes; needs the contract's token too; see"
        " [Security](security.md#token-roles)",
    ),
    "ALLOW_UNAUTHENTICATED": Setting(
        _boolean, "false", "serve without a token: a development switch, refused off loopback"
    ),
    "ALLOW_EPHEMERAL": Setting(
        _boolean, "false", "keep the journal in a temporary directory: a development switch, refused off loopback"
    ),
    "ALLOWED_OPERATIONS": Setting(
        _operations, Operation.RUN.value, "the operations clients may start, comma-separated"
    ),
    "MAX_CONCURRENCY": Setting(
        _integer(1, MAX_WORKERS), "4", "workers running at once; more jobs wait, taken in turn between crews"
    ),
    "CREW_MAX_CONCURRENCY": Setting(
        _crew_bounds,
        "",
        "workers one crew's jobs may run at once, as crew=n,... with *=n for the crews not named (empty: none)",
        "a crew's jobs over its bound stay queued while other crews' jobs start; a crew named that the registry"
        " does not serve is refused at start. See [Limits](operating.md#limits) for the order queued jobs start in",
    ),
    "MAX_RETAINED_RUNS": Setting(
        _integer(1, 100000),
        "2000",
        "jobs kept in the journal before admission answers 507; at least MAX_CONCURRENCY",
    ),
    "ARCHIVE_AFTER_SECONDS": Setting(
        _integer(0, MAX_ARCHIVE_AGE_SECONDS),
        str(7 * DAY),
        "an ended job's record is archived this long after it ended (0: never by itself): by a sweep, and by"
        " admission before it answers 507 for a full journal; running jobs never",
        "7 days: a client that repeats a start within it gets the job it started; see"
        " [Retention](operating.md#retention)",
    ),
    "MAX_EVENTS_PER_RUN": Setting(
        _integer(2, 100000),
        "1000",
        "events per job, the last kept for the terminal one; past a quarter of them a job's text chunks are"
        " coalesced, so a long stream's events come less often instead of failing it (docs/api.md)",
    ),
    "MAX_EVENT_BYTES": Setting(
        _integer(1024, 4 * MiB),
        "262144",
        "largest event data (compact JSON); a larger chunk, or an output that does not fit its completed event,"
        " fails the job (reason event_too_large)",
    ),
    "MAX_EFFECTS": Setting(
        _integer(1, 1000000),
        "2000",
        "entries in a job's effect ledger (its tool and LLM calls, and a run's completed tasks), apart from its"
        " events; the worker's next call past it never starts: the job fails (reason effect_limit_exceeded)",
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
        _named(LauncherName),
        LauncherName.FORKSERVER.value,
        "forkserver (warm, milliseconds per job) or spawn (a fresh interpreter, seconds)",
        "the fork server imports CrewAI once and warms it on crews of its own, offline, and on each installed"
        " provider CrewAI routes to natively against a loopback provider of its own, so that no worker repeats"
        " that first-use work; see [Architecture](architecture.md#how-it-works)",
    ),
    "WARMUP": Setting(
        _named(Warmup),
        Warmup.PROVIDERS.value,
        "what the fork server warms before it listens: providers (its offline crews, then each installed provider"
        " over HTTP) or offline (its offline crews alone)",
        "offline starts the fork server sooner (about 2 s less CPU here) for crews that never call a provider over"
        " HTTP, such as a test suite's offline crews; a crew on CrewAI's own `LLM` class then pays its provider's"
        " first use in every job (~0.5 s); see [Architecture](architecture.md#how-it-works)",
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
    "LOG_CREW_TRACEBACKS": Setting(
        _boolean,
        "true",
        "log a crew's exception, its traceback from the worker's stderr (redacted as the job's tails are), as the"
        " reference logs it; false where a provider's or a crew's error text may carry governed content",
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
    "WORKER_MAX_DISK_MB": Setting(
        _integer(0, 1 << 30),
        "1024",
        "what a job may write to its scratch directory and its crew's HOME and storage, and the largest file it"
        " may write anywhere (RLIMIT_FSIZE) (0: off)",
        "its scratch directory counts whole, its crew's places by what they grew since the job started (jobs of"
        " one crew share them, so each is charged all of it), and the files with no name (`O_TMPFILE`, unlinked"
        " while open) its processes hold, each sample; the places walked about once a second, off the loop, and"
        " once more after the worker exits: the job stopped, or its answer refused, failed with"
        " `disk_limit_exceeded`",
    ),
    "CREW_MAX_DISK_MB": Setting(
        _integer(0, 1 << 30),
        "0",
        "what a crew's HOME and CrewAI storage may hold, across all its jobs (0: off)",
        "a running job that takes its crew past it fails with `disk_limit_exceeded`; a start for a crew over it"
        " is refused with 507 until space is freed there. See [Limits](operating.md#limits)",
    ),
    "WORKER_MAX_TOKENS": Setting(
        _integer(0, 1 << 40),
        "0",
        "LLM tokens a job may spend, prompt and completion, as CrewAI counts them (0: off)",
        "counted call by call; once a call crosses it no call starts (one in flight still finishes) and the job"
        " is stopped, failed with `token_limit_exceeded`. A crew's registry entry may ask for less"
        " (`worker.spending.budget`), never more",
    ),
    "WORKER_MAX_LLM_CALLS": Setting(
        _integer(0, 1 << 30),
        "0",
        "LLM calls a job may make (0: off)",
        "a call past it is held back before it starts and the job stopped, failed with"
        " `llm_call_limit_exceeded`. A crew's registry entry may ask for fewer, never more",
    ),
    "WORKER_NICE": Setting(
        _integer(0, 19),
        "10",
        "workers' niceness, so the supervisor stays responsive under load",
        "the fork server keeps answering too; workers stay in the supervisor's session, so it holds under the"
        " kernel's autogroup scheduling",
    ),
    "LIMIT_SAMPLE_MS": Setting(_integer(10, 60000), "250", "how often memory, CPU and processes are sampled"),
    "STRAY_PROCESSES": Setting(
        _choice("keep_answer", "fail"),
        "keep_answer",
        "what a job that answered and left processes running ends with (they are killed either way);"
        " keep_answer: its answer (completed); fail: failed, stray_processes",
        "an MCP stdio server or a code interpreter a crew did not close is such a process; the job's record names"
        " each (`leftovers`: pid, command, how it left), see [Reading a job](api.md#reading-a-job)",
    ),
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
    "TRACE_UI_URL": Setting(
        _trace_url,
        "",
        "a trace UI's page for one trace, {trace_id} where the id goes (Jaeger's: http://localhost:16686/trace/"
        "{trace_id}): a traced job's record gives it as trace_url, the console links to it; empty: none",
        "the traces themselves go where the standard `OTEL_EXPORTER_OTLP_ENDPOINT` says; see [Tracing](tracing.md)",
    ),
    "WORKER_ENV": Setting(
        _names,
        "",
        "the supervisor's environment variables the workers get, comma-separated names (a trailing * matches a"
        " prefix: OPENAI_*); PATH and PYTHONPATH always; empty: all of them; never an AIP_CREWAI_* setting nor"
        " the bearer token",
        "see [What it finds in its environment](security.md#what-it-finds-in-its-environment)",
    ),
    "CREW_ENV_DIR": Setting(
        _text,
        "",
        "a directory of per-crew environment files: <crew_id>.env adds its NAME=VALUE lines to that crew's jobs"
        " only, read at each job's start (empty: none)",
        "the directory and each file must be writable by their owner alone (ours or root's); a bad file fails"
        " the crew's jobs with `crew_env_invalid`, naming the file and the line; see"
        " [A provider key per crew](operating.md#a-provider-key-per-crew)",
    ),
    "WORKER_SANDBOX": Setting(
        _choice("auto", "enforce", "off"),
        "auto",
        "each job in a sandbox of its own (Landlock): it reads all but the state directory, the token file, the"
        " crews' env files and the training directory, writes only its own places, and cannot trace, read or (Linux"
        " 6.12) signal a process outside it;"
        " auto: every layer the kernel has; enforce: refuse to start without every layer; off: none (the seccomp"
        " filter stays)",
        "`/health`, `doctor` and the start-up log name the layers a job gets and any that is missing; see"
        " [A job's sandbox](security.md#a-jobs-sandbox)",
    ),
    "WORKER_WRITABLE": Setting(
        _paths,
        "",
        "directories every job may change too, beside its own places (a shared output directory, say); with"
        " WORKER_SANDBOX=off every job changes all its uid may",
        "a path beneath the state directory, the token's file or `CREW_ENV_DIR` is refused at start; see"
        " [A job's sandbox](security.md#a-jobs-sandbox)",
    ),
    "WORKER_USER": Setting(
        _text,
        "",
        "run the fork server and the workers as this user: a name, a uid (its passwd entry gives the group) or"
        " uid:gid; the supervisor must be root, and a uid or gid of 0 is refused (empty: the supervisor's uid)",
        "see [A separate uid for workers](security.md#a-separate-uid-for-workers)",
    ),
}
