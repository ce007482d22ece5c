"""``crew-supervisor resume ID``: a new job that continues an interrupted run from its last completed task, through
``POST /jobs/{id}/resume``, followed and printed as ``run`` prints a job (``following.py``)."""

from __future__ import annotations

import argparse
import uuid

from rich.console import Console

from supervisor.console.client import Client, OperatorError, job_path
from supervisor.console.following import start_and_follow
from supervisor.escaping import ident, typed_id

DESCRIPTION = """\
Resume a run that failed, was cancelled, timed out or was cut off by a restart:
start a new job of its crew and input that skips the tasks it completed (their
outputs are handed on; their tools are not called again) and runs the rest.
A task that was in flight when the old job stopped runs again in full: read
its effects first (crew-supervisor effects ID) and reconcile each uncertain
one. The new job's id is --as, or by default ID-r1 (ID-r2, ... if that one is
taken); the old job's record then names it, and its own names the old. It
prints and exits as run does; --detach prints the new id once it is admitted.
A completed job, a running one, another operation's, or one already resumed
is refused with the reason. Never automatic: only this, or the API, resumes."""
MAX_SUFFIX = 100  # ID-r1 .. ID-r100: past that, name the new job with --as


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action_id", type=typed_id, help="the job to resume, as the CLI prints its id or as it is")
    parser.add_argument(
        "--as", dest="new_id", type=typed_id, help="the new job's action id (default: ID-r1, or -r2, ... if taken)"
    )
    parser.add_argument("--timeout-ms", type=int, help="the new job's timeout (server default if absent)")
    parser.add_argument("--idempotency-key", help="default: a new random key")
    parser.add_argument("--detach", action="store_true", help="print the new job's id once it is admitted; return")


def resume(client: Client, args: argparse.Namespace, out: Console) -> int:
    old = client.get(job_path(args.action_id))  # a 404 says so before any id is chosen
    body: dict[str, object] = {"action_id": args.new_id or fresh_id(client, args.action_id)}
    if args.timeout_ms is not None:
        body["timeout_ms"] = args.timeout_ms
    key = args.idempotency_key or uuid.uuid4().hex
    said = f"({ident(old['crew_id'])}, run), resuming {ident(args.action_id)}"
    return start_and_follow(client, body, key, args, out, said, job_path(args.action_id, "resume"))


def fresh_id(client: Client, action_id: str) -> str:
    """``ID-r1``, or the first of ``ID-r2`` .. that no job holds yet."""
    for suffix in range(1, MAX_SUFFIX + 1):
        if not client.found(job_path(candidate := f"{action_id}-r{suffix}")):
            return candidate
    raise OperatorError(f"{ident(action_id)}-r1 to -r{MAX_SUFFIX} are all taken: name the new job with --as")
