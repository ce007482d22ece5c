"""Following a job the command started (``run``, ``resume``) to its end, and the answers every command prints:
one JSON line with ``--json``, else a view for people. Exit codes: 0 done (a followed job completed), 1 the command
failed (said in one line on stderr), 3 the followed job failed, 4 it was cancelled."""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Callable, Iterator
from typing import Any

import orjson
from rich.console import Console
from rich.text import Text

from supervisor.console import views
from supervisor.console.client import Client, OperatorError, Unsettled, job_path
from supervisor.enums import Status
from supervisor.escaping import ident, json_line, visible

EXIT_ERROR, EXIT_FAILED, EXIT_CANCELLED = 1, 3, 4
EXIT_INTERRUPTED = 130  # Ctrl-C, as shells report SIGINT
OUTCOME_CODES = {Status.COMPLETED: 0, Status.FAILED: EXIT_FAILED, Status.CANCELLED: EXIT_CANCELLED}


def emit_json(value: Any) -> None:
    """JSON escapes C0 controls itself; ``json_line`` escapes C1 ones (and U+2028, U+2029) too."""
    sys.stdout.write(json_line(orjson.dumps(value)).decode() + "\n")
    sys.stdout.flush()


def answer(value: Any, args: argparse.Namespace, out: Console, view: Callable[[Any], Any]) -> int:
    """``value`` as one JSON line with ``--json``, else its view for people."""
    if args.json:
        emit_json(value)
    else:
        out.print(view(value))
    return 0


def start_and_follow(
    client: Client, body: dict[str, Any], key: str, args: argparse.Namespace, out: Console, said: str, path: str
) -> int:
    """Start the job ``body`` names (``path``: the route that starts it, streamed), say it (``said``: what follows
    "started ID"), then follow it to its end and print its answer; ``--detach``: print its id once it is admitted,
    and return."""
    if args.detach:  # the id alone, for a script: ID=$(crew-supervisor run my-crew --detach)
        try:
            client.admit(body, key, path)
        except Unsettled as exc:
            raise unknown_outcome(exc, body["action_id"]) from None
        answer({"action_id": body["action_id"]}, args, out, lambda admitted: views.id_text(admitted["action_id"]))
        return 0

    def accepted() -> None:  # not before: a refused start says why instead (exit 1)
        if not args.json:
            out.print(Text(f"started {ident(body['action_id'])} {said}", "bold"))

    try:
        code = follow(client.start(body, key, args.wait, accepted, path), body["action_id"], args.json, out)
    except KeyboardInterrupt:  # a hang-up never cancels a job: say so, and how to
        shown = ident(body["action_id"])
        print(
            f"crew-supervisor: stopped following; job {shown} goes on"
            f" (crew-supervisor cancel {shlex.quote(shown)} stops it)",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    except Unsettled as exc:
        raise unknown_outcome(exc, body["action_id"]) from None
    if not args.json:
        conclude(client, body["action_id"], code, out)
    return code


def unknown_outcome(exc: Unsettled, action_id: str) -> OperatorError:
    """A start that may have been admitted is never said to have failed without the job's id and how to check it."""
    shown = ident(action_id)
    return OperatorError(
        f"{exc}; job {shown} may be running, its outcome unknown (crew-supervisor show {shlex.quote(shown)} says)"
    )


def conclude(client: Client, action_id: str, code: int, out: Console) -> None:
    """After the terminal line: the answer of a completed job, the end of a failed one's stderr (where a
    crew's own error says what went wrong: a missing key, a refused call)."""
    path = job_path(action_id)
    try:
        if code == 0:
            answer = views.answer_text(client.get(path)["output"] or {})
            # An answer is copied whole: never broken at the terminal's width.
            out.print(Text("answer: ", "bold"), Text(visible(answer, layout=True)), soft_wrap=True)
        elif code == EXIT_FAILED and (stderr := client.get(path + "/output")["stderr"]["text"]).strip():
            out.print(views.stderr_end(stderr), soft_wrap=True)  # as the crew wrote it
    except OperatorError as exc:  # the job's outcome stands, and its exit code with it
        print(f"crew-supervisor: the job ended, but its details could not be read: {visible(exc)}", file=sys.stderr)


def follow(events: Iterator[dict[str, Any]], action_id: str, as_json: bool, out: Console) -> int:
    """Chunks print as they arrive (whole lines, under a spinner); the exit code is the job's outcome."""
    last: dict[str, Any] | None = None
    if as_json:
        for last in events:
            emit_json(last)
        return OUTCOME_CODES.get(last["event"], EXIT_ERROR) if last else EXIT_ERROR
    text = views.ChunkText()
    shown = ident(action_id)
    with out.status(Text(f"{shown}: waiting for the worker")) as status:
        for count, last in enumerate(events, start=1):
            for line in text.feed(last):
                out.print(Text(line))
            status.update(Text(f"{shown}: {visible(last['event'])} · {count} events"))
    for line in text.rest():
        out.print(Text(line))
    if last is None:
        return EXIT_ERROR
    out.print(views.terminal_line(last))
    return OUTCOME_CODES.get(last["event"], EXIT_ERROR)
