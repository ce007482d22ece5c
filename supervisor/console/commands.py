"""Operator commands of ``crew-supervisor``: they talk to a running supervisor over its HTTP API.

Tables for people, ``--json`` for scripts. Exit codes: 0 done (a followed job completed), 1 the
command failed (said in one line on stderr), 3 the followed job failed, 4 it was cancelled.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import textwrap
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console
from rich.live import Live
from rich.text import Text

from protocol import Operation
from supervisor.console import archive, effects, resume, views
from supervisor.console.client import Client, OperatorError, job_path, resolve_target
from supervisor.console.durations import duration, spoken
from supervisor.console.following import (
    EXIT_CANCELLED,
    EXIT_ERROR,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    answer,
    emit_json,
    follow,
    start_and_follow,
)
from supervisor.console.reconnect import DEFAULT_WAIT_SECONDS
from supervisor.enums import LIVE_PHASES, STOPPABLE_PHASES, TERMINAL_EVENTS, Status
from supervisor.escaping import ident, typed_id, visible

ACTION_ID_HELP = "the job's action id, as the CLI prints it (\\u0456 for a character it writes out) or as it is"
EXIT_PIPE_CLOSED = 141  # the reader of its output went away, as shells report SIGPIPE
# The choices as plain text: argparse quotes a choice's repr when it refuses a value.
OPERATIONS = tuple(operation.value for operation in Operation)
# One word per job everywhere (jobs, show, top): where it is while it runs, else how it ended.
PHASES = tuple(phase.value for phase in LIVE_PHASES)
OUTCOMES = tuple(event.value for event in TERMINAL_EVENTS)
STOPPABLE = tuple(phase.value for phase in STOPPABLE_PHASES)


def exit_status(*codes: tuple[int, str]) -> str:
    """A command's --help epilog: its exit codes, one a line (wrapped at 80 columns under its meaning)."""
    lines = (
        textwrap.fill(meaning, 80, initial_indent=f"  {code:<4} ", subsequent_indent=" " * 7) for code, meaning in codes
    )
    return "exit status:\n" + "\n".join(lines)


COULD_NOT = (EXIT_ERROR, "it could not do its work (refused, 401, 404, ...): one line says why")
DONE = ((0, "done"), COULD_NOT)
FOLLOWED = (
    (EXIT_ERROR, "it could not do its work (refused, 401, 404, a link lost for longer than --wait): one line says why"),
    (EXIT_FAILED, "the job failed"),
    (EXIT_CANCELLED, "the job was cancelled"),
    (EXIT_INTERRUPTED, "Ctrl-C: it stopped following (the job goes on)"),
    (EXIT_PIPE_CLOSED, "its output's reader went away (| head): it stopped following (the job goes on)"),
)
RESUMED = ((0, "the new job completed"), *FOLLOWED)
JOBS = """\
List the jobs of a running supervisor, newest first, a page at a time: a
table, or with --json the API's page as one line of JSON. --status, --crew and
--operation filter them; --cursor reads the page after the one that named it."""
SHOW = """\
Show one job of a running supervisor: its record, when it was admitted and
ended and how long it took, and its terminal event."""
EVENTS = """\
Print a job's events. With --follow, stream them live until the terminal one,
and exit with the job's outcome. A lost link (a dropped connection, the
supervisor restarting) is reconnected for up to --wait, resuming after the
last event seen; it says so on stderr."""
CREWS = """\
List what a running supervisor serves: its crews, each with its own LLM budget
per job where its registry entry gives one (under the supervisor's: the lower
applies), and the operations it takes. --json prints them as one line."""
CANCEL = """\
Cancel a job: kill its worker and every process it started, and return once
that is confirmed, with the proof (the pid, the signal). --reason is recorded
in the cancelled event. Without an id, cancel every live job that --crew,
--status and --operation all name (or --all), at once, and print each one's
proof; --dry-run lists them and cancels none."""
OUTPUT = """\
Print what a job's worker wrote to stdout and stderr (a tool's prints, CrewAI's
panels, the traceback of a crew that raised): the last 64 KiB of each, as the
supervisor keeps them, live while the job runs. --stream picks one."""
TOP = """\
The live view of the running jobs' workers (phase, pid, memory, CPU, age,
events), and what each queued job waits for (a slot, or its crew's own:
CREW_MAX_CONCURRENCY), refreshed every --interval seconds until Ctrl-C; --once
prints one view and exits, --json prints one line of JSON per refresh."""
STACK = """\
Print every thread's Python stack of a running job, asked of its worker while
the job goes on: where its agents, tools and provider calls are. For a job
stopped by its timeout, a cancel or a broken limit, the stacks taken just
before its kill."""
RUN = """\
Start a job of a crew and follow it to its end: "started" once the supervisor
took it (a refused start prints the status and the reason instead, exit 1),
its output as it streams, then its answer, or for a failed job the last lines
of its stderr (where the crew's own error says why). --input is the job's
input: inline JSON, @FILE or FILE, or - for stdin. A lost link is reconnected
for up to --wait, as for events --follow. Ctrl-C stops following, never the
job. --detach prints the job's id once it is admitted and returns (0), leaving
it to run."""


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", help="supervisor URL (env AIP_CREWAI_URL, default http://127.0.0.1:8090)")
    common.add_argument("--token", help="bearer token (env AIP_CREWAI_BEARER_TOKEN)")
    common.add_argument("--token-file", help="file holding the bearer token (env AIP_CREWAI_BEARER_TOKEN_FILE)")
    common.add_argument("--json", action="store_true", help="machine-readable output")
    command = functools.partial(_command, commands, common)
    _add_reads(command)
    _add_actions(command)


def _command(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    common: argparse.ArgumentParser,
    name: str,
    handler: Any,
    help: str,
    description: str,
    codes: tuple[tuple[int, str], ...],
) -> argparse.ArgumentParser:
    parser = commands.add_parser(
        name,
        parents=[common],
        help=help,
        description=description,
        epilog=exit_status(*codes),
        formatter_class=argparse.RawDescriptionHelpFormatter,  # the texts above are laid out by hand
    )
    parser.set_defaults(handler=handler)
    return parser


def _add_reads(command: Callable[..., argparse.ArgumentParser]) -> None:
    """The commands that only look: jobs, crews, show, events, output, effects, stack, top."""
    jobs = command("jobs", list_jobs, "list jobs, newest first", JOBS, DONE)
    jobs.add_argument(
        "--status",
        choices=PHASES + OUTCOMES,
        help="only jobs in this state: where one is while it runs, or how it ended (as the table shows it)",
    )
    jobs.add_argument("--crew", type=typed_id, help="only this crew id (as the CLI prints it, or as it is)")
    jobs.add_argument("--operation", choices=OPERATIONS, help="only this operation")
    jobs.add_argument("--limit", type=int, default=50, help="jobs per page (1-500)")
    jobs.add_argument("--cursor", help="the next_cursor of a previous page")
    command("crews", crews, "the crews a running supervisor serves", CREWS, DONE)
    show_parser = command("show", show, "one job's record and terminal event", SHOW, DONE)
    show_parser.add_argument("action_id", type=typed_id, help=ACTION_ID_HELP)
    events = command(
        "events",
        events_of,
        "a job's events; --follow streams them until the terminal one",
        EVENTS,
        ((0, "done; with --follow, the job completed"), *FOLLOWED),
    )
    events.add_argument("action_id", type=typed_id, help=ACTION_ID_HELP)
    events.add_argument("--follow", "-f", action="store_true", help="stream live, resuming after a dropped link")
    add_wait(events)
    output_parser = command("output", output, "what a job's worker wrote to stdout and stderr", OUTPUT, DONE)
    output_parser.add_argument("action_id", type=typed_id, help=ACTION_ID_HELP)
    output_parser.add_argument("--stream", choices=("stdout", "stderr"), help="only this one (default: both)")
    effects_parser = command("effects", effects_of, "a job's tool and LLM calls, its ledger", effects.DESCRIPTION, DONE)
    effects_parser.add_argument("action_id", type=typed_id, help=ACTION_ID_HELP)
    stack_parser = command("stack", stack, "every thread's Python stack of a running job", STACK, DONE)
    stack_parser.add_argument("action_id", type=typed_id, help=ACTION_ID_HELP)
    top_parser = command(
        "top",
        top,
        "the live worker view, refreshing",
        TOP,
        ((0, "done (--once)"), COULD_NOT, (EXIT_INTERRUPTED, "Ctrl-C")),
    )
    top_parser.add_argument("--once", action="store_true", help="print one frame and exit")
    top_parser.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")


def _add_actions(command: Callable[..., argparse.ArgumentParser]) -> None:
    """The commands that act: cancel, archive, resume, run."""
    cancel_parser = command("cancel", cancel, "kill a job's worker and wait until it is confirmed gone", CANCEL, DONE)
    every = f"{ACTION_ID_HELP}; without it, the options below name the jobs"
    cancel_parser.add_argument("action_id", nargs="?", type=typed_id, help=every)
    cancel_parser.add_argument("--reason", help="recorded in the cancelled event")
    cancel_parser.add_argument("--crew", type=typed_id, help="without an id: every live job of this crew")
    cancel_parser.add_argument("--status", choices=STOPPABLE, help="without an id: every live job where this says")
    cancel_parser.add_argument(
        "--operation", choices=OPERATIONS, help="without an id: every live job of this operation"
    )
    cancel_parser.add_argument("--all", action="store_true", help="without an id: every live job")
    cancel_parser.add_argument("--dry-run", action="store_true", help="list the jobs it would cancel; cancel none")
    archive_parser = command(
        "archive", archive_jobs, "archive the jobs that ended more than a duration ago", archive.DESCRIPTION, DONE
    )
    archive.add_arguments(archive_parser)
    resume_parser = command(
        "resume", resume.resume, "continue a stopped run from its last completed task", resume.DESCRIPTION, RESUMED
    )
    resume.add_arguments(resume_parser)
    add_wait(resume_parser)
    run_parser = command("run", run, "start a job and follow it to its end", RUN, ((0, "the job completed"), *FOLLOWED))
    run_parser.add_argument("crew_id", help="the crew to run: its id in the supervisor's registry")
    run_parser.add_argument(
        "--input",
        default="{}",
        help="the job's input: inline JSON ('{\"topic\": \"x\"}'), @FILE or FILE, or '-' for stdin (default: {})",
    )
    run_parser.add_argument(
        "--operation", choices=OPERATIONS, default=Operation.RUN.value, help="the operation (default: run)"
    )
    run_parser.add_argument("--action-id", help="default: a new cli-<uuid>")
    run_parser.add_argument("--timeout-ms", type=int, help="the job's timeout (server default if absent)")
    run_parser.add_argument("--idempotency-key", help="default: a new random key")
    run_parser.add_argument("--detach", action="store_true", help="print the job's id once it is admitted; return")
    add_wait(run_parser)


def add_wait(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--wait",
        type=duration,
        default=DEFAULT_WAIT_SECONDS,
        metavar="DURATION",
        help=f"how long to reconnect after a lost link, as a restart takes (90s, 2m, 1h; default"
        f" {spoken(DEFAULT_WAIT_SECONDS)}), saying so on stderr; then give up (exit 1)",
    )


def _console() -> Console:
    """Rich's, on stdout. Piped (to a file, grep, a test), a line is never wrapped: rich would break it at 80
    columns, in the middle of an id or a proof a script reads whole."""
    out = Console(highlight=False)
    out.soft_wrap = not out.is_terminal
    return out


def run_command(args: argparse.Namespace) -> int:
    """Every failure ends as one line on stderr and a non-zero code: an operator never sees a traceback."""
    try:
        with Client(resolve_target(args.url, args.token, args.token_file)) as client:
            return int(args.handler(client, args, _console()))
    except OperatorError as exc:
        print(f"crew-supervisor: {visible(exc)}", file=sys.stderr)  # it may quote the server
        return EXIT_ERROR
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `| grep -m 1` got what it wanted: stop quietly, as cat and head do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit's own flush must not fail too
        return EXIT_PIPE_CLOSED


def list_jobs(client: Client, args: argparse.Namespace, out: Console) -> int:
    # The API keeps the contract's status (`running` while a job has no outcome) and says where it is as `phase`.
    where = {"phase": args.status} if args.status in PHASES else {"status": args.status}
    params = {**where, "crew_id": args.crew, "operation": args.operation}
    page = client.get("/jobs", {**params, "limit": args.limit, "cursor": args.cursor})
    if args.json:
        emit_json(page)
    else:
        out.print(views.jobs_table(page["jobs"], out.width))
        if page["next_cursor"]:
            out.print(Text(f"more: --cursor {visible(page['next_cursor'])}", style="dim"))
    return 0


def show(client: Client, args: argparse.Namespace, out: Console) -> int:
    """The job; for a failed one, also the end of its stderr, where its worker wrote the crew's exception whole (the
    event keeps the reference's generic words)."""
    job = client.get(job_path(args.action_id))
    code = answer(job, args, out, views.job_panel)
    if not args.json and job["status"] == Status.FAILED:
        try:
            stderr = client.get(job_path(args.action_id, "output"))["stderr"]["text"]
        except OperatorError:  # no output kept for it (an imported reference journal's job)
            stderr = ""
        if stderr.strip():
            out.print(views.stderr_end(stderr), soft_wrap=True)
    return code


def crews(client: Client, args: argparse.Namespace, out: Console) -> int:
    health = client.get("/health")
    served = {name: health[name] for name in ("status", "crews", "operations", "llm_budget")}
    served["max_concurrency"] = health.get("crew_max_concurrency", {})  # absent from a server older than the bound
    return answer(served, args, out, views.crews_view)


def events_of(client: Client, args: argparse.Namespace, out: Console) -> int:
    if args.follow:
        return follow(client.follow(args.action_id, args.wait), args.action_id, args.json, out)
    cursor, events = 0, []
    while True:  # a JSON slice holds up to 1000 events; read on until caught up
        page = client.get(job_path(args.action_id, "events"), {"cursor": cursor})
        events += page["events"]
        if page["next_cursor"] == cursor:
            break
        cursor = page["next_cursor"]
    for event in events:
        emit_json(event) if args.json else out.print(views.event_line(event))
    return 0


def cancel(client: Client, args: argparse.Namespace, out: Console) -> int:
    """The cancel route wants the crew id as a fence: it is read from the job first."""
    named = {"crew_id": args.crew, "phase": args.status, "operation": args.operation, "all": args.all or None}
    if args.action_id is None:
        if not any(named.values()):
            raise OperatorError("name the job (its id) or the jobs: --crew, --status, --operation, or --all")
        body = {**named, "reason": args.reason, "dry_run": args.dry_run}
        return answer(
            client.post("/jobs/cancel", {k: v for k, v in body.items() if v is not None}), args, out, views.cancelled
        )
    if any(named.values()) or args.dry_run:
        raise OperatorError("give a job's id or filters (--crew, --status, --operation, --all), not both")
    job = client.get(job_path(args.action_id))
    body = {"crew_id": job["crew_id"], "action_id": args.action_id, "reason": args.reason}
    return answer(client.post(job_path(args.action_id, "cancel"), body), args, out, views.cancel_line)


def archive_jobs(client: Client, args: argparse.Namespace, out: Console) -> int:
    return answer(archive.archive(client, args), args, out, archive.view)


def output(client: Client, args: argparse.Namespace, out: Console) -> int:
    captured = client.get(job_path(args.action_id, "output"))
    if args.json:
        emit_json(captured)
        return 0
    for name in (args.stream,) if args.stream else ("stdout", "stderr"):
        text, total = captured[name]["text"], captured[name]["total_bytes"]
        kept = len(text.encode(errors="surrogatepass"))
        more = f", the last {kept} kept" if kept < total else ""
        out.print(Text(f"{name}: {total} bytes written{more}{' so far' if captured['live'] else ''}", "bold"))
        if text:
            out.print(Text(visible(text.rstrip(), layout=True)), soft_wrap=True)  # as the worker wrote it
    return 0


def effects_of(client: Client, args: argparse.Namespace, out: Console) -> int:
    return answer(client.get(job_path(args.action_id, "effects")), args, out, effects.view)


def stack(client: Client, args: argparse.Namespace, out: Console) -> int:
    return answer(client.get(job_path(args.action_id, "stack")), args, out, views.stacks_view)


def top(client: Client, args: argparse.Namespace, out: Console) -> int:
    if args.once:
        snapshot = client.get("/workers")
        shown = views.top_view(snapshot["workers"], time.time(), out.width)
        emit_json(snapshot) if args.json else out.print(shown)
        return 0
    if args.json:  # one JSON document per refresh, for a script to read line by line
        while True:
            emit_json(client.get("/workers"))
            time.sleep(args.interval)
    with Live(views.workers_table([], time.time()), console=out, auto_refresh=False) as live:
        while True:
            live.update(views.top_view(client.get("/workers")["workers"], time.time(), out.width), refresh=True)
            time.sleep(args.interval)


def run(client: Client, args: argparse.Namespace, out: Console) -> int:
    body: dict[str, Any] = {
        "crew_id": args.crew_id,
        "action_id": args.action_id or f"cli-{uuid.uuid4()}",
        "operation": args.operation,
        "input": read_input(args.input),
    }
    if args.timeout_ms is not None:
        body["timeout_ms"] = args.timeout_ms
    key = args.idempotency_key or uuid.uuid4().hex
    said = f"({ident(args.crew_id)}, {args.operation})"
    return start_and_follow(client, body, key, args, out, said, "/jobs/stream")


def read_input(source: str) -> dict[str, Any]:
    """``--input``: a JSON object inline (it starts with ``{``), from ``@FILE`` or ``FILE``, or from stdin (``-``)."""
    inline = source.lstrip().startswith("{") or (source != "-" and not source.startswith("@") and _json(source))
    path = source[1:] if source.startswith("@") else source
    where = "--input" if inline else "stdin" if source == "-" else f"the input file {path}"
    try:
        raw = (
            source.encode(errors="surrogateescape")
            if inline
            else sys.stdin.buffer.read()
            if source == "-"
            else Path(path).read_bytes()
        )
        value = orjson.loads(raw)
    except OSError as exc:
        raise OperatorError(f"cannot read {where}: {exc.strerror}") from None
    except orjson.JSONDecodeError as exc:
        raise OperatorError(f"{where} is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise OperatorError(f"{where} must hold a JSON object")
    return value


def _json(text: str) -> bool:
    """Whether ``text`` is JSON (a bare path, as ``--input`` also takes, is not)."""
    try:
        orjson.loads(text.encode(errors="surrogateescape"))
    except orjson.JSONDecodeError:
        return False
    return True
